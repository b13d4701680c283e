"""Engine processes and the workers' view of them (ipc/engine_server.py, remote_engines.py, wire.py):
real engine processes on the tiny checkpoint (CPU), real local sockets, RemoteEngines on a real event loop."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from talkgate.ipc.remote_engines import RemoteEngines
from talkgate.server.engine_client import EngineClient
from talkgate.synth.api import (
    AppendText, AudioChunk, CancelContext, ContextDone, ContextFailed, ContextParams, EndText, OpenContext,
    SamplingParams,
)
from talkgate.synth.request import text_seconds

TEXT = "Hello there, this is a streaming test. It has two sentences!"
GREEDY = SamplingParams(greedy=True)


# ----- real engine processes -----
class EngineProc:
    def __init__(self, checkpoint, endpoint, slots):
        self.args = [sys.executable, "-m", "talkgate.processes.engine_process", "--endpoint", endpoint, "--model",
                     str(checkpoint), "--device", "cpu", "--max-contexts", str(slots)]
        self.start()

    def start(self):
        self.proc = subprocess.Popen(self.args, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


@pytest.fixture(scope="module")
def engines(tiny_checkpoint, tmp_path_factory):
    d = tmp_path_factory.mktemp("ipc")
    procs = [EngineProc(tiny_checkpoint, f"ipc://{d}/engine-{i}.ipc", slots=2) for i in range(2)]
    yield procs
    for p in procs:
        p.stop()


def endpoints(engines):
    return [p.args[p.args.index("--endpoint") + 1] for p in engines]


class Client:
    """A client of RemoteEngines: records events per context."""

    def __init__(self, remote):
        self.remote, self.events = remote, {}
        self.ended = {}
        self.id = remote.connect(self.deliver)

    def deliver(self, events):
        for ev in events:
            self.events.setdefault(ev.context, []).append(ev)
            if not isinstance(ev, AudioChunk):
                self.ended.setdefault(ev.context, asyncio.Event()).set()

    def say(self, context, text=TEXT, params=None, end=True):
        tok = self.remote.new_tokenizer()
        cmds = [OpenContext(context, params or ContextParams(sampling=GREEDY, fixed_frames=12)),
                AppendText(context, tuple(tok.feed(text)), text_seconds(text))]
        if end:
            cmds.append(EndText(context, tuple(tok.finish())))
        self.remote.submit(self.id, cmds)

    async def wait(self, context, timeout=60):
        await asyncio.wait_for(self.ended.setdefault(context, asyncio.Event()).wait(), timeout)
        return self.events[context][-1]

    def pcm(self, context):
        return np.concatenate([e.pcm for e in self.events[context] if isinstance(e, AudioChunk)])

    def frames(self, context):
        return sum(e.n_frames for e in self.events.get(context, ()) if isinstance(e, AudioChunk))

    def frame_numbers(self, context):
        return [f for e in self.events.get(context, ()) if isinstance(e, AudioChunk)
                for f in range(e.first_frame, e.first_frame + e.n_frames)]


@contextlib.asynccontextmanager
async def remote_engines(engines, worker, n=2, timeout=90):
    """A worker's RemoteEngines, started, once n engines have greeted it; closed however the test ends, so that its
    sockets are not left to the garbage collector (which the leak check counts as leaked: tests/leakcheck.py)."""
    remote = RemoteEngines(endpoints(engines), worker=worker)
    try:
        remote.start()
        deadline = time.monotonic() + timeout
        while sum(e.state == "ready" for e in remote.engines) < n:
            assert time.monotonic() < deadline, [e.state for e in remote.engines]
            await asyncio.sleep(0.05)
        yield remote
    finally:
        remote.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 180))


def test_remote_audio_equals_the_in_process_engine(engines, tiny_checkpoint):
    from talkgate.synth.engine import Engine
    from tests.speaker import Speaker
    local = Engine.from_pretrained(str(tiny_checkpoint), device="cpu", max_contexts=1)
    local.warm_up()
    speaker = Speaker(local)
    ctx = speaker.open(ContextParams(sampling=GREEDY, fixed_frames=12))
    speaker.append(ctx, TEXT)
    speaker.end(ctx)
    sink = speaker.sinks[ctx]
    while not sink.done.is_set():
        local.turn()
    ref = sink.pcm

    class Owner:                # a Link as the EngineClient sees one
        def __init__(self):
            self.events, self.done = [], asyncio.Event()

        def engine_event(self, ev):
            self.events.append(ev)
            if not isinstance(ev, AudioChunk):
                self.done.set()

    async def go():
        async with remote_engines(engines, worker=0) as remote:
            client = EngineClient(remote, asyncio.get_running_loop())       # a worker's path
            remote.hold = client.behind
            owner = Owner()
            tok = client.new_tokenizer()
            client.submit(owner, [OpenContext(1, ContextParams(sampling=GREEDY, fixed_frames=12)),
                                  AppendText(1, tuple(tok.feed(TEXT)), text_seconds(TEXT)),
                                  EndText(1, tuple(tok.finish()))])
            while not owner.events:
                await asyncio.sleep(0.005)
            time.sleep(0.4)              # the loop stops while steps go on: those queued meanwhile come joined
            await asyncio.wait_for(owner.done.wait(), 60)
            chunks = [e for e in owner.events if isinstance(e, AudioChunk)]
            assert owner.events[-1] == ContextDone(1, "length", 12)
            assert [f for e in chunks for f in range(e.first_frame, e.first_frame + e.n_frames)] == list(range(12))
            assert max(e.n_frames for e in chunks) > 1         # a context's frames of several steps joined
            assert all(0 < e.step_s < 60 for e in chunks)      # the engine's step crossed over with its audio
            refused = Owner()
            client.submit(refused, [OpenContext(2, ContextParams(voice="nobody"))])
            await asyncio.wait_for(refused.done.wait(), 60)
            assert refused.events[0].code == "unknown_voice"
            client.close()
            return np.concatenate([e.pcm for e in chunks])

    np.testing.assert_allclose(run(go()), ref, atol=1e-5)


def test_placement_by_free_slots_and_a_full_engine_is_retried(engines):
    """Two workers place at once with the same view (two engines of 2 slots): worker b sends two opens to an
    engine that has one slot left; the refused one is retried on the other engine and every context runs.
    A fifth context gets the capacity error."""
    async def go():
        async with remote_engines(engines, worker=1) as a, remote_engines(engines, worker=2) as b:
            ca, cb = Client(a), Client(b)
            long = ContextParams(sampling=GREEDY, fixed_frames=40)
            ca.say(1, params=long)
            for ctx in (1, 2, 3):
                cb.say(ctx, params=long)
            assert [e.opened for e in b.engines] == [2, 1]          # b's stale view
            results = [await ca.wait(1)] + [await cb.wait(ctx) for ctx in (1, 2, 3)]
            assert all(r == ContextDone(r.context, "length", 40) for r in results), results
            assert all(c.frames(ctx) == 40 for c, ctx in ((ca, 1), (cb, 1), (cb, 2), (cb, 3)))
            for ctx in (4, 5, 6, 7):                                    # open until their text ends
                cb.say(ctx, params=ContextParams(sampling=GREEDY, fixed_frames=100_000), end=False)
            await asyncio.sleep(0.5)
            cb.say(8)                                                   # all 4 slots taken
            assert (await cb.wait(8)).code == "engine_full"
            assert sorted(s["free_slots"] for s in b.stats()["engines"]) == [0, 0]
            b.disconnect(cb.id)                                         # frees them
            await asyncio.sleep(0.5)
            assert sorted(s["free_slots"] for s in a.stats()["engines"]) == [2, 2]

    run(go())


def test_a_worker_that_falls_behind_loses_only_its_own_contexts(engines):
    """The slow worker's event loop (a thread of its own here) stops for 2.5 s: the engine, which never
    waits, fails that worker's context (worker_behind) while the other worker is served meanwhile."""
    import threading
    started, outcome = threading.Event(), {}

    async def slow_worker():
        async with remote_engines(engines, worker=3) as slow:
            cs = Client(slow)
            cs.say(1, params=ContextParams(sampling=GREEDY, fixed_frames=100_000))
            while cs.frames(1) < 2:
                await asyncio.sleep(0.01)
            started.set()
            time.sleep(2.5)                                             # the loop is stuck: nothing read or acked
            outcome["last"] = await cs.wait(1)                          # its backlog, then the failure
            cs.say(2)                                                   # caught up: served again
            outcome["again"] = await cs.wait(2)

    thread = threading.Thread(target=lambda: run(slow_worker()))
    thread.start()

    async def fast_worker():
        async with remote_engines(engines, worker=4) as fast:
            cf = Client(fast)
            await asyncio.to_thread(started.wait, 120)
            cf.say(1, params=ContextParams(sampling=GREEDY, fixed_frames=60))
            assert await cf.wait(1) == ContextDone(1, "length", 60)    # served while the other is stuck

    try:
        run(fast_worker())
    finally:            # the slow worker ends within its own run()'s 180 s: a failure here does not leave it going
        thread.join(180)
    last = outcome["last"]
    assert isinstance(last, ContextFailed) and last.code == "worker_behind", last
    assert outcome["again"] == ContextDone(2, "length", 12)


def test_an_engine_held_for_seconds_does_not_blame_the_workers_that_kept_up(engines):
    """The engine process stopped (SIGSTOP) for 2.5 s, as a graph capture or the OS can hold its thread, while a
    context streams: its worker acknowledged what it got meanwhile, so nobody is behind and the context goes on;
    several times, so that some stops fall inside the engine's step."""
    async def go():
        async with remote_engines(engines, worker=6) as remote:
            c = Client(remote)
            c.say(1, params=ContextParams(sampling=GREEDY, fixed_frames=100_000))
            engine = engines[remote.engines.index(next(e for e in remote.engines if e.routes))]
            for _ in range(3):
                frames = c.frames(1)
                while c.frames(1) < frames + 2:
                    await asyncio.sleep(0.01)
                engine.proc.send_signal(signal.SIGSTOP)
                await asyncio.sleep(2.5)
                engine.proc.send_signal(signal.SIGCONT)
                await asyncio.sleep(0.3)
                assert 1 not in c.ended, c.events[1][-1]
            frames = c.frames(1)
            while c.frames(1) < frames + 5:                             # still streaming
                await asyncio.sleep(0.01)
            assert 1 not in c.ended
            remote.submit(c.id, [CancelContext(1)])

    run(go())


def test_an_open_sent_now_leaves_ahead_of_its_text(engines):
    """send_now writes what was submitted to the engine's socket before the loop turns (an HTTP request's open goes
    ahead of its text: server/http_speech.py); the text submitted next leaves at the turn's end, and the context runs
    as one submit of both would."""
    async def go():
        async with remote_engines(engines, worker=7) as remote:
            c = Client(remote)
            tok = remote.new_tokenizer()
            remote.submit(c.id, [OpenContext(1, ContextParams(sampling=GREEDY, fixed_frames=12))])
            (engine,) = [e for e in remote.engines if e.outbox]
            remote.send_now()
            assert engine.outbox == [] and not engine.out.pending           # written, nothing left for the turn
            remote.submit(c.id, [AppendText(1, tuple(tok.feed(TEXT)), text_seconds(TEXT)),
                                 EndText(1, tuple(tok.finish()))])
            assert len(engine.outbox) == 2                                  # the text waits for the turn's end
            assert await c.wait(1) == ContextDone(1, "length", 12) and c.frames(1) == 12

    run(go())


def test_a_killed_engine_fails_only_its_contexts_and_is_greeted_again(engines):
    async def go():
        async with remote_engines(engines, worker=5) as remote:
            c = Client(remote)
            for ctx in (1, 2):                                          # one on each engine
                c.say(ctx, params=ContextParams(sampling=GREEDY, fixed_frames=100 if ctx == 1 else 400))
            assert [len(e.routes) for e in remote.engines] == [1, 1]
            while c.frames(1) < 2 or c.frames(2) < 2:
                await asyncio.sleep(0.01)
            engines[1].kill()
            last = await c.wait(2)
            assert isinstance(last, ContextFailed) and last.code == "engine_failed"
            assert await c.wait(1) == ContextDone(1, "length", 100)    # the other engine's context is untouched
            assert remote.engines[1].state == "down" and remote.ready
            engines[1].start()
            deadline = time.monotonic() + 90
            while remote.engines[1].state != "ready":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            c.say(3, params=ContextParams(sampling=GREEDY, fixed_frames=20))
            c.say(4, params=ContextParams(sampling=GREEDY, fixed_frames=20))
            assert [len(e.routes) for e in remote.engines] == [1, 1]
            assert await c.wait(3) == ContextDone(3, "length", 20) and await c.wait(4) == ContextDone(4, "length", 20)

    run(go())
