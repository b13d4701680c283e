"""The gateway's engine client (server/engine_client.py) on the real tiny engine: each step's events reach
the owner of their context on the event loop, in order; nothing of a cancelled context follows its cancel (this
is where a gateway drops stale events); batches handed to a busy loop are counted and hold the engine, and none is
dropped."""
from __future__ import annotations

import asyncio
import time

import numpy as np

from talkgate.server.engine_client import EngineClient, join_frames
from talkgate.synth.api import (
    AudioChunk, CancelContext, ContextDone, ContextParams, EndText, OpenContext, SamplingParams, TextSpoken,
)

GREEDY = SamplingParams(greedy=True)


class Owner:
    """What a Link offers the engine client: engine_event(event), called on the loop."""

    def __init__(self):
        self.events: list = []

    def engine_event(self, ev):
        assert asyncio.get_running_loop()           # on the loop, never on the engine's thread
        self.events.append(ev)


class Named(Owner):
    """An Owner that also logs (its name, each AudioChunk) in `delivered`, shared by several, in the order handed over."""

    def __init__(self, name: str, delivered: list):
        super().__init__()
        self.name, self.delivered = name, delivered

    def engine_event(self, ev):
        super().engine_event(ev)
        if isinstance(ev, AudioChunk):
            self.delivered.append((self.name, ev))


def speak(client, owner, frames: int) -> int:
    ctx = next(client.contexts)
    ids = tuple(client.new_tokenizer().tokenizer.encode("Hello there."))
    client.submit(owner, [OpenContext(ctx, ContextParams(sampling=GREEDY, fixed_frames=frames)), EndText(ctx, ids, 0.7)])
    return ctx


def frame_numbers(events) -> list[int]:
    """The frames of the AudioChunks among `events` (a chunk may hold several steps' frames, joined)."""
    return [f for ev in events if isinstance(ev, AudioChunk) for f in range(ev.first_frame, ev.first_frame + ev.n_frames)]


async def until(pred, timeout: float = 60) -> None:
    t = time.monotonic()
    while not pred():
        assert time.monotonic() - t < timeout
        await asyncio.sleep(0.01)


def test_events_reach_their_owner_in_order_once_per_step(tiny_engine):
    async def go():
        client = EngineClient(tiny_engine, asyncio.get_running_loop())
        a, b = Owner(), Owner()
        ca, cb = speak(client, a, 6), speak(client, b, 4)
        await until(lambda: a.events and isinstance(a.events[-1], ContextDone)
                    and b.events and isinstance(b.events[-1], ContextDone))
        client.close()
        return client, a, b, ca, cb

    client, a, b, ca, cb = asyncio.run(go())
    for owner, ctx, frames in ((a, ca, 6), (b, cb, 4)):
        assert {ev.context for ev in owner.events} == {ctx}
        assert frame_numbers(owner.events) == list(range(frames))
        assert owner.events[-1] == ContextDone(ctx, "length", frames)
    assert client.owned() == 0                      # done contexts are no longer routed


def test_nothing_follows_a_cancel_and_forget_cancels_what_is_left(tiny_engine):
    async def go():
        client = EngineClient(tiny_engine, asyncio.get_running_loop())
        owner = Owner()
        ctx = speak(client, owner, 500)
        await until(lambda: len(owner.events) >= 3)
        client.submit(owner, [CancelContext(ctx)])
        n = len(owner.events)
        await asyncio.sleep(0.3)
        late = owner.events[n:]
        other = Owner()
        left = speak(client, other, 500)
        await until(lambda: other.events)
        client.forget(other)                        # the link ended without its session cancelling
        await asyncio.sleep(0.3)
        free = tiny_engine.stats()["free_slots"]
        client.close()
        return late, client.owned(), free, left

    late, owned, free, _ = asyncio.run(go())
    assert late == [] and owned == 0 and free == tiny_engine.stats()["slots"]


def test_a_busy_loop_holds_the_engine_and_nothing_is_dropped(tiny_engine, monkeypatch):
    monkeypatch.setattr(tiny_engine, "max_behind", 3)

    async def go():
        loop = asyncio.get_running_loop()
        client = EngineClient(tiny_engine, loop)
        tiny_engine.hold = client.behind
        try:
            owner = Owner()
            ctx = speak(client, owner, 40)
            time.sleep(1.0)                         # the loop is blocked: batches wait, then the engine
            held = client._outstanding
            await until(lambda: owner.events and isinstance(owner.events[-1], ContextDone))
            return ctx, held, owner
        finally:
            tiny_engine.hold = None
            client.close()

    ctx, held, owner = asyncio.run(go())
    assert held == 3                                # the engine stopped at the limit
    chunks = [ev for ev in owner.events if isinstance(ev, AudioChunk)]
    assert frame_numbers(chunks) == list(range(40))
    assert max(ev.n_frames for ev in chunks) > 1    # the steps that waited came to the owner joined


def test_make_voice_answers_on_the_loop(tiny_engine):
    """EngineClient.make_voice: the engine's answer to MakeVoice comes back on the loop as the voice or as the
    engine's error (a CustomVoice model cannot clone); nothing of it is left behind in the routing."""
    import numpy as np
    import pytest

    from talkgate.synth.api import EngineError

    async def go():
        client = EngineClient(tiny_engine, asyncio.get_running_loop())
        with pytest.raises(EngineError) as e:
            await client.make_voice(np.zeros(24000, "<f4").tobytes(), None, 30)
        owned = client.owned()
        client.close()
        return e.value, owned

    err, owned = asyncio.run(go())
    assert err.code == "invalid_params" and "needs a Base checkpoint" in err.message and owned == 0


def test_a_step_for_many_links_is_handed_over_a_few_links_a_callback(tiny_engine):
    """Each Link takes 1 ms with its events (its Opus encoding, say): a step's batch for a dozen of them is not one
    callback of a dozen milliseconds; the loop runs its other callbacks between slices of ROUTE_SLICE_S, and each
    Link still gets every event of its context, in order."""
    log: list[str] = []

    class SlowOwner(Owner):
        def engine_event(self, ev):
            super().engine_event(ev)
            if isinstance(ev, AudioChunk):          # a step's audio of one Link: one chunk, joined if several
                log.append("link")
                time.sleep(0.001)

    async def go():
        loop = asyncio.get_running_loop()
        client = EngineClient(tiny_engine, loop)
        owners = [SlowOwner() for _ in range(12)]
        ctxs = [speak(client, o, 3) for o in owners]
        ticking = [True]

        def tick():                                 # one entry a loop callback round
            log.append("tick")
            if ticking[0]:
                loop.call_soon(tick)
        tick()
        await until(lambda: all(o.events and isinstance(o.events[-1], ContextDone) for o in owners))
        ticking[0] = False
        client.close()
        return owners, ctxs

    owners, ctxs = asyncio.run(go())
    runs = "".join("L" if e == "link" else "." for e in log).split(".")
    assert max(len(r) for r in runs) <= 4           # 2 ms of 1-ms Links, then the loop's other callbacks
    assert len(log) > 36
    for owner, ctx in zip(owners, ctxs):
        assert frame_numbers(owner.events) == [0, 1, 2]
        assert owner.events[-1] == ContextDone(ctx, "length", 3)


def test_a_step_hands_the_newest_contexts_audio_out_first(tiny_engine):
    """Within a step the Link whose context is at its first frames goes first (it has the least audio ahead of its
    player), though the older context comes first in the engine's rows; its first frame (launched apart from the
    running rows' where they have audio to spare: synth/engine.py) before the running context's of that step."""
    delivered: list[tuple[str, AudioChunk]] = []

    async def go():
        client = EngineClient(tiny_engine, asyncio.get_running_loop())
        old, new = Named("old", delivered), Named("new", delivered)
        speak(client, old, 16)
        await until(lambda: len(old.events) >= 4)
        speak(client, new, 4)
        await until(lambda: old.events and isinstance(old.events[-1], ContextDone)
                    and new.events and isinstance(new.events[-1], ContextDone))
        client.close()

    asyncio.run(go())
    order = [(name, ev.first_frame, ev.t_emitted) for name, ev in delivered]
    news = [i for i, (name, _, _) in enumerate(order) if name == "new"]
    assert len(news) == 4, order
    for i in news:      # a step's old frame (emitted with or after it: first frames may be launched apart) follows
        assert all(j > i for j, (name, _, t) in enumerate(order) if name == "old" and t >= order[i][2]), order


def test_join_frames_joins_each_contexts_frames_that_follow_on():
    """A Link's events of several steps: each context's frames that follow on become one chunk where the first
    was, though another context's frames come between; an end of that context or a gap in its frames ends a run."""
    def chunk(ctx, frame):
        return AudioChunk(ctx, np.full(4, 10 * ctx + frame, np.float32), frame, 1, 1.0 + frame)
    done, spoken = ContextDone(1, "eos", 3), TextSpoken(2, "eos", 7)
    out = join_frames([chunk(1, 0), chunk(2, 5), chunk(1, 1), chunk(2, 6), chunk(1, 2), done, spoken, chunk(2, 7),
                       chunk(2, 9), chunk(2, 10)])
    assert [(e.context, e.first_frame, e.n_frames) if isinstance(e, AudioChunk) else e for e in out] == [
        (1, 0, 3), (2, 5, 2), done, spoken, (2, 7, 1), (2, 9, 2)]
    np.testing.assert_array_equal(out[0].pcm, np.repeat([10.0, 11.0, 12.0], 4))
    assert out[0].t_emitted == 1.0 and out[1].t_emitted == 6.0


def test_a_new_contexts_first_frames_go_before_older_audio_still_queued(tiny_engine):
    """The loop is busy while the engine steps on (its Links slow to encode, say): the older contexts' audio of
    those steps waits in the queues, and the context at its first frames is handed over before it, though its
    audio came later. Every Link still gets its context's frames in order, those of several steps joined."""
    delivered: list[tuple[str, AudioChunk]] = []

    async def go():
        client = EngineClient(tiny_engine, asyncio.get_running_loop())
        old = [Named("old0", delivered), Named("old1", delivered)]
        for o in old:
            speak(client, o, 40)
        await until(lambda: all(len(frame_numbers(o.events)) >= 6 for o in old))
        new = Named("new", delivered)
        steps = tiny_engine.stats()["steps"]
        speak(client, new, 6)
        # the loop is blocked while the engine makes new's first frames and more of the old ones' (counted in
        # steps, not seconds: a loaded machine steps slower): the steps' batches wait for it
        deadline = time.monotonic() + 60
        while tiny_engine.stats()["steps"] < steps + 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        await until(lambda: all(o.events and isinstance(o.events[-1], ContextDone) for o in old + [new]))
        client.close()
        return old, new

    old, new = asyncio.run(go())
    at = next(i for i, (name, _) in enumerate(delivered) if name == "new")
    first = delivered[at][1]
    overtaken = [ev for name, ev in delivered[at + 1:] if name != "new" and ev.t_emitted < first.t_emitted]
    assert overtaken, "the new context's first frame waited behind all older audio"
    for o in old + [new]:
        assert frame_numbers(o.events) == list(range(40 if o in old else 6))
