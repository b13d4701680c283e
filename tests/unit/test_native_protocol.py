"""The native protocol and session model, Sans-I/O: messages in, engine commands and wire actions out;
engine events built here in, wire actions out. No engine thread, no socket."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from talkgate.codecs.pcm import s16le_bytes
from talkgate.sessions.actions import Close, Purge
from talkgate.sessions.fields import SessionError
from talkgate.sessions.limits import Limits
from talkgate.sessions.native import AUDIO_HEADER, FORMATS, NativeProtocol, parse_format
from talkgate.synth.api import (
    AppendText, AudioChunk, CancelContext, ContextDone, EndText, OpenContext, TextSpoken,
)
from talkgate.sessions.voices import VoiceMap, Voices, VoiceScope
from tests.compat_harness import INFO, Harness, jsons, pcm

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "protocol.schema.json").read_text())


SCOPE = VoiceScope(Voices(INFO), VoiceMap())     # what a good key gives: the model's voices


def make(tokenizer, limits=Limits(max_contexts_per_connection=2, max_text_chars=100), authenticate=None):
    h = Harness(tokenizer, lambda s: NativeProtocol(s, limits, "s1", authenticate), limits)
    return h


def test_ready_and_config(tokenizer):
    h = make(tokenizer)
    (ready,) = jsons(h.ready() and h.queued())
    assert ready["type"] == "session.ready" and ready["model"]["untrained"] is True
    assert ready["model"]["end_of_speech"] == "text_length_rule"
    h.send({"type": "session.config", "voice": "RYAN", "language": "English",
            "format": {"encoding": "opus", "sample_rate": 48000}})
    conf = h.queued()[-1]
    assert conf["config"]["voice"] == "ryan" and conf["config"]["language"] == "english"
    assert conf["config"]["format"] == {"encoding": "opus", "sample_rate": 48000}
    assert h.commands == []                     # configuring touches no engine


def test_text_becomes_token_ids_and_audio_becomes_frames(tokenizer):
    h = make(tokenizer)
    h.send({"type": "text", "context_id": "a", "text": "Hello "})
    (started,) = h.queued()
    assert started == {"type": "context.started", "context_id": "a", "stream": 1,
                       "format": {"encoding": "pcm_s16le", "sample_rate": 24000}}
    (ctx,) = h.opened()
    assert h.commands[0] == OpenContext(ctx, h.commands[0].params) and h.commands[0].params.voice is None
    h.send({"type": "text", "context_id": "a", "text": "world."})
    h.send({"type": "flush", "context_id": "a"})
    assert [type(c) for c in h.commands] == [OpenContext, AppendText, AppendText, EndText]
    assert h.text_ids(ctx) == tokenizer.encode("Hello world.")      # the session tokenized the deltas
    assert sum(c.seconds for c in h.commands if isinstance(c, AppendText)) == pytest.approx(12 * 0.06)
    h.deliver()
    h.audio(ctx, 3)
    h.event(ContextDone(ctx, "eos", 3))
    out = h.deliver()
    audio = [m for m in out if isinstance(m, bytes)]
    assert len(audio) == 3
    for seq, frame in enumerate(audio):
        version, enc, _, stream, s, start_ms = AUDIO_HEADER.unpack_from(frame)
        assert (version, enc, stream, s, start_ms) == (1, 2, 1, seq, 80 * seq)
        assert frame[AUDIO_HEADER.size:] == s16le_bytes(pcm(seq))      # the engine's PCM, as s16le
    msgs = jsons(out)
    assert [m["type"] for m in msgs] == ["timing", "context.done"]
    assert msgs[-1] == {"type": "context.done", "context_id": "a", "reason": "eos", "frames": 3, "audio_ms": 240.0,
                        "ttfa_ms": msgs[0]["ttfa_ms"]}
    assert not any(isinstance(c, CancelContext) for c in h.commands)     # the engine ended it itself


def test_cancel_purges_reports_sent_audio_and_drops_stale_events(tokenizer):
    h = make(tokenizer)
    h.send({"type": "context.start", "context_id": "c", "fixed_frames": 500})
    h.send({"type": "text", "context_id": "c", "text": "Some words to say."})
    h.send({"type": "flush", "context_id": "c"})
    (ctx,) = h.opened()
    assert h.commands[0].params.fixed_frames == 500
    h.deliver()
    h.audio(ctx, 4)
    sent = [a for a in h.outbox if a.stream == 1]
    for a in sent[:2]:                  # the socket wrote two of them
        h.proto.note_sent(a.stream, a.audio_ms)
    out = h.send({"type": "cancel", "context_id": "c"})
    assert isinstance(out[0], Purge) and out[0].stream == 1 and h.commands[-1] == CancelContext(ctx)
    timing, cancelled = h.queued()                  # its queued audio was purged
    assert timing["type"] == "timing"
    assert cancelled == {"type": "context.cancelled", "context_id": "c", "audio_ms_sent": 160.0}
    assert ctx not in h.live()          # its audio still in flight is dropped before the protocol
    assert h.send({"type": "cancel", "context_id": "c"})
    assert h.queued()[-1]["code"] == "unknown_context"


def test_engine_refusal_ends_the_context_with_one_fatal_error(tokenizer):
    h = make(tokenizer)
    h.send({"type": "text", "context_id": "a", "text": "Too many at once."})
    (ctx,) = h.opened()
    h.deliver()
    h.fail(ctx)
    (err,) = jsons(h.deliver())
    assert err == {"type": "error", "code": "engine_full", "message": "all 4 context slots are in use",
                   "context_id": "a", "fatal": True}
    assert h.proto.session.active == [] and CancelContext(ctx) not in h.commands


def test_slow_consumer_is_audio_left_unread_by_a_client_behind_real_time(tokenizer):
    limits = Limits(max_backlog_ms=400)
    h = make(tokenizer, limits)
    h.send({"type": "text", "context_id": "s", "text": "Nobody reads this."})
    (ctx,) = h.opened()
    h.audio(ctx, 20)                      # 1.6 s of audio made at once: generation runs ahead
    h.clock.t += 0.3                      # 1.6 s unread, but a real-time player would have taken 0.3 s only
    assert h.apply(h.proto.tick()) == []
    h.clock.t += 0.2                      # 0.5 s behind real time, over min(1 s, the limit)
    out = h.apply(h.proto.tick())
    err = jsons(h.queued())[-1]
    assert err["code"] == "slow_consumer" and err["fatal"] is True and err["context_id"] == "s"
    assert Purge(1) in out and h.commands[-1] == CancelContext(ctx)


def test_a_client_behind_real_time_with_little_unread_is_not_cancelled(tokenizer):
    h = make(tokenizer, Limits(max_backlog_ms=400))
    h.send({"type": "text", "context_id": "t", "text": "A trickle."})
    (ctx,) = h.opened()
    h.audio(ctx, 4)                       # 320 ms made, none taken, the client 2 s behind: under the limit
    h.clock.t += 2.0
    assert h.apply(h.proto.tick()) == []


def test_a_real_time_reader_is_never_a_slow_consumer(tokenizer):
    h = make(tokenizer, Limits(max_backlog_ms=400))
    h.send({"type": "text", "context_id": "r", "text": "Read me at real time."})
    (ctx,) = h.opened()
    h.audio(ctx, 200)                     # 16 s generated before the client took a byte
    for _ in range(160):                  # the client takes 100 ms of it every 100 ms
        h.clock.t += 0.1
        h.proto.note_delivered(1, 100.0)
        assert h.apply(h.proto.tick()) == []


def test_a_server_behind_real_time_is_not_blamed_on_the_client(tokenizer):
    h = make(tokenizer, Limits(max_backlog_ms=400))
    h.send({"type": "text", "context_id": "l", "text": "The server is slow today."})
    (ctx,) = h.opened()
    for _ in range(30):                   # 80 ms of audio every 200 ms, all taken at once
        h.audio(ctx, 1)
        h.deliver()
        h.clock.t += 0.2
        assert h.apply(h.proto.tick()) == []


def test_close_waits_for_contexts_then_closes_and_refuses_new_ones(tokenizer):
    h = make(tokenizer)
    h.send({"type": "context.start", "context_id": "a", "fixed_frames": 3})
    h.send({"type": "text", "context_id": "a", "text": "Bye."})
    assert h.send({"type": "close"}) == [] and h.commands[-1] == EndText(h.opened()[0], h.commands[-1].ids)
    h.send({"type": "context.start", "context_id": "b"})
    assert h.queued()[-1]["code"] == "session_closing" and len(h.opened()) == 1
    h.speak(h.opened()[0], 3, "length")
    assert h.close == Close(1000, "closed by client")


@pytest.mark.parametrize("first", ['{"type": "text", "context_id": "a", "text": "x"}', "{junk", "[1]",
                                   '{"type": "auth", "api_key": "wrong"}', '{"type": "auth", "api_key": 5}'])
def test_auth_is_the_first_message_or_nothing(tokenizer, first):
    h = make(tokenizer, authenticate=lambda key: SCOPE if key == "k" else None)
    assert h.ready() == []
    h.send(first)
    assert h.queued()[0]["code"] == "unauthorized" and h.close == Close(1008, "unauthorized")
    h = make(tokenizer, authenticate=lambda key: SCOPE if key == "k" else None)
    h.send({"type": "auth", "api_key": "k"})
    assert h.queued()[0]["type"] == "session.ready"


def test_limits_and_empty_flush(tokenizer):
    h = make(tokenizer)
    h.send({"type": "context.start", "context_id": "a"})
    h.send({"type": "context.start", "context_id": "b"})
    h.send({"type": "context.start", "context_id": "c"})
    assert h.queued()[-1]["code"] == "too_many_contexts" and len(h.opened()) == 2
    h.deliver()
    h.send({"type": "flush", "context_id": "a"})           # nothing was said: ends at once
    (done,) = jsons(h.deliver())
    assert done["type"] == "context.done" and done["reason"] == "empty" and done["frames"] == 0
    assert h.commands[-1] == CancelContext(h.opened()[0])
    h.send({"type": "text", "context_id": "b", "text": "z" * 101})
    err = h.queued()[-1]
    assert err["code"] == "text_too_long" and err["fatal"] is True
    assert h.proto.session.active == [] and h.live() == []
    h.send({"type": "text", "context_id": "d", "text": "Left open "})
    h.apply(h.proto.idle_timeout())
    assert h.close == Close(1000, "idle timeout") and h.live() == []


def test_speed_stretches_the_delivered_audio(tokenizer):
    h = make(tokenizer)
    h.send({"type": "context.start", "context_id": "f", "speed": 9})
    assert h.queued()[-1]["code"] == "invalid_params"
    h.send({"type": "context.start", "context_id": "f", "fixed_frames": 10, "speed": 2.0})
    h.send({"type": "text", "context_id": "f", "text": "Quickly now."})
    h.send({"type": "flush", "context_id": "f"})
    h.speak(h.opened()[0], 10, "length")
    out = h.deliver()
    samples = sum(len(m) - AUDIO_HEADER.size for m in out if isinstance(m, bytes)) // 2
    assert samples == 10 * 1920 // 2           # half the duration, pitch kept (codecs/tempo.py)
    assert jsons(out)[-1]["frames"] == 10


def test_connection_lost_cancels_every_context(tokenizer):
    h = make(tokenizer)
    h.send({"type": "text", "context_id": "a", "text": "One "})
    h.send({"type": "text", "context_id": "b", "text": "Two "})
    h.apply(h.proto.connection_lost())
    assert sorted(c.context for c in h.commands if isinstance(c, CancelContext)) == sorted(h.opened())


def test_an_exception_ends_the_context_and_its_cancel_still_goes_out(tokenizer):
    """A bug while handling a context (here: an encoder that fails) must not leave its engine slot held:
    the context ends, and its CancelContext goes out with the protocol's abort."""
    h = make(tokenizer)
    h.send({"type": "text", "context_id": "a", "text": "Break the encoder "})
    (ctx,) = h.opened()
    h.proto.session._by_id["a"].encoder.encode = None                 # not callable: a TypeError
    with pytest.raises(TypeError):
        h.proto.engine_event(AudioChunk(ctx, pcm(0), 0, 1, 0.0))
    h.apply(h.proto.abort("internal_error", "internal server error", 1011))
    assert h.commands[-1] == CancelContext(ctx) and h.close.code == 1011 and h.proto.session.active == []


def test_base64_transport(tokenizer):
    h = make(tokenizer)
    h.send({"type": "session.config", "audio_transport": "base64"})
    h.send({"type": "text", "context_id": "a", "text": "Hi."})
    h.deliver()
    h.audio(h.opened()[0], 2)
    audio = [m for m in jsons(h.deliver()) if m["type"] == "audio"]
    assert [m["seq"] for m in audio] == [0, 1] and all(m["audio_ms"] == 80.0 for m in audio)


def test_formats_match_the_schema():
    """docs/protocol.schema.json and the server accept the same formats."""
    fmt_schema = {"$defs": SCHEMA["$defs"], "$ref": "#/$defs/format"}
    for enc in ("opus", "pcm_s16le", "pcm_f32le", "mulaw", "alaw", "mp3", "wav", "flac", "ogg_opus"):
        for rate in (8000, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 96000):
            fmt = {"encoding": enc, "sample_rate": rate}
            try:
                parse_format(fmt, None)
                server = True
            except SessionError:
                server = False
            try:
                jsonschema.validate(fmt, fmt_schema)
                schema = True
            except jsonschema.ValidationError:
                schema = False
            assert server == schema, fmt
    assert set(FORMATS) == {"opus", "pcm_s16le", "pcm_f32le", "mulaw", "alaw"}
    for bad in ({"encoding": "opus", "sample_rate": 48000, "bitrate": 1}, {"encoding": "pcm_s16le", "sample_rate": 44100.0},
                {"encoding": "mulaw", "sample_rate": True}, {"encoding": ["opus"]}, []):
        with pytest.raises(SessionError):
            parse_format(bad, None)
    reasons = next(s for s in SCHEMA["$defs"]["server"]["oneOf"]
                   if s["properties"]["type"].get("const") == "context.done")["properties"]["reason"]["enum"]
    assert set(reasons) == {"eos", "length", "length_rule", "budget", "empty"}


def test_underrun_risk_is_a_write_after_a_real_time_player_would_have_run_dry(tokenizer):
    """The server's last view of an underrun: a player fed by the socket writes, started at the first, stalls
    (over 1 ms) before a write. Counted once a stall; the player then starts again from that write."""
    from tests.compat_harness import Clock
    clock, stalls = Clock(100.0), []

    class Counting:
        def started(self): ...
        def first_audio(self, ttfa_ms): ...
        def audio(self, frames): ...
        def ended(self, reason): ...
        def underrun_risk(self): stalls.append(clock.t)

    h = Harness(tokenizer, lambda s: NativeProtocol(s, Limits(), "s1", None), clock=clock)
    h.session.observer = Counting()
    h.send({"type": "text", "context_id": "a", "text": "Hello there, world."})
    (ctx,) = h.opened()
    h.deliver()
    for t in (100.0, 100.05, 100.2, 100.2805, 100.3605, 100.45):     # one 80-ms frame written at each
        clock.t = t
        h.audio(ctx, 1)
        h.deliver()
    assert stalls == [100.2, 100.45]        # dry at 100.16 and at 100.44; 100.2805 is within 1 ms of 100.28
    h.event(TextSpoken(ctx, "length_rule", h.frames[ctx]))      # a flush spoken: the context waits for more text
    h.deliver()
    for t in (103.0, 103.2):                # the next text's audio, 3 s later: a new player; then one late write
        clock.t = t
        h.audio(ctx, 1)
        h.deliver()
    assert stalls == [100.2, 100.45, 103.2]


@pytest.mark.parametrize("player, limits, lead", [(True, Limits(stream_lead_s=0.5), 0.5),
                                                 (True, Limits(stream_lead_s=None), None),
                                                 (False, Limits(stream_lead_s=0.5), 0.5), (True, Limits(), 2.0)])
def test_a_players_contexts_carry_the_servers_stream_lead_and_others_none(tokenizer, player, limits, lead):
    """A WebSocket's session (player) asks the engine to keep its contexts limits.stream_lead_s ahead of the client's
    player (2 s by default); an HTTP request's, and every context where the server's lead is off (None), run as fast
    as they can."""
    h = Harness(tokenizer, lambda s: NativeProtocol(s, limits, "s1", None), limits, player=player)
    h.send({"type": "text", "context_id": "a", "text": "Hello."})
    (opened,) = [c for c in h.commands if isinstance(c, OpenContext)]
    assert opened.params.lead_s == (lead if player else None)
