"""Deepgram /v1/speak translator, Sans-I/O: messages in, engine commands and wire messages out, engine
events built in the test (tests/compat_harness.py)."""
from __future__ import annotations

import pytest

from talkgate.sessions.actions import Close
from talkgate.sessions.deepgram import DeepgramProtocol
from talkgate.sessions.voices import VoiceMap
from talkgate.synth.api import CancelContext
from tests.compat_harness import INFO, Harness, jsons


def make(tokenizer, **query):
    voices = VoiceMap({"deepgram": {"aura-test": INFO.voices[0]}})
    h = Harness(tokenizer, lambda s: DeepgramProtocol(s, "s1", {"model": "aura-test", **query}, voices))
    h.ready()
    return h


def test_metadata_speak_flush_flushed(tokenizer):
    h = make(tokenizer, encoding="linear16", sample_rate="16000")
    (meta,) = h.deliver()
    assert meta["type"] == "Metadata" and meta["model_name"] == "aura-test" and meta["request_id"]
    h.send({"type": "Speak", "text": "Hello "})
    h.send({"type": "Speak", "text": "world."})
    h.send({"type": "Flush"})
    h.finish()
    out = h.deliver()
    audio = [m for m in out if isinstance(m, bytes)]
    assert audio and out[-1] == {"type": "Flushed", "sequence_id": 0}
    assert sum(map(len, audio)) % (2 * 1280) == 0        # 80 ms frames of s16le at 16 kHz


def test_several_flushes_answer_in_order(tokenizer):
    h = make(tokenizer)
    h.send({"type": "Speak", "text": "One."})
    h.send({"type": "Flush"})
    h.send({"type": "Flush"})                                  # nothing new: answered after the first
    h.send({"type": "Speak", "text": "Two."})
    h.send({"type": "Flush"})
    h.finish()
    out = h.deliver()
    flushed = [(i, m["sequence_id"]) for i, m in enumerate(out) if isinstance(m, dict) and m["type"] == "Flushed"]
    assert [s for _, s in flushed] == [0, 1, 2]
    assert any(isinstance(m, bytes) for m in out[flushed[1][0]:flushed[2][0]])    # "Two." after Flushed 1


def test_clear_purges_before_cleared(tokenizer):
    h = make(tokenizer)
    h.deliver()
    h.send({"type": "Speak", "text": "A rather long sentence that will be interrupted by the caller."})
    h.send({"type": "Flush"})
    (ctx,) = h.opened()
    h.audio(ctx, 2)
    h.deliver()                                               # some audio reached the client
    h.audio(ctx, 2)                                           # more is queued, not yet written
    assert h.close is None
    h.send({"type": "Clear"})
    assert h.commands[-1] == CancelContext(ctx)
    queued = h.queued()         # queued audio of the old turn is dropped (its Flushed may remain)
    assert not any(isinstance(m, bytes) for m in queued) and queued[-1] == {"type": "Cleared", "sequence_id": 0}
    h.audio(ctx, 2)
    assert h.queued() == queued                                     # and none follows
    h.deliver()
    h.send({"type": "Speak", "text": "New turn."})            # the socket goes on
    h.send({"type": "Flush"})
    h.finish()
    out = h.deliver()
    assert isinstance(out[0], bytes) and out[-1] == {"type": "Flushed", "sequence_id": 1}


def test_close_finishes_then_closes(tokenizer):
    h = make(tokenizer)
    h.send({"type": "Speak", "text": "Bye now."})
    h.send({"type": "Close"})
    assert h.close is None
    h.finish()
    assert h.close == Close(1000, "closed by client") and any(isinstance(m, bytes) for m in h.deliver())


def test_close_with_nothing_pending_closes_now(tokenizer):
    h = make(tokenizer)
    h.send({"type": "Close"})
    assert h.close == Close(1000, "closed by client")


@pytest.mark.parametrize("query, reason", [
    ({"encoding": "opus"}, "UNSUPPORTED_ENCODING"),
    ({"encoding": "mulaw", "sample_rate": "16000"}, "UNSUPPORTED_SAMPLE_RATE"),
    ({"sample_rate": "44100"}, "UNSUPPORTED_SAMPLE_RATE"),
    ({"model": "aura-nobody"}, "INVALID_MODEL"),
    ({"sample_rate": "\u00b2"}, "UNSUPPORTED_SAMPLE_RATE"),
    ({"sample_rate": "16000.0"}, "UNSUPPORTED_SAMPLE_RATE"),
])
def test_bad_query_is_a_close_frame(tokenizer, query, reason):
    h = make(tokenizer, **query)
    assert h.queued() == [] and h.close.code == 1008 and h.close.reason.startswith(reason)


@pytest.mark.parametrize("msg", ["{nope", "[]", {"type": "Speak"}, {"type": "Speak", "text": 3},
                                 {"type": "Speak", "text": "x" * 2001}, '{"type": "Speak", "text": "\\udc00"}',
                                 "[" * 2000 + "]" * 2000])
def test_malformed_messages_close_1008(tokenizer, msg):
    h = make(tokenizer)
    h.send(msg)
    assert h.close.code == 1008 and h.close.reason.startswith("DATA-0000") and h.close.error


def test_unknown_type_warns(tokenizer):
    h = make(tokenizer)
    h.deliver()
    h.send({"type": "Dance"})
    (warning,) = jsons(h.queued())
    assert warning["type"] == "Warning" and warning["code"] == "UNKNOWN_MESSAGE_TYPE" and h.close is None


def test_mulaw_8k(tokenizer):
    h = make(tokenizer, encoding="mulaw", sample_rate="8000")
    h.send({"type": "Speak", "text": "Hi."})
    h.send({"type": "Flush"})
    h.finish()
    audio = b"".join(m for m in h.deliver() if isinstance(m, bytes))
    assert audio and len(audio) % 640 == 0


def test_flushes_keep_one_context_and_a_long_stream_rolls_over(tokenizer):
    """Flush after flush the stream stays in one engine context; once a flush has been spoken past
    ROLLOVER_FRAMES of audio, that context ends and the next text opens a new one."""
    from talkgate.sessions.utterances import ROLLOVER_FRAMES
    from talkgate.synth.api import EndText, FlushText, TextSpoken
    h = make(tokenizer)
    for i in range(3):
        h.send({"type": "Speak", "text": f"Part {i}. "})
        h.send({"type": "Flush"})
    h.finish()
    (ctx,) = h.opened()
    assert sum(isinstance(c, FlushText) for c in h.commands) == 3 and not h.ended_text(ctx)
    h.send({"type": "Speak", "text": "A long one. "})
    h.send({"type": "Flush"})
    h.audio(ctx, ROLLOVER_FRAMES)
    h.answered[ctx] += 1
    h.event(TextSpoken(ctx, "length_rule", h.frames[ctx]))
    assert h.commands[-1] == EndText(ctx)                    # nothing new: ends at once
    h.send({"type": "Speak", "text": "Next. "})
    h.send({"type": "Flush"})
    assert len(h.opened()) == 2
    h.finish()
    flushed = [m["sequence_id"] for m in h.deliver() if isinstance(m, dict) and m["type"] == "Flushed"]
    assert flushed == [0, 1, 2, 3, 4]


def test_an_engine_ended_context_answers_its_flushes_and_the_stream_goes_on(tokenizer):
    """The engine ends the context by itself (its frame limit) with two flushes owed: both are answered,
    in order, and the next text starts a new context."""
    from talkgate.synth.api import ContextDone
    h = make(tokenizer)
    h.send({"type": "Speak", "text": "One. "})
    h.send({"type": "Flush"})
    h.send({"type": "Speak", "text": "Two. "})
    h.send({"type": "Flush"})
    (ctx,) = h.opened()
    h.audio(ctx, 3)
    h.event(ContextDone(ctx, "budget", 3))
    out = h.deliver()
    assert [m["sequence_id"] for m in out if isinstance(m, dict) and m["type"] == "Flushed"] == [0, 1]
    h.send({"type": "Speak", "text": "Three. "})
    h.send({"type": "Flush"})
    assert len(h.opened()) == 2 and h.close is None


def test_a_stream_waiting_for_text_gives_its_engine_slot_back(tokenizer):
    """Between turns a Deepgram socket waits for text: RELEASE_S after its flushes were spoken its engine
    context ends (the slot is free); the next turn starts a new context, and a turn that goes on sooner
    keeps its context."""
    from talkgate.sessions.utterances import RELEASE_S
    from talkgate.synth.api import EndText
    h = make(tokenizer)
    h.send({"type": "Speak", "text": "First turn. "})
    h.send({"type": "Flush"})
    h.finish()
    (ctx,) = h.opened()
    h.clock.t += RELEASE_S / 2
    h.apply(h.proto.tick())
    h.send({"type": "Speak", "text": "Same turn. "})              # soon enough: the same context
    h.send({"type": "Flush"})
    h.finish()
    assert h.opened() == [ctx] and not h.ended_text(ctx)
    h.clock.t += RELEASE_S
    h.apply(h.proto.tick())
    assert h.commands[-1] == EndText(ctx)
    h.finish()
    h.send({"type": "Speak", "text": "Next turn. "})
    h.send({"type": "Flush"})
    h.finish()
    assert len(h.opened()) == 2
    assert [m["sequence_id"] for m in h.deliver() if isinstance(m, dict) and m["type"] == "Flushed"] == [0, 1, 2]
