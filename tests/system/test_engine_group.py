"""Two models' engines in one loop (ipc/engine_group.py, `serve --colocate`) on the CPU: EngineServers around two
engines on the tiny checkpoint, sharing one poller, driven on the test's thread, and a worker's real local sockets
speaking ipc/wire.py's messages. A new context of one model that arrives while the other model's step runs takes its
lane during that step; every context's frames and end reach the worker as from an engine process of its own."""
from __future__ import annotations

import select

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


def test_a_models_new_context_takes_its_lane_while_another_models_step_runs(tiny_checkpoint, tmp_path):
    engines = [Engine.from_pretrained(str(tiny_checkpoint), device="cpu", max_contexts=4, max_frames_per_context=80,
                                      lane=True) for _ in range(2)]
    poller = select.poll()
    servers = [EngineServer(eng, f"ipc://{tmp_path}/engine-{i}.ipc", i, str(tiny_checkpoint), poller=poller)
               for i, eng in enumerate(engines)]
    group = EngineGroup(servers)
    socks = [channel.connect(s.endpoint) for s in servers]
    outs, readers = [channel.Outgoing(sock) for sock in socks], [channel.Reader() for _ in socks]
    frames: dict[int, list[int]] = {}
    ends: dict[int, str] = {}

    def read():
        for sock, out, reader in zip(socks, outs, readers):
            read_steps(sock, reader, out, frames, ends)

    def say(model: int, context: int, text: str, n: int):
        tok = engines[model].new_tokenizer()
        cmds = [OpenContext(context, ContextParams(voice="ryan", sampling=GREEDY, fixed_frames=n)),
                AppendText(context, tuple(tok.feed(text)), text_seconds(text)), EndText(context, tuple(tok.finish()))]
        assert outs[model].send(wire.commands_message(0, [wire.command_to_wire(c) for c in cmds]))

    def until(done) -> None:
        for _ in range(400):
            if done():
                return
            group.turn()
            read()
        raise AssertionError(f"frames {frames}, ends {ends}")

    try:
        for out in outs:
            assert out.send(wire.hello_message(0, 1))
        for s in servers:
            s.turn(step=False)
        assert all(len(s.peers) == 1 for s in servers)
        say(1, 1, SHORT, 4)                                   # model 1's prompt prefix is kept from here on
        until(lambda: 1 in ends)
        say(0, 2, LONG, 30)                                   # model 0 speaks ...
        until(lambda: len(frames.get(2, ())) >= 4)
        before = engines[1].stats()["lane_launches"]
        say(1, 3, SHORT, 8)                                   # ... when model 1's new context comes
        engines[0].run_once()                                 # model 0's step: model 1's lane launches beside it
        assert engines[1].stats()["lane_launches"] == before + 1
        until(lambda: len(ends) == 3)
        assert frames == {1: list(range(4)), 2: list(range(30)), 3: list(range(8))}
        assert ends == {1: "length", 2: "length", 3: "length"}
    finally:
        group.close()
        for sock in socks:
            sock.close()
