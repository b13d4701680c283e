"""Cloning in the browser client (web/clones.js, recorder.js) in real headless Chromium against a real `talkgate
serve` of a tiny Base checkpoint: a reference clip recorded from Chromium's fake microphone (a WAV file) or
picked as a file, stored, spoken with, refused when silent, deleted."""
from __future__ import annotations

import pytest
from playwright.sync_api import sync_playwright

from tests.system.test_web import CHROMIUM, FLAGS, Client
from tests.voicetools import KEY, audio_file


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("clips")
    (d / "mic.wav").write_bytes(audio_file(4.0, 60, 48000))          # what the fake microphone plays, looped
    (d / "clip.mp3").write_bytes(audio_file(2.5, 61, 24000, "MP3", "MPEG_LAYER_III"))
    (d / "silent.wav").write_bytes(audio_file(2.0)[:44] + bytes(96000))
    return d


@pytest.fixture(scope="module")
def page(base_server, files):
    if not CHROMIUM.exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: run scripts/setup.sh --test or point TALKGATE_CHROMIUM at one")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM),
                                     args=FLAGS + [f"--use-file-for-fake-audio-capture={files / 'mic.wav'}"])
        context = browser.new_context(viewport={"width": 1200, "height": 1400})
        client = Client(context.new_page())
        client.page.goto(base_server.url + "/")
        client.page.fill("#api-key", KEY)          # the server needs a key: the first attempt was refused
        client.page.click("#connect")
        client.wait("talkgateStats.state === 'open' && talkgateStats.clones.available === true")
        yield client
        browser.close()


def test_record_store_and_speak(page, files):
    c = page
    p = c.page
    assert "cloned (stored below)" in p.text_content("#model")
    p.fill("#clone-name", "Mic voice")
    p.check("#clone-consent")
    p.click("#clone-record")
    c.wait("talkgateStats.clones.recording && talkgateStats.clones.recordedSeconds > 2.5")
    p.click("#clone-record")
    c.wait("talkgateStats.clones.clip && talkgateStats.clones.clip.source === 'microphone'")
    clip = c.snap()["clones"]["clip"]
    assert 2.5 < clip["seconds"] < 30 and clip["bytes"] > 44 + 2 * 48000 * 2     # 16-bit WAV at 48 kHz
    p.click("#clone-store")
    c.wait("talkgateStats.clones.lastStored !== null")
    stored = c.snap()["clones"]["lastStored"]
    assert stored["name"] == "Mic voice" and stored["mode"] == "x-vector"
    assert p.input_value("#voice") == stored["id"]           # it is now the voice
    assert stored["id"] in p.eval_on_selector_all("#voices option", "os => os.map(o => o.value)")
    assert "Mic voice" in p.text_content("#clone-list")
    c.speak("Hello there, this is my recorded voice.", "pcm_s16le/24000", frames=10)
    c.wait("talkgateStats.utterances.at(-1)?.outcome.startsWith('done')")
    u = c.last()
    assert u["voice"] == stored["id"] and u["serverAudioMs"] == 800 and c.problems == []


def test_pick_a_file_refusals_and_delete(page, files):
    c = page
    p = c.page
    p.fill("#clone-name", "File voice")
    p.fill("#clone-text", "Some words in the clip.")
    p.check("#clone-consent")
    p.set_input_files("#clone-file", str(files / "clip.mp3"))
    c.wait("talkgateStats.clones.clip && talkgateStats.clones.clip.source === 'file'")
    p.click("#clone-store")
    c.wait("talkgateStats.clones.lastStored?.name === 'File voice'")
    file_voice = c.snap()["clones"]["lastStored"]
    assert file_voice["mode"] == "icl"
    before = len(c.snap()["clones"]["voices"])
    # a silent clip and a name taken: said in words, nothing stored
    p.fill("#clone-name", "Silence")
    p.set_input_files("#clone-file", str(files / "silent.wav"))
    c.wait("talkgateStats.clones.clip?.filename === 'silent.wav'")
    p.click("#clone-store")
    c.wait("talkgateStats.errors.at(-1)?.code === 'audio_silent'")
    assert "The clip is silent" in p.text_content("#error")
    p.fill("#clone-name", "file VOICE")
    p.set_input_files("#clone-file", str(files / "clip.mp3"))
    c.wait("talkgateStats.clones.clip?.filename === 'clip.mp3'")
    p.click("#clone-store")
    c.wait("talkgateStats.errors.at(-1)?.code === 'voice_exists'")
    assert len(c.snap()["clones"]["voices"]) == before
    # deleted: gone from the list, and speaking with it is refused in words
    p.click(f"button[data-action=delete][data-id={file_voice['id']}]")
    c.wait(f"talkgateStats.clones.voices.length === {before - 1}")
    p.fill("#voice", file_voice["id"])
    c.speak("Hello.", "pcm_s16le/24000", frames=4)
    c.wait("talkgateStats.utterances.at(-1)?.outcome === 'error: unknown_voice'")
