"""The browser page for real: Debian's headless Chromium, its fake microphone playing a dev-set recording,
driven by Selenium against a real `asr_spec serve`. The run saves a screenshot of the page."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import DEV, system_tool
from server_proc import serve

from asr_spec.audio import load_audio

pytestmark = pytest.mark.slow  # a real server, browser, subprocess or real weights

SCREENSHOT = Path(__file__).parents[1] / "artifacts" / "browser-page.png"


def chromium() -> tuple[str, str]:
    install = "sudo apt-get install chromium chromium-driver (.ci/run installs them)"
    return system_tool("chromium", "chromium-browser", install=install), system_tool("chromedriver", install=install)


def speaking_browser(tmp_path):
    """Headless Chromium whose fake microphone plays the JFK clip, then 4 s of quiet (Chromium loops the file)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = chromium()
    speech = load_audio(DEV / "jfk-inaugural-1961-ask-not.wav")
    wav = tmp_path / "mic.wav"
    sf.write(wav, np.concatenate([speech, np.zeros(4 * 16000, np.float32)]), 16000, subtype="PCM_16")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--use-fake-ui-for-media-stream",
                "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={wav}",
                "--autoplay-policy=no-user-gesture-required", "--window-size=1000,700"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver_path), options=options)


def page_against_offline(url: str, text: str) -> float:
    """WER (%) of the page's text against the server's own offline transcription of the clip its microphone played
    (the same model and type, through the upload API), over the clip's words (the fake microphone loops the file,
    so the page may hear the clip's start again)."""
    from openai import OpenAI

    from asr_spec.evaluation.metrics import normalize, wer

    client = OpenAI(base_url=url.replace("ws://", "http://") + "/v1", api_key="unused", timeout=120)
    with open(DEV / "jfk-inaugural-1961-ask-not.wav", "rb") as f:
        offline = client.audio.transcriptions.create(model="whisper-1", file=f).text
    words = normalize(offline).split()
    return wer([" ".join(words)], [" ".join(normalize(text).split()[:len(words)])])


def stop_and_check(driver, summary: str) -> None:
    """Stop: the page finishes (its summary says ``summary``) with no error shown and the button back at Start."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.find_element(By.ID, "toggle").click()
    try:
        WebDriverWait(driver, 60).until(lambda d: summary in d.find_element(By.ID, "summary").text)
    except TimeoutException:
        shown = {k: driver.find_element(By.ID, k).text for k in ("state", "error", "summary", "latency", "final")}
        raise AssertionError(f"no summary saying {summary!r} 60 s after Stop; the page shows {shown}") from None
    assert driver.find_element(By.ID, "error").text == ""
    assert driver.find_element(By.ID, "toggle").text == "Start"


def test_the_page_streams_the_microphone_and_shows_the_words(tmp_path):
    """The microphone's level moves, partials show apart from the finals, the latency of the last final is shown,
    and the transcript downloads as text and as SubRip with the finals' times."""
    import re

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with serve() as url:
        driver = speaking_browser(tmp_path)
        try:
            driver.get(url.replace("ws://", "http://") + "/")
            assert driver.find_element(By.ID, "state").text == "disconnected"
            driver.find_element(By.ID, "toggle").click()
            WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "state").text == "listening")
            seen_partial, levels = [], []
            WebDriverWait(driver, 120, poll_frequency=0.2).until(
                lambda d: seen_partial.append(d.find_element(By.ID, "partial").text) or
                levels.append(float(d.find_element(By.ID, "level").get_attribute("value"))) or
                "what you can do for your country" in d.find_element(By.ID, "final").text.lower())  # the clip's end
            assert any(seen_partial), "no partial text was shown while speaking"
            assert max(levels) > 0.05, f"the level meter did not move: {max(levels)}"
            latency = driver.find_element(By.ID, "latency").text
            assert re.fullmatch(r"last final: \d+\.\d s after its audio", latency), latency
            SCREENSHOT.parent.mkdir(exist_ok=True)
            driver.save_screenshot(str(SCREENSHOT))
            stop_and_check(driver, "tokens")
            text = driver.execute_script("return transcriptAs('txt')")
            srt = driver.execute_script("return transcriptAs('srt')")
            assert "what your country can do for you" in text.lower()
            heard = page_against_offline(url, text)
            print(f"the page heard {text!r}: {heard:.1f} % WER from the offline text")
            assert heard <= 10.0, f"the page's text is {heard:.1f} % WER from the offline text of the same clip: {text!r}"
            assert re.match(r"1\n00:00:\d\d,\d{3} --> 00:00:\d\d,\d{3}\n\S", srt), srt
            assert "country" in srt.lower()
            for link in ("download-txt", "download-srt"):
                driver.find_element(By.ID, link).click()
                assert driver.find_element(By.ID, link).get_attribute("href").startswith("blob:")
        finally:
            driver.quit()
    assert SCREENSHOT.stat().st_size > 10_000


def test_the_page_speaks_the_openai_realtime_protocol_too(tmp_path):
    """The same page with "OpenAI Realtime" chosen: 24 kHz audio as input_audio_buffer.append events, the key as the
    browser subprotocol, transcription deltas shown as they come; Stop commits and closes once transcribed."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.ui import WebDriverWait

    key = "browser-Key_3"
    with serve(env={"ASR_SPEC_API_KEY": key}) as url:
        driver = speaking_browser(tmp_path)
        try:
            driver.get(url.replace("ws://", "http://") + f"/?api_key={key}")
            Select(driver.find_element(By.ID, "protocol")).select_by_value("realtime")
            driver.find_element(By.ID, "toggle").click()
            WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "state").text == "listening")
            WebDriverWait(driver, 120, poll_frequency=0.2).until(
                lambda d: "what you can do for your country" in d.find_element(By.ID, "final").text.lower()
                or d.find_element(By.ID, "error").text)
            assert driver.find_element(By.ID, "error").text == "", driver.find_element(By.ID, "error").text
            stop_and_check(driver, "OpenAI Realtime")
            assert driver.find_element(By.ID, "state").text == "disconnected"
        finally:
            driver.quit()


def test_the_page_says_when_the_key_is_wrong(tmp_path):
    """A server with a key and a page opened without it: the person is told to open it with ?api_key=."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with serve(env={"ASR_SPEC_API_KEY": "right-key"}) as url:
        driver = speaking_browser(tmp_path)
        try:
            driver.get(url.replace("ws://", "http://") + "/?api_key=wrong-key")
            driver.find_element(By.ID, "toggle").click()
            WebDriverWait(driver, 30).until(lambda d: "API key" in d.find_element(By.ID, "error").text)
            assert "refused this API key" in driver.find_element(By.ID, "error").text
        finally:
            driver.quit()


def test_the_page_shows_a_connection_failure(tmp_path):
    """With the server gone, the person sees the state and an error, not a silent page."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser, driver_path = chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--use-fake-ui-for-media-stream",
                "--use-fake-device-for-media-stream"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        with serve() as url:
            driver.get(url.replace("ws://", "http://") + "/")
        driver.find_element(By.ID, "toggle").click()  # the server is gone now
        WebDriverWait(driver, 30).until(lambda d: "disconnected" in d.find_element(By.ID, "state").text
                                        and d.find_element(By.ID, "error").text)
        assert "failed" in driver.find_element(By.ID, "state").get_attribute("class")
    finally:
        driver.quit()
