"""A worker's side of an engine process's socket in tests that drive an EngineServer on their own thread."""
from __future__ import annotations

from talkgate.ipc import channel, wire
from talkgate.synth.api import ContextFailed


def read_steps(sock, reader: channel.Reader, out: channel.Outgoing, frames: dict, ends: dict) -> None:
    """The STEP messages waiting on `sock`: each context's frame numbers onto frames[context], each end's reason (a
    failure's code and message) into ends[context]; each STEP acknowledged, as a worker does."""
    while channel.receive(sock, reader):
        for parts in reader.messages():
            if bytes(parts[0]) != wire.STEP:
                continue
            seq, _, _, _, contexts, got, _, finished, _ = wire.read_step(parts[1], parts[2])
            for context, frame in zip(contexts.tolist(), got.tolist()):
                frames.setdefault(context, []).append(frame)
            for end in finished:
                event = wire.end_event(end)
                ends[end[0]] = f"{event.code}: {event.message}" if isinstance(event, ContextFailed) else event.reason
            assert out.send(wire.ack_message(seq))
