"""Two models' engines in one loop (ipc/engine_group.py, `serve --colocate`) on the CPU: EngineServers around two
engines on the tiny checkpoint, sharing one poller, driven on the test's thread, and a worker's real local sockets
speaking ipc/wire.py's messages. A new context of one model that arrives while the other model's step runs takes its
lane during that step; one that cannot take a lane has its model step first in the next round; every context's
frames and end reach the worker as from an engine process of its own."""
from __future__ import annotations

import select

import pytest

from talkgate.ipc import channel, wire
from talkgate.ipc.engine_group import EngineGroup
from talkgate.ipc.engine_server import EngineServer
from talkgate.synth.api import AppendText, ContextParams, EndText, OpenContext, SamplingParams
from talkgate.synth.engine import Engine
from talkgate.synth.request import text_seconds
from tests.stepreader import read_steps

GREEDY = SamplingParams(greedy=True)
LONG = "Hello there, this is a streaming test. It has two sentences!"
SHORT = "A second voice starts here."


class TwoModels:
    """Two engines (with a lane each, or as `lanes` says) in one EngineGroup, and a worker's socket to each."""

    def __init__(self, checkpoint, tmp_path, lanes=(True, True)):
        self.engines = [Engine.from_pretrained(str(checkpoint), device="cpu", max_contexts=4,
                                               max_frames_per_context=80, lane=lane) for lane in lanes]
        poller = select.poll()
        self.servers = [EngineServer(eng, f"ipc://{tmp_path}/engine-{i}.ipc", i, str(checkpoint), poller=poller)
                        for i, eng in enumerate(self.engines)]
        self.group = EngineGroup(self.servers)
        self.socks = [channel.connect(s.endpoint) for s in self.servers]
        self.outs = [channel.Outgoing(sock) for sock in self.socks]
        self.readers = [channel.Reader() for _ in self.socks]
        self.frames: dict[int, list[int]] = {}
        self.ends: dict[int, str] = {}
        for out in self.outs:
            assert out.send(wire.hello_message(0, 1))
        for s in self.servers:
            s.turn(step=False)
        assert all(len(s.peers) == 1 for s in self.servers)

    def read(self) -> None:
        for sock, out, reader in zip(self.socks, self.outs, self.readers):
            read_steps(sock, reader, out, self.frames, self.ends)

    def say(self, model: int, context: int, text: str, n: int) -> None:
        tok = self.engines[model].new_tokenizer()
        cmds = [OpenContext(context, ContextParams(voice="ryan", sampling=GREEDY, fixed_frames=n)),
                AppendText(context, tuple(tok.feed(text)), text_seconds(text)), EndText(context, tuple(tok.finish()))]
        assert self.outs[model].send(wire.commands_message(0, [wire.command_to_wire(c) for c in cmds]))

    def turn(self) -> None:
        self.group.turn()
        self.read()

    def until(self, done) -> None:
        for _ in range(400):
            if done():
                return
            self.turn()
        raise AssertionError(f"frames {self.frames}, ends {self.ends}")

    def close(self) -> None:
        self.group.close()
        for sock in self.socks:
            sock.close()


@pytest.fixture
def two_models(tiny_checkpoint, tmp_path):
    made = []
    yield lambda lanes=(True, True): made.append(TwoModels(tiny_checkpoint, tmp_path, lanes)) or made[-1]
    for m in made:
        m.close()


def test_a_models_new_context_takes_its_lane_while_another_models_step_runs(two_models):
    m = two_models()
    m.say(1, 1, SHORT, 4)                                     # model 1's prompt prefix is kept from here on
    m.until(lambda: 1 in m.ends)
    m.say(0, 2, LONG, 30)                                     # model 0 speaks ...
    m.until(lambda: len(m.frames.get(2, ())) >= 4)
    before = m.engines[1].stats()["lane_launches"]
    m.say(1, 3, SHORT, 8)                                     # ... when model 1's new context comes
    m.engines[0].run_once()                                   # model 0's step: model 1's lane launches beside it
    assert m.engines[1].stats()["lane_launches"] == before + 1
    m.until(lambda: len(m.ends) == 3)
    assert m.frames == {1: list(range(4)), 2: list(range(30)), 3: list(range(8))}
    assert m.ends == {1: "length", 2: "length", 3: "length"}


def test_a_model_with_a_first_frame_to_make_steps_first_in_the_round(two_models):
    """Both models speak; a new context of the second model that cannot take a lane (it has none) comes between two
    rounds: in the next round the second model steps first, its new context's first frame in that step, then the first
    model; in a round without new contexts, the servers' order."""
    m = two_models(lanes=(True, False))
    steps: list[tuple[int, int]] = []                        # (model, rows) of each step, in order
    for i, eng in enumerate(m.engines):
        eng.on_step = lambda ms, rows, i=i, counted=eng.on_step: (steps.append((i, rows)), counted(ms, rows))
    m.say(0, 1, LONG, 12)
    m.say(1, 2, LONG, 12)
    m.until(lambda: len(m.frames.get(1, ())) >= 3 and len(m.frames.get(2, ())) >= 3)
    steps.clear()
    m.turn()
    assert [model for model, _ in steps] == [0, 1]
    m.say(1, 3, SHORT, 6)
    steps.clear()
    m.turn()
    assert steps == [(1, 2), (0, 1)]                         # model 1's running context and its new one, then 0
    m.until(lambda: len(m.ends) == 3)
    assert m.ends == {1: "length", 2: "length", 3: "length"}, m.ends
    assert m.frames == {1: list(range(12)), 2: list(range(12)), 3: list(range(6))}
