"""Text as token ids (issue 45 item 3): a client whose LLM speaks Qwen's tokenizer sends the ids of its text in the
native protocol's `text` message (`ids` for `text`); the session commits them at once, as they are. Sans-I/O: the
native protocol and a Session with the tiny checkpoint's real tokenizer, engine events built here."""
from __future__ import annotations

import pytest

from talkgate.sessions.limits import Limits
from talkgate.sessions.native import NativeProtocol
from talkgate.synth.api import AppendText, ContextDone, EndText
from tests.compat_harness import Harness, jsons


def make(tokenizer, limits=Limits(max_text_chars=40)):
    return Harness(tokenizer, lambda s: NativeProtocol(s, limits, "s1"), limits)


def errors(h: Harness) -> list[dict]:
    return [m for m in jsons(h.queued()) if m["type"] == "error"]


def test_ids_are_committed_at_once_as_they_are_and_the_spoken_ids_are_the_texts(tokenizer):
    """Each message's ids reach the engine with that message, none held back (text holds its last token until the
    next delta proves it whole); the whole sequence is the text's one encoding, as the text deltas' would be."""
    text = "Hello there, general Kenobi."
    ids = tokenizer.encode(text)
    h = make(tokenizer)
    for i in ids:
        h.send({"type": "text", "context_id": "a", "ids": [i]})
        assert h.commands[-1] == AppendText(h.opened()[0], (i,), pytest.approx(h.commands[-1].seconds))
    h.send({"type": "flush", "context_id": "a"})
    (ctx,) = h.opened()
    assert h.text_ids(ctx) == ids and isinstance(h.commands[-1], EndText) and h.commands[-1].ids == ()
    streamed = make(tokenizer)
    for delta in ("Hello", " there,", " general", " Kenobi."):
        streamed.send({"type": "text", "context_id": "a", "text": delta})
    first = [c for c in streamed.commands if isinstance(c, AppendText)][0]
    assert first.ids == ()                          # text: "Hello" may still grow, so nothing is committed yet
    streamed.send({"type": "flush", "context_id": "a"})
    assert streamed.text_ids(streamed.opened()[0]) == ids


def test_a_lone_first_id_is_not_held_its_audio_goes_out_at_once(tokenizer):
    """One id in the first message and its frame 0 made: its audio goes out (a text context's lone first token
    waits for its second, which text may only prove two deltas later; the client's next id comes a token later)."""
    h = make(tokenizer)
    h.send({"type": "text", "context_id": "a", "ids": tokenizer.encode("好的")[:1]})
    (ctx,) = h.opened()
    h.deliver()
    h.audio(ctx, 1)
    out = h.deliver()
    assert [m for m in out if isinstance(m, bytes)] and [m["type"] for m in jsons(out)] == ["timing"]


def test_ids_that_are_not_text_tokens_are_refused_and_the_context_goes_on(tokenizer):
    h = make(tokenizer)
    size = tokenizer.text_vocab_size
    h.send({"type": "text", "context_id": "a", "ids": [size]})               # the first added token: not text
    h.send({"type": "text", "context_id": "a", "ids": [-1]})
    (e1, e2) = errors(h)
    assert e1["code"] == e2["code"] == "invalid_params" and f"0 to {size - 1}" in e1["message"]
    assert e1["context_id"] == "a"
    h.send({"type": "text", "context_id": "a", "ids": tokenizer.encode("Hi.")})
    h.send({"type": "flush", "context_id": "a"})
    (ctx,) = h.opened()
    assert h.text_ids(ctx) == tokenizer.encode("Hi.")


@pytest.mark.parametrize("msg, code", [
    ({"type": "text", "context_id": "a", "ids": [1, "2"]}, "invalid_message"),
    ({"type": "text", "context_id": "a", "ids": [1, True]}, "invalid_message"),
    ({"type": "text", "context_id": "a", "ids": [1.0]}, "invalid_message"),
    ({"type": "text", "context_id": "a", "ids": 7}, "invalid_message"),
    ({"type": "text", "context_id": "a", "ids": [1], "text": "x"}, "invalid_message"),
])
def test_malformed_ids_are_the_protocols_error(tokenizer, msg, code):
    h = make(tokenizer)
    h.send(msg)
    (err,) = errors(h)
    assert err["code"] == code and h.commands == []


def test_a_context_takes_text_or_ids_not_both(tokenizer):
    h = make(tokenizer)
    h.send({"type": "text", "context_id": "a", "text": "Hello"})
    h.send({"type": "text", "context_id": "a", "ids": tokenizer.encode(" there")})
    h.send({"type": "text", "context_id": "b", "ids": tokenizer.encode("Hi")})
    h.send({"type": "text", "context_id": "b", "text": " you"})
    (e1, e2) = errors(h)
    assert e1["code"] == e2["code"] == "invalid_params"
    assert "takes text" in e1["message"] and "takes token ids" in e2["message"]
    h.send({"type": "text", "context_id": "b", "text": ""})                 # nothing: no mixing
    assert len(errors(h)) == 2


def test_the_text_limit_counts_the_ids_text(tokenizer):
    h = make(tokenizer)                                                     # 40 characters a context
    h.send({"type": "text", "context_id": "a", "ids": tokenizer.encode("x" * 30)})
    h.send({"type": "text", "context_id": "a", "ids": tokenizer.encode("y" * 20)})
    (err,) = errors(h)
    assert err["code"] == "text_too_long"
    (ctx,) = h.opened()
    h.event(ContextDone(ctx, "cancelled", 0))
