"""Whisper's tokenizer and special token ids: one place for both."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

_LANGUAGE = re.compile(r"^<\|([a-z]{2,3}|haw|yue)\|>$")
N_TIMESTAMPS = 1501  # <|0.00|> ... <|30.00|>
MULTILINGUAL_VOCAB = 51865
# Whisper's languages: code -> English name (openai/whisper's tokenizer.py; the names OpenAI's API reports)
LANGUAGES = {
    "en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ru": "russian", "ko": "korean", "fr":
    "french", "ja": "japanese", "pt": "portuguese", "tr": "turkish", "pl": "polish", "ca": "catalan", "nl": "dutch",
    "ar": "arabic", "sv": "swedish", "it": "italian", "id": "indonesian", "hi": "hindi", "fi": "finnish", "vi":
    "vietnamese", "he": "hebrew", "uk": "ukrainian", "el": "greek", "ms": "malay", "cs": "czech", "ro": "romanian",
    "da": "danish", "hu": "hungarian", "ta": "tamil", "no": "norwegian", "th": "thai", "ur": "urdu", "hr": "croatian",
    "bg": "bulgarian", "lt": "lithuanian", "la": "latin", "mi": "maori", "ml": "malayalam", "cy": "welsh", "sk":
    "slovak", "te": "telugu", "fa": "persian", "lv": "latvian", "bn": "bengali", "sr": "serbian", "az": "azerbaijani",
    "sl": "slovenian", "kn": "kannada", "et": "estonian", "mk": "macedonian", "br": "breton", "eu": "basque", "is":
    "icelandic", "hy": "armenian", "ne": "nepali", "mn": "mongolian", "bs": "bosnian", "kk": "kazakh", "sq":
    "albanian", "sw": "swahili", "gl": "galician", "mr": "marathi", "pa": "punjabi", "si": "sinhala", "km": "khmer",
    "sn": "shona", "yo": "yoruba", "so": "somali", "af": "afrikaans", "oc": "occitan", "ka": "georgian", "be":
    "belarusian", "tg": "tajik", "sd": "sindhi", "gu": "gujarati", "am": "amharic", "yi": "yiddish", "lo": "lao",
    "uz": "uzbek", "fo": "faroese", "ht": "haitian creole", "ps": "pashto", "tk": "turkmen", "nn": "nynorsk", "mt":
    "maltese", "sa": "sanskrit", "lb": "luxembourgish", "my": "myanmar", "bo": "tibetan", "tl": "tagalog", "mg":
    "malagasy", "as": "assamese", "tt": "tatar", "haw": "hawaiian", "ln": "lingala", "ha": "hausa", "ba": "bashkir",
    "jw": "javanese", "su": "sundanese", "yue": "cantonese"
}


@dataclass(frozen=True)
class WhisperVocab:
    """Special token ids and suppression lists of one Whisper vocabulary."""

    size: int
    sot: int
    eot: int
    sot_prev: int
    no_speech: int
    no_timestamps: int
    transcribe: int
    translate: int
    languages: dict[str, int] = field(default_factory=dict)
    suppress: tuple[int, ...] = ()
    suppress_begin: tuple[int, ...] = ()
    max_initial_timestamp_index: int | None = 50

    @property
    def timestamp_begin(self) -> int:
        return self.no_timestamps + 1

    @property
    def multilingual(self) -> bool:
        return len(self.languages) > 1

    def sot_sequence(self, language: str | None, task: str = "transcribe") -> list[int]:
        seq = [self.sot]
        if self.multilingual:
            if language is None:
                raise ValueError("a multilingual model needs a language (or language detection)")
            if language not in self.languages:
                raise ValueError(f"unknown language {language!r}; known: {', '.join(sorted(self.languages))}")
            seq.append(self.languages[language])
            seq.append(self.translate if task == "translate" else self.transcribe)
        return seq


def add_timestamp_tokens(tokenizer_json: dict) -> dict:
    """Whisper tokenizers shipped without the 1501 timestamp tokens get them right after
    <|notimestamps|>, so the tokenizer size equals the model's vocabulary."""
    added = tokenizer_json["added_tokens"]
    contents = {t["content"]: t["id"] for t in added}
    if "<|0.00|>" in contents:
        return tokenizer_json
    base = contents["<|notimestamps|>"] + 1
    for i in range(N_TIMESTAMPS):
        added.append({"id": base + i, "content": f"<|{i * 0.02:.2f}|>", "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    return tokenizer_json


class WhisperTokenizer:
    """Text <-> token ids, plus the special ids (``.vocab``)."""

    def __init__(self, tokenizer: Tokenizer, vocab: WhisperVocab):
        self.tokenizer = tokenizer
        self.vocab = vocab

    @classmethod
    def from_dir(cls, path: Path, generation_config: dict, vocab_size: int) -> "WhisperTokenizer":
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        if tokenizer.token_to_id("<|0.00|>") is None:  # shipped without timestamp tokens: add them
            data = add_timestamp_tokens(json.loads((path / "tokenizer.json").read_text()))
            tokenizer = Tokenizer.from_str(json.dumps(data))
        return cls(tokenizer, vocab_from(tokenizer, generation_config, vocab_size))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Text of the ordinary tokens in ``ids`` (special and timestamp tokens are dropped)."""
        return self.tokenizer.decode([i for i in ids if i < self.vocab.eot], skip_special_tokens=False)

    def id_to_token(self, i: int) -> str | None:
        return self.tokenizer.id_to_token(i)



def vocab_from(tokenizer: Tokenizer, generation_config: dict, vocab_size: int) -> WhisperVocab:
    ids = tokenizer.get_vocab(with_added_tokens=True)

    def need(*names: str) -> int:
        for n in names:
            if n in ids:
                return ids[n]
        raise ValueError(f"tokenizer lacks {names[0]}")

    sot = need("<|startoftranscript|>")
    translate = need("<|translate|>")
    # English-only models (vocabulary 51864) carry the language tokens too, but never read them (Whisper: a model is
    # multilingual when its vocabulary has 51865 tokens or more)
    languages = {m.group(1): i for t, i in ids.items() if (m := _LANGUAGE.match(t)) and sot < i < translate} \
        if vocab_size >= MULTILINGUAL_VOCAB else {}
    return WhisperVocab(
        size=vocab_size,
        sot=sot,
        eot=need("<|endoftext|>"),
        sot_prev=need("<|startofprev|>"),
        no_speech=need("<|nospeech|>", "<|nocaptions|>"),
        no_timestamps=need("<|notimestamps|>"),
        transcribe=need("<|transcribe|>"),
        translate=translate,
        languages=languages,
        suppress=tuple(generation_config.get("suppress_tokens") or ()),
        suppress_begin=tuple(generation_config.get("begin_suppress_tokens") or ()),
        max_initial_timestamp_index=generation_config.get("max_initial_timestamp_index", 50),
    )


def generation_config_for(vocab: WhisperVocab, alignment_heads: list | None = None) -> dict:
    """A transformers-compatible generation_config.json for a vocabulary (used for converted models)."""
    return {
        "decoder_start_token_id": vocab.sot,
        "bos_token_id": vocab.eot,
        "eos_token_id": vocab.eot,
        "pad_token_id": vocab.eot,
        "no_timestamps_token_id": vocab.no_timestamps,
        "prev_sot_token_id": vocab.sot_prev,
        "is_multilingual": vocab.multilingual,
        "lang_to_id": {f"<|{k}|>": v for k, v in vocab.languages.items()},
        "task_to_id": {"transcribe": vocab.transcribe, "translate": vocab.translate},
        "suppress_tokens": list(vocab.suppress),
        "begin_suppress_tokens": list(vocab.suppress_begin),
        "max_initial_timestamp_index": vocab.max_initial_timestamp_index,
        "max_length": 448,
        **({"alignment_heads": alignment_heads} if alignment_heads else {}),
    }
