"""The first-frame lane (synth/lane.py) in an engine process's loop (ipc/engine_server.py) on the CPU: an
EngineServer around an engine on the tiny checkpoint, driven on the test's thread, and a worker's real local socket
speaking ipc/wire.py's messages."""
from __future__ import annotations

from talkgate.ipc import channel, engine_server, wire
from talkgate.ipc.engine_server import EngineServer
from talkgate.synth.api import AppendText, ContextParams, EndText, OpenContext, SamplingParams
from talkgate.synth.engine import Engine
from talkgate.synth.request import text_seconds
from tests.stepreader import read_steps

GREEDY = SamplingParams(greedy=True)
LONG = "Hello there, this is a streaming test. It has two sentences!"
SHORT = "A second voice starts here."


def test_an_engine_process_reads_its_workers_socket_during_a_step(tiny_checkpoint, tmp_path, monkeypatch):
    """An engine process (EngineServer around the engine, a worker's real socket): COMMANDS that reach the socket
    while a step runs are read during it (Engine.poll: EngineServer._poll), the new context takes the lane, and its
    audio and its end reach the worker in STEP messages like any context's."""
    # this thread is the worker too, acknowledging only between turns: on a loaded 2-core machine one turn of the
    # tiny model took over the 2-s lag limit, and the engine failed its own worker's contexts (worker_behind)
    monkeypatch.setattr(engine_server, "WORKER_LAG_LIMIT_S", 60.0)
    eng = Engine.from_pretrained(str(tiny_checkpoint), device="cpu", max_contexts=4, max_frames_per_context=80,
                                 lane=True)
    endpoint = f"ipc://{tmp_path}/engine-0.ipc"
    server = EngineServer(eng, endpoint, 0, str(tiny_checkpoint))
    sock = channel.connect(endpoint)
    out, reader = channel.Outgoing(sock), channel.Reader()
    frames: dict[int, list[int]] = {1: [], 2: []}
    ends: dict[int, str] = {}

    def read():
        read_steps(sock, reader, out, frames, ends)

    def say(context, text, params):
        tok = eng.new_tokenizer()
        cmds = [OpenContext(context, params), AppendText(context, tuple(tok.feed(text)), text_seconds(text)),
                EndText(context, tuple(tok.finish()))]
        assert out.send(wire.commands_message(0, [wire.command_to_wire(c) for c in cmds]))

    try:
        assert out.send(wire.hello_message(0, 1))
        server.turn(step=False)
        (peer,) = server.peers.values()
        say(1, LONG, ContextParams(voice="ryan", sampling=GREEDY, fixed_frames=30))
        while len(frames[1]) < 4:
            server.turn(step=True)
            read()
        eng._clients[peer.client].contexts[1].t_ready += 60.0           # a minute ahead: first_frames_apart holds
        before = eng.stats()["lane_launches"]
        say(2, SHORT, ContextParams(voice="ryan", sampling=GREEDY, fixed_frames=8))
        eng.run_once()              # the step whose wait reads the socket (a turn reads it first, before its step)
        assert eng.stats()["lane_launches"] == before + 1
        for _ in range(400):
            if len(ends) == 2:
                break
            server.turn(step=True)
            read()
        assert frames == {1: list(range(30)), 2: list(range(8))} and ends == {1: "length", 2: "length"}
    finally:
        server.close()
        sock.close()
