"""What every protocol translator offers the I/O layer (server/connection.py): the Sans-I/O surface of one client.

Two outputs, as websockets' protocol core keeps them: each call returns the wire actions for the client
(sessions/actions.py: Send, Purge, Close; the HTTP endpoints' Begin and Respond too), and `engine_commands()` hands
over the engine commands the session made meanwhile, in order, for the I/O layer to submit. The I/O layer takes the
commands after every call, one that raised included (a context that ended must still be cancelled in the engine).

    actions = protocol.receive_text(message)        # the client's frame
    commands = protocol.engine_commands()            # what the engine must do about it
    actions = protocol.engine_event(event)           # an event of one of the session's contexts
    protocol.note_sent(stream, audio_ms)             # audio of `stream` written to the socket
    protocol.note_delivered(stream, audio_ms)        # ... and taken by the client's TCP
    protocol.due_in()                                # None, or seconds until tick() has something to do

A translator raises only for a bug: client mistakes are its protocol's error messages. The I/O layer's error funnel
turns an exception into `abort`.
"""
from __future__ import annotations

from talkgate.sessions.actions import Action
from talkgate.sessions.session import Session
from talkgate.synth.api import EngineCommand, EngineEvent


class ClientProtocol:
    """One client's protocol onto one Session (`session`)."""

    session: Session
    idle_timeout_s: float | None = None     # the protocol's own inactivity timeout, if it has one

    def engine_commands(self) -> list[EngineCommand]:
        return self.session.take_commands()

    def note_sent(self, stream: int, audio_ms: float) -> None:
        self.session.note_sent(stream, audio_ms)

    def note_delivered(self, stream: int, audio_ms: float) -> None:
        self.session.note_delivered(stream, audio_ms)

    def engine_event(self, ev: EngineEvent) -> list[Action]:
        raise NotImplementedError

    def tick(self) -> list[Action]:
        """Called every fraction of a second, and when due_in() said: the session's clock (held first audio, slow
        consumers), the protocol's own."""
        raise NotImplementedError

    def due_in(self) -> float | None:
        """Seconds until tick() must be called sooner than its usual rate (the session's held first audio), or
        None; asked after every call."""
        return self.session.due_in()

    def idle_timeout(self) -> list[Action]:
        """No client message and no audio taken by the client for the idle timeout: close."""
        raise NotImplementedError

    def abort(self, code: str, message: str, ws_code: int) -> list[Action]:
        """The connection must end (an internal error, the message rate, a full outbox): say why, close, and end
        the session's contexts now."""
        raise NotImplementedError

    def connection_lost(self) -> list[Action]:
        """The socket is gone: the session's contexts end (their cancels among the engine commands)."""
        self.session.close()
        return []


class SocketProtocol(ClientProtocol):
    """A WebSocket's protocol: the client's frames too."""

    def ready(self) -> list[Action]:
        """The socket is open: the greeting, if the protocol has one."""
        raise NotImplementedError

    def receive_text(self, data: str) -> list[Action]:
        raise NotImplementedError

    def receive_binary(self, data: bytes) -> list[Action]:
        raise NotImplementedError
