"""The voice map and the alignment estimator (pure, no engine)."""
from __future__ import annotations

import json

import pytest

from talkgate.sessions.alignment import Timeline
from talkgate.sessions.voices import DEFAULT_TABLES, UnknownVoice, VoiceMap, resolve_language

VOICES = ("serena", "vivian", "ryan")


def test_resolution_order():
    vm = VoiceMap({"elevenlabs": {"abc": "ryan", "none": None}})
    assert vm.resolve("elevenlabs", "abc", VOICES) == "ryan"
    assert vm.resolve("elevenlabs", "none", VOICES) is None           # the model's default voice
    assert vm.resolve("elevenlabs", "Vivian", VOICES) == "vivian"     # a talkgate name passes through
    with pytest.raises(UnknownVoice):
        vm.resolve("elevenlabs", "21m00Tcm4TlvDq8ikWAM", VOICES)      # the file's table replaced the default
    assert vm.resolve("deepgram", "aura-2-helena-en", VOICES) == DEFAULT_TABLES["deepgram"]["aura-2-helena-en"]
    assert VoiceMap({"cartesia": {"*": "serena"}}).resolve("cartesia", "anything", VOICES) == "serena"
    assert vm.resolve("cartesia", "anything", ()) is None             # a model without named voices


def test_load_and_reject_bad_files(tmp_path):
    good = tmp_path / "v.json"
    good.write_text(json.dumps({"deepgram": {"aura-x": "ryan"}}))
    assert VoiceMap.load(good).resolve("deepgram", "aura-x", VOICES) == "ryan"
    for bad in ({"azure": {}}, {"deepgram": {"x": 3}}, {"deepgram": []}, [1]):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError):
            VoiceMap.load(path)
    with pytest.raises(ValueError):
        VoiceMap.load(tmp_path / "missing.json")


def test_languages():
    langs = ("auto", "english", "german")
    assert resolve_language("en", langs) == "english"
    assert resolve_language("de-DE", langs) == "german"
    assert resolve_language("English", langs) == "english"
    assert resolve_language("xx", langs) == "auto" and resolve_language(None, langs) == "auto"


def test_timeline_spans_follow_the_audio_clock():
    t = Timeline(chars_per_second=20)           # 50 ms per character
    t.add_text("ab cd")
    span, words = t.audio(80)                   # a, b start at 0 and 50 ms
    assert span.chars == ["a", "b"] and span.starts_ms == [0, 50] and span.durations_ms == [50, 30]
    assert words == []
    span, words = t.audio(80)                   # " " at 100, c at 150; the span ends at 160
    assert span.chars == [" ", "c"] and span.starts_ms == [20, 70] and sum(span.durations_ms) + 20 == 80
    assert [w.text for w in words] == ["ab"] and words[0].start_s == 0 and words[0].end_s == 0.08
    span, words = t.end_segment()               # "d" was not reached: reported at the end, zero length
    assert span.chars == ["d"] and span.durations_ms == [0]
    assert [w.text for w in words] == ["cd"]


def test_timeline_text_arriving_late_starts_at_the_audio():
    t = Timeline(chars_per_second=20)
    assert t.audio(200) == (None, [])           # audio before any text: nothing to align
    t.add_text("x")
    span, _ = t.audio(80)
    assert span.starts_ms == [200] and span.durations_ms == [80]      # relative to the last span end (0)
