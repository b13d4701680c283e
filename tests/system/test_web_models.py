"""The web page with several models (issue 46 item 4), in real headless Chromium against a real `talkgate serve` of
three tiny checkpoints: CustomVoice (the default), Base and a second Base of other weights. The page lists the
served models (session.ready's `models`); the chosen one speaks, its voices fill the voice list, and the cloned-
voices card shows only for a model that clones, listing the voices that model can speak."""
from __future__ import annotations

import pytest
from playwright.sync_api import sync_playwright

from talkgate.synth.checkpoint import create_checkpoint
from tests.serverproc import TalkgateServer
from tests.system.test_web import CHROMIUM, FLAGS, Client
from tests.voicetools import KEY, audio_file


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tiny_base_checkpoint, tmp_path_factory):
    base2 = create_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-base-2", preset="tiny", variant="base", seed=1)
    store = tmp_path_factory.mktemp("voice-store")
    with TalkgateServer(f"cv={tiny_checkpoint}", "--model", f"base={tiny_base_checkpoint}", "--model",
                        f"base2={base2}", "--workers", "1", "--api-key", KEY, "--voice-store", str(store)) as srv:
        yield srv


@pytest.fixture(scope="module")
def page(server, tmp_path_factory):
    if not CHROMIUM.exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: run scripts/setup.sh --test or point TALKGATE_CHROMIUM at one")
    clip = tmp_path_factory.mktemp("clips") / "clip.wav"
    clip.write_bytes(audio_file(2.5, 61, 24000))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        context = browser.new_context(viewport={"width": 1200, "height": 1400})
        client = Client(context.new_page())
        client.clip = clip
        client.page.goto(server.url + "/")
        client.page.fill("#api-key", KEY)
        client.page.click("#connect")
        client.wait("talkgateStats.state === 'open' && talkgateStats.models.length === 3")
        yield client
        browser.close()


def options(page, selector: str) -> list[str]:
    return page.eval_on_selector_all(f"{selector} option", "os => os.map(o => o.value)")


def test_the_chosen_model_speaks_with_its_voices_and_clones_only_when_it_can(page):
    c, p = page, page.page
    models = {m["name"]: m for m in c.snap()["models"]}
    assert options(p, "#model-pick") == ["cv", "base", "base2"] and p.input_value("#model-pick") == "cv"
    assert models["cv"]["default"] and not models["cv"]["clones"] and models["base"]["clones"]
    # the default CustomVoice model: its speakers, no clone card
    assert options(p, "#voices") == models["cv"]["voices"] and "ryan" in models["cv"]["voices"]
    assert not p.is_visible("#clone-card") and c.snap()["clones"]["available"] is False
    p.fill("#voice", "ryan")
    c.speak("Hello from the preset voice.", "pcm_s16le/24000", frames=4)
    c.wait("talkgateStats.utterances.at(-1)?.outcome.startsWith('done')")
    assert c.last()["model"] == "cv" and c.last()["serverAudioMs"] == 320

    # a Base model: its speaker leaves the voice box, the clone card shows; a voice stored there is spoken by it
    p.select_option("#model-pick", "base")
    c.wait("talkgateStats.model.name === 'base' && talkgateStats.clones.available === true")
    assert p.input_value("#voice") == "" and options(p, "#voices") == []
    assert p.is_visible("#clone-card") and "cloned (stored below)" in p.text_content("#model")
    p.fill("#clone-name", "Base voice")
    p.check("#clone-consent")
    p.set_input_files("#clone-file", str(c.clip))
    c.wait("talkgateStats.clones.clip?.source === 'file'")
    p.click("#clone-store")
    c.wait("talkgateStats.clones.lastStored?.name === 'Base voice'")
    stored = c.snap()["clones"]["lastStored"]
    assert p.input_value("#voice") == stored["id"] and options(p, "#voices") == [stored["id"]]
    c.speak("Hello from the cloned voice.", "pcm_s16le/24000", frames=4)
    c.wait("talkgateStats.utterances.at(-1)?.outcome.startsWith('done')")
    assert c.last()["model"] == "base" and c.last()["voice"] == stored["id"]

    # the other Base checkpoint cannot speak a voice the first made: not in its list, refused in words
    p.select_option("#model-pick", "base2")
    c.wait("talkgateStats.model.name === 'base2' && talkgateStats.clones.available === true")
    c.wait("talkgateStats.clones.voices.length === 0")
    assert options(p, "#voices") == [] and "none stored yet" in p.text_content("#clone-list")
    c.speak("Hello.", "pcm_s16le/24000", frames=4)
    c.wait("talkgateStats.utterances.at(-1)?.outcome === 'error: invalid_voice'")
    assert "cannot be spoken by the chosen model" in p.text_content("#error")

    # back to the CustomVoice model: the card goes, its speakers come back
    p.select_option("#model-pick", "cv")
    c.wait("talkgateStats.model.name === 'cv' && talkgateStats.clones.available === false")
    assert not p.is_visible("#clone-card") and options(p, "#voices") == models["cv"]["voices"]
    assert c.problems == []
