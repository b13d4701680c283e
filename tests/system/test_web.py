"""The browser client (web/) in real headless Chromium against a real `talkgate serve` process.

Chromium is Debian's (scripts/setup.sh --test installs it; TALKGATE_CHROMIUM names another), driven
by Playwright without a browser download. The page exposes its figures as window.talkgateStats
(window.talkgate.snapshot() for a plain copy); every figure asserted here is measured in the page.
TALKGATE_UPDATE_SCREENSHOT=1 copies the mid-utterance screenshot to docs/web.png.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from tests.serverproc import TalkgateServer

CHROMIUM = Path(os.environ.get("TALKGATE_CHROMIUM", "/usr/bin/chromium"))
# The background-networking flags keep Chromium from reaching out (refused on a closed network);
# the media flags give AudioContext without a gesture and a fake microphone without a prompt.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--autoplay-policy=no-user-gesture-required", "--use-fake-ui-for-media-stream",
         "--use-fake-device-for-media-stream"]
MAX_TEXT = 400          # the server's --max-text-chars here, so one error case is a long text
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "web.png"
SHORT = "Hello there, this is a test of streaming speech."
LONG = ("This sentence is long enough that the speech is still being generated when the person "
        "interrupts it, which is exactly the moment a barge-in has to silence the player and cancel "
        "the utterance on the server, without a trailing word of stale audio reaching the speaker.")
# The tiny model's random weights sample the end of speech at a random frame, sometimes before playback
# gets going: the tests that interrupt LONG give it a fixed length (32 s) so that it is still speaking.
LONG_FRAMES = 400


class Client:
    """One page of the web client, with what it logged."""

    def __init__(self, page):
        self.page = page
        self.problems: list[str] = []
        page.on("console", lambda m: self.problems.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.problems.append(f"uncaught: {e}"))

    def open(self, url: str) -> "Client":
        self.page.goto(url + "/")
        self.wait("talkgateStats.state === 'open'")
        return self

    def wait(self, condition: str, timeout_s: float = 30.0) -> None:
        self.page.wait_for_function(f"() => window.talkgateStats && ({condition})", timeout=timeout_s * 1000)

    def snap(self) -> dict:
        return self.page.evaluate("talkgate.snapshot()")

    def last(self) -> dict:
        return self.snap()["utterances"][-1]

    def speak(self, text: str, fmt: str = "opus/48000", mode: str = "whole", frames: int | None = None) -> None:
        self.page.fill("#text", text)
        self.page.fill("#frames", "" if frames is None else str(frames))
        self.page.select_option("#format", fmt)
        self.page.check(f"input[name=mode][value={mode}]")
        self.page.click("#speak")

    def wait_playing(self, ms: float = 300) -> None:
        self.wait(f"talkgateStats.playing && talkgateStats.playedMs > {ms}")


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    with TalkgateServer(tiny_checkpoint, "--max-text-chars", str(MAX_TEXT)) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: run scripts/setup.sh --test (it installs Debian's chromium) "
                    "or point TALKGATE_CHROMIUM at one")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def client(browser, server):
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    c = Client(context.new_page()).open(server.url)
    yield c
    context.close()


def test_page_shows_model_and_speaks_opus(client, tmp_path):
    page = client.page
    assert page.is_visible("#untrained")
    assert "noise, not speech" in page.text_content("#untrained")
    s = client.snap()
    assert s["model"]["untrained"] is True
    langs = page.eval_on_selector_all("#language option", "os => os.map(o => o.value)")
    assert langs == s["model"]["languages"] and "auto" in langs
    assert page.eval_on_selector_all("#voices option", "os => os.map(o => o.value)") == s["model"]["voices"]
    client.wait("talkgateStats.rttMs !== null", 5)          # the keepalive ping was answered

    client.speak(SHORT, "opus/48000")
    client.wait_playing(200)
    shot = tmp_path / "web.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("TALKGATE_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, SCREENSHOT)

    client.wait("talkgateStats.utterances.at(-1)?.outcome.startsWith('done')")
    u, s = client.last(), client.snap()
    assert u["format"] == {"encoding": "opus", "sample_rate": 48000}
    # every Opus packet (20 ms) the server sent was decoded by WebCodecs into 960 samples at 48 kHz
    assert u["frames"] == round(u["serverAudioMs"] / 20) > 0
    assert s["decodedSamples"] == u["frames"] * 960
    assert u["receivedMs"] == pytest.approx(u["serverAudioMs"], abs=1)
    # TTFA: the page's clock (first text sent -> first frame here) includes the server's
    assert 0 < u["ttfaServerMs"] <= u["ttfaClientMs"] + 1 < 10_000
    assert page.text_content("#s-ttfa-client").endswith("ms")
    assert s["playedMs"] > 200 and s["errors"] == []
    assert client.problems == []


def test_llm_style_stream_of_pcm(client):
    page = client.page
    page.fill("#wps", "25")
    page.fill("#first-delay", "250")
    t_click = page.evaluate("performance.now()")
    client.speak(SHORT, "pcm_s16le/24000", mode="stream")
    client.wait("talkgateStats.utterances.at(-1)?.outcome.startsWith('done')")
    u, s = client.last(), client.snap()
    assert u["mode"] == "stream" and u["format"] == {"encoding": "pcm_s16le", "sample_rate": 24000}
    assert u["tFirstText"] - t_click >= 240            # the first-token delay was honoured
    assert s["decodedSamples"] == pytest.approx(u["serverAudioMs"] * 24, abs=1)
    assert u["ttfaClientMs"] > 0 and u["ttfaServerMs"] > 0
    # the 24 kHz stream was played through the 48 kHz context (resampled in the page)
    client.wait("talkgateStats.playedMs > 300")
    assert client.problems == []


def test_text_slower_than_speech_underruns_and_reprimes(client):
    """Words at 1/s make audio in bursts with gaps: the player counts each dry spell as an underrun
    and waits for the jitter target again, instead of stuttering sample by sample."""
    page = client.page
    page.fill("#wps", "1")
    page.fill("#first-delay", "0")
    client.speak("one two three four five", "pcm_s16le/24000", mode="stream")
    client.wait("talkgateStats.utterances.at(-1)?.outcome.startsWith('done')", 30)
    assert client.snap()["underruns"] >= 1
    client.wait("document.getElementById('s-underruns').textContent === String(talkgateStats.underruns)", 2)
    assert client.problems == []


def _assert_cancelled_quietly(client, reason: str) -> None:
    """Playback went silent within 100 ms of the cancel, the server confirmed it, no audio followed."""
    client.wait("talkgateStats.cancelToSilenceMs !== null", 5)
    client.wait("talkgateStats.utterances.at(-1)?.audioMsSent !== null", 5)   # context.cancelled arrived
    u, s = client.last(), client.snap()
    assert u["outcome"] == reason
    assert s["cancelToSilenceMs"] < 100, s["cancelToSilenceMs"]
    time.sleep(0.4)
    later, s2 = client.last(), client.snap()
    assert later["receivedMs"] == u["receivedMs"]          # nothing of the cancelled stream was accepted
    assert s2["bufferMs"] == 0 and not s2["playing"]
    assert s2["playedMs"] == s["playedMs"]                  # not one sample played after the silence
    assert client.problems == []


def test_stop_button_silences_playback_within_100ms(client):
    client.speak(LONG, "opus/48000", frames=LONG_FRAMES)
    client.wait_playing(300)
    assert client.last()["outcome"] == "speaking"          # still being generated: the cancel goes to the server
    client.page.click("#stop")
    _assert_cancelled_quietly(client, "stopped")


def test_microphone_barge_in_silences_playback_within_100ms(client):
    page = client.page
    page.evaluate("talkgate.setMicLevel(-100)")
    page.check("#mic")                                     # getUserMedia on Chromium's fake device
    client.wait("document.getElementById('mic-db').textContent.endsWith('dBFS')", 5)
    page.evaluate("talkgate.setMicLevel(-10)")             # loud, but nothing is playing: no barge-in
    time.sleep(0.4)
    assert client.snap()["bargeIns"] == 0
    page.evaluate("talkgate.setMicLevel(-100)")
    client.speak(LONG, "pcm_s16le/48000", frames=LONG_FRAMES)
    client.wait_playing(300)
    page.evaluate("talkgate.setMicLevel(-10)")             # the person starts talking
    client.wait("talkgateStats.bargeIns === 1", 5)
    _assert_cancelled_quietly(client, "barge-in")


def test_fake_microphone_signal_triggers_barge_in(client):
    """No simulated level: the fake device's beeps go through getUserMedia and the analyser."""
    page = client.page
    page.fill("#hold", "40")
    page.dispatch_event("#hold", "change")
    page.eval_on_selector("#threshold", "el => { el.value = -60; el.dispatchEvent(new Event('input')); }")
    client.speak(LONG, "opus/48000", frames=LONG_FRAMES)
    client.wait_playing(100)
    page.check("#mic")
    client.wait("talkgateStats.bargeIns === 1", 10)
    client.wait("talkgateStats.cancelToSilenceMs !== null", 5)
    assert client.snap()["cancelToSilenceMs"] < 100
    assert client.last()["outcome"] == "barge-in"
    assert client.problems == []


def test_fixed_length_runs_to_exactly_that_many_frames(client):
    client.speak(SHORT, "pcm_s16le/24000", frames=5)
    client.wait("talkgateStats.utterances.at(-1)?.outcome.startsWith('done')", 30)
    u = client.last()
    assert u["outcome"] == "done (length)" and u["serverAudioMs"] == 5 * 80
    assert client.snap()["decodedSamples"] == 5 * 1920
    client.speak(SHORT, "pcm_s16le/24000", frames=0)       # out of range: the server's words, no audio
    client.wait("talkgateStats.errors.length === 1", 10)
    assert client.snap()["errors"][0]["code"] == "invalid_params"
    assert "out of range" in client.page.text_content("#error")
    assert client.problems == []


def test_server_errors_are_shown_in_words(client):
    page = client.page
    page.fill("#voice", "nobody")
    client.speak(SHORT)
    client.wait("talkgateStats.errors.length === 1", 10)
    assert page.is_visible("#error")
    shown = page.text_content("#error")
    assert "The server has no voice of that name." in shown and "nobody" in shown
    assert client.last()["outcome"] == "error: unknown_voice"
    assert client.snap()["framesReceived"] == 0           # refused start: no text spoke with default settings

    page.fill("#voice", "")
    client.speak("word " * (MAX_TEXT // 5 + 10))
    assert "over" in page.get_attribute("#text-count", "class")   # the page warned before sending
    client.wait("talkgateStats.errors.length === 2", 10)
    assert "longer than the server allows" in page.text_content("#error")
    assert client.last()["outcome"] == "error: text_too_long"
    assert [e["code"] for e in client.snap()["errors"]] == ["unknown_voice", "text_too_long"]
    assert client.problems == []


def test_keyboard_labels_and_phone_width(client):
    page = client.page
    unlabelled = page.evaluate("""() => [...document.querySelectorAll('input, select, textarea, button')]
        .filter(el => !((el.labels && el.labels.length) || el.getAttribute('aria-label') || el.textContent.trim()))
        .map(el => el.id || el.outerHTML)""")
    assert unlabelled == []
    assert page.get_attribute("#conn-state", "aria-live") == "polite"
    assert page.get_attribute("#error", "role") == "alert"

    page.focus("#text")
    page.keyboard.press("Control+Enter")
    client.wait("talkgateStats.utterances.length === 1 && talkgateStats.framesReceived > 0", 10)
    page.keyboard.press("Escape")
    client.wait("talkgateStats.utterances.at(-1)?.outcome === 'stopped'", 5)

    page.keyboard.press("Tab")                             # focus is visible
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none"

    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert client.problems == []


def test_keepalive_pings_hold_an_idle_connection_open(browser, tiny_checkpoint):
    """The server closes a connection after 17 s without a client message; the page's 15 s pings
    keep it open (browsers cannot send WebSocket pings, so this is the only keepalive)."""
    with TalkgateServer(tiny_checkpoint, "--idle-timeout", "17") as srv:
        context = browser.new_context()
        client = Client(context.new_page()).open(srv.url)
        session = client.snap()["sessionId"]
        client.wait("talkgateStats.pongs >= 1", 5)                  # the ping sent on session.ready
        time.sleep(24)
        s = client.snap()
        assert s["pongs"] >= 2                                      # the 15 s keepalive ping was answered
        assert s["state"] == "open" and s["sessionId"] == session   # never dropped, never reconnected
        assert client.problems == []
        context.close()


def test_api_key_refusal_is_final_and_explained(browser, tiny_checkpoint):
    with TalkgateServer(tiny_checkpoint, "--api-key", "k-right") as srv:
        context = browser.new_context()
        client = Client(context.new_page())
        client.page.goto(srv.url + "/")
        client.wait("talkgateStats.state === 'closed' && talkgateStats.errors.length === 1", 10)
        assert "needs a valid API key" in client.page.text_content("#error")
        assert "refused" in client.page.text_content("#conn-state")     # 1008: no reconnect loop
        time.sleep(1.5)
        assert client.snap()["state"] == "closed"
        client.page.fill("#api-key", "k-right")
        client.page.click("#connect")
        client.wait("talkgateStats.state === 'open' && talkgateStats.pongs >= 1", 10)
        client.speak(SHORT, "pcm_s16le/24000")
        client.wait("talkgateStats.framesReceived > 0", 20)
        assert client.problems == []
        context.close()


def test_reconnects_after_the_server_restarts(browser, tiny_checkpoint):
    with TalkgateServer(tiny_checkpoint) as first:
        port = first.port
        context = browser.new_context()
        client = Client(context.new_page()).open(first.url)
        session1 = client.snap()["sessionId"]
        first.stop()
        # state and text read in one evaluation: the first retry comes 0.4-0.6 s later, and a separate read
        # of the text after the wait saw the next attempt's "Connecting to" on a loaded CI machine
        client.wait("talkgateStats.state === 'reconnecting' && "
                    "document.querySelector('#conn-state').textContent.includes('Reconnecting in')", 15)
    with TalkgateServer(tiny_checkpoint, "--port", str(port)):
        client.wait("talkgateStats.state === 'open'", 30)
        assert client.snap()["sessionId"] not in (None, session1)
        client.speak(SHORT, "pcm_s16le/24000")
        client.wait("talkgateStats.framesReceived > 0", 20)
        # Chromium itself logs each refused attempt while the server was down; nothing else may appear
        assert [p for p in client.problems if "ERR_CONNECTION_REFUSED" not in p] == []
    context.close()
