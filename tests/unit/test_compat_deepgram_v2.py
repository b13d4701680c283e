"""Deepgram Flux /v2/speak translator, Sans-I/O: messages in, engine commands and wire messages out, engine events
built in the test (tests/compat_harness.py)."""
from __future__ import annotations

import pytest

from talkgate.sessions.actions import Close
from talkgate.sessions.deepgram_v2 import DeepgramV2Protocol, Turn, parse_query
from talkgate.sessions.fields import SessionError
from talkgate.sessions.voices import VoiceMap
from talkgate.synth.api import FRAME_SAMPLES, CancelContext, TextSpoken
from tests.compat_harness import INFO, ONE_MODEL, Harness, jsons

VOICES = VoiceMap({"deepgram": {"flux-test-en": INFO.voices[0]}})


def make(tokenizer, **query):
    settings = parse_query({"model": "flux-test-en", **query}, ONE_MODEL, VOICES)
    h = Harness(tokenizer, lambda s: DeepgramV2Protocol(s, "s1", settings))
    h.ready()
    return h


def types(items: list) -> list[str]:
    return ["audio" if isinstance(m, bytes) else m["type"] for m in items]


def test_connected_then_a_turn_between_speech_started_and_speech_metadata(tokenizer):
    h = make(tokenizer, encoding="linear16", sample_rate="16000")
    (connected,) = h.deliver()
    assert connected == {"type": "Connected", "request_id": "s1", "model_name": "flux-test-en",
                         "model_version": "talkgate", "model_uuids": ["s1"]}
    h.send({"type": "Speak", "text": "Hello "})
    h.send({"type": "Speak", "text": "world."})
    h.send({"type": "Flush"})
    h.finish()
    out = h.deliver()
    kinds = types(out)
    assert kinds[0] == "SpeechStarted" and kinds[-2:] == ["Flushed", "SpeechMetadata"]
    assert set(kinds[1:-2]) == {"audio"}
    speech_id = out[0]["speech_id"]
    assert speech_id.startswith("dg_sp_") and len(speech_id) == 18
    assert out[-2] == {"type": "Flushed", "speech_id": speech_id}
    meta = out[-1]
    assert meta == {"type": "SpeechMetadata", "speech_id": speech_id, "audio_duration_ms": 3 * 80,
                    "input_character_count": 12, "billable_character_count": 12,
                    "controls_applied": {"pronunciations_applied": 0, "breaks_applied": 0,
                                         "pronunciation_warnings": 0}}
    assert sum(len(m) for m in out if isinstance(m, bytes)) == 3 * 2 * 1280      # s16le, 16 kHz, 3 frames


def test_turns_follow_in_one_context_each_with_its_own_id(tokenizer):
    h = make(tokenizer)
    for text in ("One. ", "Two. "):
        h.send({"type": "Speak", "text": text})
        h.send({"type": "Flush"})
    h.finish()
    (ctx,) = h.opened()                         # one engine context: the voice carries across turns
    out = h.deliver()[1:]
    assert types(out) == ["SpeechStarted", *["audio"] * 3, "Flushed", "SpeechMetadata"] * 2
    ids = [m["speech_id"] for m in jsons(out)]
    assert ids[:3] == [ids[0]] * 3 and ids[3:] == [ids[3]] * 3 and ids[0] != ids[3]


def test_flush_without_text_warns(tokenizer):
    h = make(tokenizer)
    h.deliver()
    h.send({"type": "Flush"})
    (warning,) = h.deliver()
    assert warning["type"] == "Warning" and warning["code"] == "NO_ACTIVE_SPEECH" and h.close is None


def cut_turn(tokenizer, text="Hello there, how are you doing today my friend?"):
    """A turn of `text` with 5 frames (400 ms) of its audio made and written, more text pending."""
    h = make(tokenizer)
    h.deliver()
    h.send({"type": "Speak", "text": text})
    h.send({"type": "Flush"})
    (ctx,) = h.opened()
    h.audio(ctx, 5)
    h.deliver()
    return h, ctx


def test_interrupt_with_offset_cancels_at_once_and_splits_the_text(tokenizer):
    text = "Hello there, how are you doing today my friend?"
    h, ctx = cut_turn(tokenizer, text)
    h.send({"type": "Speak", "text": "Next turn."})              # a pending turn: dropped too
    h.audio(ctx, 2)                                            # queued, not yet written
    h.send({"type": "Interrupt", "playback_offset": {"type": "time_ms", "value": 400}})
    assert h.commands[-1] == CancelContext(ctx)
    queued = h.queued()
    assert types(queued) == ["SpeechInterrupted"]              # the queued audio was purged before it
    report = queued[0]
    # while the turn is being made its text is laid at 14 characters a second: 400 ms -> 6 characters
    assert report["audio_played_ms"] == 400
    assert report["text_spoken"] == "Hello " and report["text_remaining"] == text[6:]
    assert report["metadata"]["audio_duration_ms"] == 7 * 80 and report["metadata"]["input_character_count"] == 47
    h.audio(ctx, 1)
    assert h.queued() == queued                                # nothing of the old turn follows
    h.deliver()
    h.send({"type": "Speak", "text": "New turn."})             # the socket goes on, in a new context
    h.send({"type": "Flush"})
    h.finish()
    assert len(h.opened()) == 2 and types(h.deliver())[-1] == "SpeechMetadata"


def test_interrupt_in_a_turn_whose_audio_is_all_made_splits_evenly(tokenizer):
    """The client plays behind generation: the offset falls in a finished turn, whose text is spread over its
    audio."""
    h = make(tokenizer)
    h.send({"type": "Speak", "text": "aaaa bbbb cccc dddd"})    # 19 characters over 4 frames (320 ms)
    h.send({"type": "Flush"})
    (ctx,) = h.opened()
    h.audio(ctx, 4)
    h.event(TextSpoken(ctx, "length_rule", 4))
    h.send({"type": "Speak", "text": "Second turn."})
    h.audio(ctx, 2)
    first = h.deliver()[1]["speech_id"]
    h.send({"type": "Interrupt", "playback_offset": {"type": "time_ms", "value": 200}})
    (report,) = h.deliver()
    # 200 of 320 ms: 11.9 -> 12 characters, "aaaa bbbb cc", cut back to the word boundary
    assert report["text_spoken"] == "aaaa bbbb " and report["text_remaining"] == "cccc dddd"
    assert report["metadata"]["speech_id"] == first and report["audio_played_ms"] == 200


def test_interrupt_without_offset_reports_the_made_audio_and_no_split(tokenizer):
    h, ctx = cut_turn(tokenizer)
    h.send({"type": "Interrupt"})
    (report,) = h.deliver()
    assert report["audio_played_ms"] == 5 * 80 and "text_spoken" not in report and "text_remaining" not in report
    assert h.commands[-1] == CancelContext(ctx)


def test_interrupt_offsets_must_advance(tokenizer):
    h, ctx = cut_turn(tokenizer)
    h.send({"type": "Interrupt", "playback_offset": {"type": "time_ms", "value": 200}})
    h.deliver()
    h.send({"type": "Speak", "text": "Again and again."})
    (ctx2,) = h.live()
    h.audio(ctx2, 2)
    h.deliver()
    h.send({"type": "Interrupt", "playback_offset": {"type": "time_ms", "value": 200}})
    (warning,) = h.deliver()
    assert warning["code"] == "INVALID_INTERRUPT_OFFSET" and h.live() == [ctx2]
    h.send({"type": "Interrupt", "playback_offset": {"type": "time_ms", "value": 250}})
    (report,) = h.deliver()
    # rebased: the new turn starts at 200 ms, where the client stopped playing
    assert report["type"] == "SpeechInterrupted" and report["audio_played_ms"] == 250 and h.live() == []


def test_interrupt_before_any_audio_warns(tokenizer):
    h = make(tokenizer)
    h.deliver()
    h.send({"type": "Speak", "text": "Not yet spoken."})
    h.send({"type": "Interrupt"})
    (warning,) = h.deliver()
    assert warning["code"] == "NO_AUDIO_GENERATED" and h.live()


@pytest.mark.parametrize("heard_ms, done, spoken", [
    (0, True, ""), (1000, True, "one two three"), (600, True, "one two "), (400, True, "one "),
    (10_000, False, "one two three"), (300, False, "one "), (200, False, "one"), (100, False, ""),
])
def test_turn_split_falls_between_words(heard_ms, done, spoken):
    turn = Turn("dg_sp_1", "one two three", flushed=True, start_ms=0, audio_ms=1000, done=done)
    assert turn.split(heard_ms) == (spoken, "one two three"[len(spoken):])


def test_configure_speed_applies_from_the_next_turn(tokenizer):
    h = make(tokenizer)
    h.deliver()
    h.send({"type": "Speak", "text": "First turn."})
    h.send({"type": "Flush"})
    (ctx,) = h.opened()
    h.audio(ctx, 2)
    h.send({"type": "Configure", "speed": 1.5})
    h.send({"type": "Speak", "text": "Second turn."})          # pending: it gets the new speed
    h.send({"type": "Flush"})
    h.audio(ctx, 2)                                           # still the active turn: its own speed
    h.finish(frames=6)
    out = h.deliver()
    assert {"type": "ConfigureSuccess", "applied": {"speed": 1.5}} in out
    first, second = [m for m in jsons(out) if m["type"] == "SpeechMetadata"]
    assert first["audio_duration_ms"] == (4 + 6) * 80
    assert second["audio_duration_ms"] == round(6 * 80 / 1.5)
    second_start = out.index(jsons(out)[-3])
    assert out[second_start]["type"] == "SpeechStarted"
    stretched = b"".join(m for m in out[second_start:] if isinstance(m, bytes))
    assert len(stretched) == 2 * round(6 * FRAME_SAMPLES / 1.5)


def test_configure_when_idle_applies_at_once(tokenizer):
    h = make(tokenizer, speed="0.5")
    h.send({"type": "Configure"})
    h.send({"type": "Configure", "speed": 2})
    h.send({"type": "Configure", "speed": 1.23})
    h.send({"type": "Configure", "speed": 0.75})
    out = h.deliver()[1:]
    assert out[0] == {"type": "ConfigureSuccess", "applied": {"speed": 0.5}}
    assert out[1] == {"type": "ConfigureFailure", "code": "SPEED_OUT_OF_RANGE", "field": "speed", "value": 2,
                      "description": "speed 2 is outside 0.5 to 1.5"}
    assert out[2]["code"] == "SPEED_INCREMENT_INVALID" and out[2]["value"] == 1.23
    assert out[3] == {"type": "ConfigureSuccess", "applied": {"speed": 0.75}} and h.close is None
    h.send({"type": "Speak", "text": "Slow."})
    h.send({"type": "Flush"})
    h.finish(frames=3)
    meta = jsons(h.deliver())[-1]
    assert meta["audio_duration_ms"] == 3 * 80 / 0.75


def test_close_speaks_the_rest_then_session_metadata(tokenizer):
    h = make(tokenizer)
    h.send({"type": "Speak", "text": "Bye now."})
    h.send({"type": "Close"})
    assert h.close is None
    h.finish()
    assert h.close == Close(1000, "closed by client")
    out = h.deliver()[1:]
    assert types(out) == ["SpeechStarted", *["audio"] * 3, "SpeechMetadata", "SessionMetadata"]
    assert out[-1] == {"type": "SessionMetadata", "total_audio_duration_ms": 240, "total_input_character_count": 8,
                       "total_billable_character_count": 8}


def test_close_with_nothing_pending_closes_now(tokenizer):
    h = make(tokenizer)
    h.send({"type": "Close"})
    assert h.close == Close(1000, "closed by client") and types(h.deliver()) == ["Connected", "SessionMetadata"]


@pytest.mark.parametrize("msg, code", [
    ("{nope", "MESSAGE-0000"), ("[]", "MESSAGE-0000"), ({"type": "Speak"}, "MESSAGE-0000"),
    ({"type": "Speak", "text": 3}, "MESSAGE-0000"), ({"type": "Clear"}, "MESSAGE-0000"),
    ({"type": "Configure", "speed": "fast"}, "MESSAGE-0000"),
    ({"type": "Interrupt", "playback_offset": {"type": "bytes", "value": 3}}, "MESSAGE-0000"),
    ({"type": "Interrupt", "playback_offset": {"type": "time_ms", "value": -1}}, "MESSAGE-0000"),
    ({"type": "Speak", "text": "x" * 2001}, "BIG-0000"),
])
def test_bad_messages_are_an_error_then_close_1008(tokenizer, msg, code):
    h = make(tokenizer)
    h.deliver()
    h.send(msg)
    (error,) = h.deliver()
    assert error["type"] == "Error" and error["code"] == code and error["description"]
    assert h.close.code == 1008 and h.close.reason.startswith(code)


def test_idle_timeout_is_an_error_that_is_counted_then_close_1000(tokenizer):
    h = make(tokenizer)
    h.deliver()
    error, close = h.proto.idle_timeout()
    assert error.error == "idle_timeout" and '"code":"NET-0001"' in error.data    # Send.error: counted in /metrics
    assert close.code == 1000 and close.reason.startswith("NET-0001")


def test_binary_frame_is_an_error(tokenizer):
    h = make(tokenizer)
    h.deliver()
    h.apply(h.proto.receive_binary(b"\x00"))
    (error,) = h.deliver()
    assert error["code"] == "DATA-0000" and h.close.code == 1003


def test_engine_failure_is_an_error(tokenizer):
    h = make(tokenizer)
    h.deliver()
    h.send({"type": "Speak", "text": "Hello."})
    (ctx,) = h.opened()
    h.fail(ctx)
    (error,) = h.deliver()
    assert error["type"] == "Error" and error["code"] == "engine_full" and h.close.code == 1013


@pytest.mark.parametrize("query, code", [
    ({"model": ""}, "INVALID_MODEL"),
    ({"model": "aura-nobody"}, "INVALID_MODEL"),
    ({"model": "flux-test-en", "encoding": "opus"}, "UNSUPPORTED_ENCODING"),
    ({"model": "flux-test-en", "encoding": "mulaw", "sample_rate": "16000"}, "UNSUPPORTED_SAMPLE_RATE"),
    ({"model": "flux-test-en", "speed": "1.6"}, "SPEED_OUT_OF_RANGE"),
    ({"model": "flux-test-en", "speed": "fast"}, "SPEED_OUT_OF_RANGE"),
    ({"model": "flux-test-en", "speed": "1.02"}, "SPEED_INCREMENT_INVALID"),
    ({"model": "flux-test-en", "expressivity": "3"}, "EXPRESSIVITY_OUT_OF_RANGE"),
    ({"model": "flux-test-en", "expressivity": "0.5"}, "EXPRESSIVITY_INCREMENT_INVALID"),
])
def test_bad_query_is_refused(query, code):
    with pytest.raises(SessionError) as e:
        parse_query(query, ONE_MODEL, VOICES)
    assert e.value.code == code


def test_query_of_the_sdk():
    settings = parse_query({"model": "flux-test-en", "encoding": "linear16", "sample_rate": "44100", "speed": "1.25",
                            "expressivity": "-2", "mip_opt_out": "true", "tag": "x"}, ONE_MODEL, VOICES)
    assert (settings.voice, settings.format.sample_rate, settings.speed) == (INFO.voices[0], 44100, 1.25)
