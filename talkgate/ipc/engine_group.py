"""Several models' engines in one engine process (`talkgate serve --colocate`): one thread runs their EngineServers.

Engine processes that share a GPU each have a CUDA context of their own; under MPS their kernels run side by side,
but a stream's priority holds only within its process, so a model's first frame on its high-priority lane
(synth/lane.py) waits behind the other models' steps: three 1.7B models at 3 x 20 req/s, first audio p95 29-41 ms
against one model's 11 (docs/benchmarks.md). In one process the lane of every model is above every model's steps.

The loop turns each EngineServer once a round (its messages, one engine turn, its peers and stats), one with a new
context's first frame to make before the others left in the round (a context that could not take its lane waits
for one model's step, not for each model's before its own; first frames launched apart, as where an engine
process is alone on its GPU: the other models' steps take turns with its own on this thread); an engine's turn
waits for its step's codes, and while it waits (Engine.beside) every server's sockets are read and each other
engine takes its own turn beside it (Engine.beside_turn: a new context that fits launches on its lane, a first
frame that is done lands, decoded audio goes out), so a model's new context never waits for another model's
step. Between turns the same happens for every engine, and where nothing is to be done the loop waits on the one
poller of every server's sockets (or a moment, while a lane is in flight). A graph capture, which holds the thread
up to a second, waits until no model's contexts would notice (Engine.others_unnoticed). Warm-ups run one after the
other on this thread (torch.compile and graph captures from two threads at once are not safe) while a greeter
thread answers the workers of every server.

The price: the process is one failure domain. A model's step that fails fails that step's contexts, as ever; a
process that dies (a kill, a GPU fault) fails every model's contexts on it, and the supervisor starts it again
(docs/operations.md).
"""
from __future__ import annotations

import threading
import time

from talkgate.ipc.engine_server import EngineServer
from talkgate.synth.engine import LANE_POLL_S


class EngineGroup:
    def __init__(self, servers: list[EngineServer]):
        self.servers = servers
        self.poller = servers[0].poller
        for s in servers:
            s.engine.beside = lambda stepping=s: self._beside(stepping)
            s.engine.others_unnoticed = lambda now, me=s: all(
                o.engine.capture_unnoticed(now) for o in self.servers if o is not me)

    def _beside(self, stepping: EngineServer) -> None:
        if self.poller.poll(0):
            for s in self.servers:
                s.receive()
        for s in self.servers:
            if s is not stepping:
                s.engine.beside_turn()

    def warm_up(self, every_graph: bool = False) -> None:
        """Each engine's warm-up in turn on this thread while a helper thread answers every server's workers."""
        done = threading.Event()

        def greet():
            while not done.is_set():
                for s in self.servers:
                    s.turn(step=False)
                self.poller.poll(min(s.idle_ms() for s in self.servers))
        helper = threading.Thread(target=greet, name="talkgate-greeter", daemon=True)
        helper.start()
        warmed = []
        try:
            for s in self.servers:
                s.warm_engine(every_graph)
                warmed.append(s)
        finally:
            done.set()
            helper.join()            # the sockets are this thread's from here on
        for s in warmed:
            s.ready()

    def turn(self) -> bool:
        """Each server's turn, each engine's turn beside the others' after it; True where any had something to do.
        An engine with a first frame to make (Engine.first_frames_waiting: a new context that could not take its
        lane) steps before the others left in the round, so that the context waits for one model's step, not for
        each model's before its own."""
        busy = False
        left = list(self.servers)
        while left:
            if self.poller.poll(0):
                for s in self.servers:
                    s.receive()
            s = next((s for s in left if s.engine.first_frames_waiting), left[0])
            left.remove(s)
            busy = s.turn(step=True) or busy
            s.engine.beside_turn()
        return busy

    def serve(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if self.turn():
                continue
            if any(s.engine.lane_in_flight for s in self.servers):      # landed by a turn soon
                time.sleep(LANE_POLL_S)
                continue
            self.poller.poll(min(s.idle_ms() for s in self.servers))
            for s in self.servers:
                s.waited()

    def close(self) -> None:
        for s in self.servers:
            s.close()
