"""DashScope Qwen-TTS realtime translator, Sans-I/O: client events in, engine commands and server events out, engine
events built in the test (tests/compat_harness.py)."""
from __future__ import annotations

import base64

from talkgate.sessions.actions import Close
from talkgate.sessions.dashscope import DashScopeProtocol
from talkgate.sessions.voices import VoiceMap
from talkgate.synth.api import FRAME_SAMPLES, AppendText, CancelContext, FlushText, OpenContext
from tests.compat_harness import Harness

RESPONSE_START = ["response.created", "response.output_item.added", "response.content_part.added"]
RESPONSE_END = ["response.audio.done", "response.content_part.done", "response.output_item.done", "response.done"]


def make(tokenizer, **session):
    h = Harness(tokenizer, lambda s: DashScopeProtocol(s, "s1", "qwen-tts-realtime", VoiceMap()))
    h.ready()
    if session:
        h.send({"type": "session.update", "event_id": "event_1", "session": session})
    return h


def types(items: list) -> list[str]:
    return [m["type"] for m in items]


def runs(items: list) -> list[str]:
    """types(), a run of audio deltas as one (a resampler's deltas need not match the engine's frames)."""
    out = []
    for kind in types(items):
        if not (out and kind == out[-1] == "response.audio.delta"):
            out.append(kind)
    return out


def audio_of(events: list[dict]) -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.audio.delta")


def test_session_created_then_updated_with_the_voice_mapped(tokenizer):
    h = make(tokenizer)
    (created,) = h.deliver()
    assert created["type"] == "session.created" and created["event_id"].startswith("event_")
    assert created["session"] == {"id": "sess_s1", "object": "realtime.session", "model": "qwen-tts-realtime",
                                  "mode": "server_commit", "voice": "Cherry", "response_format": "pcm",
                                  "sample_rate": 24000}
    h.send({"type": "session.update", "session": {"voice": "Ethan", "mode": "commit", "response_format": "pcm",
                                                  "sample_rate": 16000, "speech_rate": 1.5, "volume": 50}})
    (updated,) = h.deliver()
    assert updated["type"] == "session.updated"
    assert updated["session"]["voice"] == "Ethan" and updated["session"]["mode"] == "commit"
    assert updated["session"]["sample_rate"] == 16000 and updated["session"]["speech_rate"] == 1.5
    h.send({"type": "input_text_buffer.append", "text": "Hi."})
    h.send({"type": "input_text_buffer.commit"})
    (opened,) = [c for c in h.commands if isinstance(c, OpenContext)]
    assert opened.params.voice == "ryan"                    # Ethan -> ryan (sessions/voices.py)


def test_server_commit_streams_text_at_once_and_finish_speaks_the_rest(tokenizer):
    h = make(tokenizer, voice="Cherry", mode="server_commit")
    h.deliver()
    h.send({"type": "input_text_buffer.append", "text": "Hello "})
    (ctx,) = h.opened()
    assert [c for c in h.commands if isinstance(c, AppendText)]     # in the engine before any commit
    h.audio(ctx, 2)
    h.send({"type": "input_text_buffer.append", "text": "world."})
    h.send({"type": "session.finish"})
    h.finish()
    out = h.deliver()
    assert types(out) == [*RESPONSE_START, *["response.audio.delta"] * 2, "input_text_buffer.committed",
                          *["response.audio.delta"] * 3, *RESPONSE_END, "session.finished"]
    created, committed, done = out[0], out[5], out[-2]
    rid, item = created["response"]["id"], out[1]["item"]["id"]
    assert committed["item_id"] == item
    assert {e["response_id"] for e in out[2:-1] if "response_id" in e} == {rid}
    assert done["response"]["status"] == "completed" and done["response"]["usage"] == {"characters": 12}
    assert len(audio_of(out)) == 5 * FRAME_SAMPLES * 2             # s16le at 24 kHz
    assert h.close == Close(1000, "session finished")


def test_commit_mode_holds_text_until_each_commit_one_response_each(tokenizer):
    h = make(tokenizer, voice="Serena", mode="commit", response_format="pcm", sample_rate=8000)
    h.deliver()
    h.send({"type": "input_text_buffer.append", "text": "One. "})
    assert h.opened() == []                                  # the client decides when: nothing spoken yet
    h.send({"type": "input_text_buffer.commit"})
    h.send({"type": "input_text_buffer.append", "text": "Two. "})
    h.send({"type": "input_text_buffer.commit"})
    h.finish()
    (ctx,) = h.opened()                                      # one engine context: the voice carries across
    assert sum(isinstance(c, FlushText) for c in h.commands) == 2
    out = h.deliver()
    one = ["input_text_buffer.committed", *RESPONSE_START]
    assert runs(out) == one * 2 + ["response.audio.delta", *RESPONSE_END] * 2
    first, second = out[1]["response"]["id"], out[5]["response"]["id"]
    assert first != second
    assert [e["response"]["id"] for e in out if e["type"] == "response.done"] == [first, second]
    assert len(audio_of(out)) == 6 * FRAME_SAMPLES // 3 * 2  # s16le at 8 kHz


def test_clear_drops_uncommitted_text(tokenizer):
    h = make(tokenizer, mode="commit")
    h.deliver()
    h.send({"type": "input_text_buffer.append", "text": "Never said."})
    h.send({"type": "input_text_buffer.clear"})
    h.send({"type": "input_text_buffer.commit"})
    cleared, error = h.deliver()
    assert cleared["type"] == "input_text_buffer.cleared"
    assert error["type"] == "error" and error["error"]["code"] == "input_text_buffer_commit_empty"
    assert h.opened() == [] and h.close is None


def test_cancel_is_barge_in_no_audio_after(tokenizer):
    h = make(tokenizer, mode="commit")
    h.send({"type": "input_text_buffer.append", "text": "A long answer that goes on and on."})
    h.send({"type": "input_text_buffer.commit"})
    (ctx,) = h.opened()
    h.audio(ctx, 3)
    h.deliver()
    h.audio(ctx, 2)                                          # queued, not yet written
    h.send({"type": "response.cancel"})
    assert h.commands[-1] == CancelContext(ctx)
    queued = h.queued()
    assert types(queued) == ["response.done"]                # the queued deltas were purged before it
    assert queued[0]["response"]["status"] == "cancelled"
    h.audio(ctx, 1)
    assert h.queued() == queued                              # nothing of the cancelled response follows
    h.deliver()
    h.send({"type": "response.cancel"})                      # nothing left to cancel
    (error,) = h.deliver()
    assert error["error"]["code"] == "response_cancel_not_active"
    h.send({"type": "input_text_buffer.append", "text": "Next."})     # the socket goes on, in a new context
    h.send({"type": "input_text_buffer.commit"})
    h.finish()
    assert len(h.opened()) == 2 and types(h.deliver())[-1] == "response.done"


def test_clear_in_server_commit_stops_the_streamed_text(tokenizer):
    h = make(tokenizer)
    h.send({"type": "input_text_buffer.append", "text": "Streamed already"})
    (ctx,) = h.opened()
    h.audio(ctx, 1)
    h.deliver()
    h.send({"type": "input_text_buffer.clear"})
    assert h.commands[-1] == CancelContext(ctx)
    done, cleared = h.deliver()
    assert done["response"]["status"] == "cancelled" and cleared["type"] == "input_text_buffer.cleared"


def test_errors_in_dashscope_shape_and_the_socket_lives(tokenizer):
    h = make(tokenizer)
    h.deliver()
    h.send({"type": "session.update", "session": {"voice": "Nobody"}})
    h.send("{not json")
    h.send({"type": "response.create"})
    h.send({"type": "session.update", "session": {"response_format": "opus", "sample_rate": 22050}})
    h.send({"type": "session.update", "session": {"speech_rate": 3}})
    voice, bad_json, unknown, opus, rate = h.deliver()
    assert voice["type"] == "error" and voice["event_id"].startswith("event_")
    assert voice["error"]["type"] == "invalid_request_error" and voice["error"]["code"] == "invalid_value"
    assert voice["error"]["param"] == "session.voice" and "Nobody" in voice["error"]["message"]
    assert bad_json["error"]["code"] == "invalid_json" and unknown["error"]["code"] == "invalid_event"
    assert opus["error"]["param"] == "session.response_format"      # libopus takes no 22050 Hz
    assert rate["error"]["param"] == "session.speech_rate"
    assert h.close is None
    h.send({"type": "input_text_buffer.append", "text": "Hi."})
    h.send({"type": "session.update", "session": {"voice": "Serena"}})
    (late,) = [e for e in h.deliver() if e["type"] == "error"]
    assert late["error"]["code"] == "invalid_value" and "already started" in late["error"]["message"]


def test_formats(tokenizer):
    for fmt, rate, head in (("wav", 24000, b"RIFF"), ("mp3", 24000, None), ("opus", 48000, b"OggS")):
        h = make(tokenizer, mode="commit", response_format=fmt, sample_rate=rate)
        assert types(h.deliver()) == ["session.created", "session.updated"]
        h.send({"type": "input_text_buffer.append", "text": "Hi."})
        h.send({"type": "input_text_buffer.commit"})
        h.send({"type": "session.finish"})
        h.finish()
        audio = audio_of(h.deliver())
        assert audio and (head is None or audio.startswith(head)), fmt


def test_finish_with_nothing_said_closes_at_once(tokenizer):
    h = make(tokenizer)
    h.deliver()
    h.send({"type": "session.finish"})
    assert types(h.deliver()) == ["session.finished"] and h.close.code == 1000


def test_speech_rate_is_a_tempo_change(tokenizer):
    h = make(tokenizer, mode="commit", speech_rate=2.0)
    h.send({"type": "input_text_buffer.append", "text": "Hi."})
    h.send({"type": "input_text_buffer.commit"})
    h.finish()
    assert abs(len(audio_of(h.deliver())) / 2 - 3 * FRAME_SAMPLES / 2) <= 1     # 3 frames, half as long
