"""Command-line options generated from a frozen dataclass, as serve's are from ServeSettings: each field is one option
(``output_dir`` is ``--output-dir``), its type says how argparse reads it (``type_kwargs``), ``option()`` gives its
default, help and any other argparse keyword, and a field whose type is a dataclass adds that dataclass's options in
its place. ``from_args`` builds the object back from the parsed namespace. No imports from asr_spec: any layer may
describe its options this way."""
from __future__ import annotations

import argparse
from dataclasses import MISSING, field, fields, is_dataclass, make_dataclass
from types import NoneType, UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


def option(default: Any = MISSING, help: str | None = None, *, flag: str | None = None, positional: bool = False,
           **argparse_kw: Any) -> Any:
    """A field that is one option: ``flag`` (default: ``--`` and the field's name with dashes; ``positional``: the
    field's name), ``default`` (none: the option is required), ``help`` and argparse's other keywords."""
    return field(default=default, metadata={"flag": flag, "positional": positional, "help": help, "kw": argparse_kw})


def type_kwargs(annotation: Any) -> dict[str, Any]:
    """argparse's keywords for a value of this type: a flag for bool, a conversion for int and float, the choices of a
    Literal; ``X | None`` as X; anything else (str, tuple[str, ...]) as it comes."""
    if get_origin(annotation) in (Union, UnionType):
        annotation = next(a for a in get_args(annotation) if a is not NoneType)
    if annotation is bool:
        return {"action": "store_true"}
    if annotation in (int, float):
        return {"type": annotation}
    if get_origin(annotation) is Literal:
        return {"choices": get_args(annotation)}
    return {}


def add_options(parser: argparse.ArgumentParser, settings: type, environment: str = "") -> None:
    """One option per field of ``settings``, in the fields' order. A pydantic settings class (``model_fields``, as
    serve's) is read the same way, each option left out of the namespace unless given (the field's variable,
    ``environment`` + its name in capitals, and its default apply) and its help naming both; a field's
    ``json_schema_extra["argparse"]`` holds any other argparse keyword."""
    if hasattr(settings, "model_fields"):
        for name, f in settings.model_fields.items():
            shown = "" if f.default in (None, "", 0, False) else f"; default {f.default}"
            kw = type_kwargs(f.annotation) | {"default": argparse.SUPPRESS,
                                              "help": f"{f.description} [{environment}{name.upper()}{shown}]"}
            if f.annotation is bool and f.default:
                kw["action"] = argparse.BooleanOptionalAction
            kw |= (f.json_schema_extra or {}).get("argparse", {})
            parser.add_argument("--" + name.replace("_", "-"), dest=name, **kw)
        return
    hints = get_type_hints(settings)
    for f in fields(settings):
        if is_dataclass(hints[f.name]):
            add_options(parser, hints[f.name])
            continue
        kw = type_kwargs(hints[f.name]) | {"help": f.metadata["help"]} | f.metadata["kw"]
        if f.default is not MISSING:
            kw["default"] = f.default
        if f.metadata["positional"]:
            parser.add_argument(f.name, **kw)
        else:
            flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
            parser.add_argument(flag, dest=f.name, required=f.default is MISSING, **kw)


def from_args(settings: type[T], args: argparse.Namespace) -> T:
    """The ``settings`` object of the parsed options (lists as tuples)."""
    hints = get_type_hints(settings)
    values = {}
    for f in fields(settings):
        if is_dataclass(hints[f.name]):
            values[f.name] = from_args(hints[f.name], args)
        else:
            value = getattr(args, f.name)
            values[f.name] = tuple(value) if isinstance(value, list) else value
    return settings(**values)


def variant(settings: type[T], name: str, doc: str, module: str, defaults: dict[str, Any] | None = None,
            flags: dict[str, str] | None = None, helps: dict[str, str] | None = None,
            only: tuple[str, ...] | None = None) -> type:
    """``settings`` with another default, flag or help for some of its options, each option's type and the rest of
    its declaration kept: one command's defaults of options every command shares (``mic``'s compute type). With
    ``only``: a dataclass of those options alone (not a subclass: no methods). ``module``: the module that names the
    class ``name`` (``__name__`` there), so that its objects pickle."""
    defaults, flags, helps = defaults or {}, flags or {}, helps or {}
    names = {f.name for f in fields(settings)}
    unknown = (set(defaults) | set(flags) | set(helps) | set(only or ())) - names
    if unknown:
        raise TypeError(f"{settings.__name__} has no options {sorted(unknown)}")
    hints = get_type_hints(settings)
    specs = []
    for f in fields(settings):
        if only is not None and f.name not in only:
            continue
        if only is not None or f.name in defaults or f.name in flags or f.name in helps:
            meta = dict(f.metadata) | {"flag": flags.get(f.name, f.metadata["flag"]),
                                       "help": helps.get(f.name, f.metadata["help"])}
            specs.append((f.name, hints[f.name], field(default=defaults.get(f.name, f.default), metadata=meta)))
    bases = () if only is not None else (settings,)
    cls = make_dataclass(name, specs, bases=bases, frozen=True, kw_only=True)
    cls.__doc__, cls.__module__ = doc, module
    return cls
