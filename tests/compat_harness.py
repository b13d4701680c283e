"""Drive a Sans-I/O protocol object (sessions/*.py) with a real engine and an outbox that behaves
like the gateway's: Send queues a frame, Purge drops the queued frames of a stream, Close ends it.

    h = Harness(tiny_engine, lambda session: ElevenLabsProtocol(session, ...))
    h.ready(); h.send({...}); h.pump(lambda m: m.get("isFinal")); frames = h.deliver()
"""
from __future__ import annotations

import json
import queue

from talkgate.sessions.limits import Limits
from talkgate.sessions.native import Close, Purge, Send
from talkgate.sessions.session import Session


class Harness:
    def __init__(self, engine, make, limits: Limits | None = None):
        self.events: queue.Queue = queue.Queue()
        # the outbox is drained only when a test says so: allow a whole utterance to wait in it
        limits = limits or Limits(max_text_chars=400, max_backlog_ms=60_000)
        self.session = Session(engine, self.events.put, limits)
        self.proto = make(self.session)
        self.outbox: list[Send] = []
        self.delivered: list = []       # JSON objects (dict) and binary frames (bytes), in order
        self.close: Close | None = None
        self.purged: list[int] = []

    def apply(self, actions: list) -> list:
        for a in actions:
            if isinstance(a, Send):
                if self.close is None:
                    self.outbox.append(a)
            elif isinstance(a, Purge):
                self.purged.append(a.stream)
                self.outbox = [s for s in self.outbox if s.stream != a.stream]
            elif isinstance(a, Close):
                self.close = self.close or a
            else:
                raise AssertionError(f"unknown action {a!r}")
        return actions

    def ready(self) -> list:
        return self.apply(self.proto.ready())

    def send(self, msg) -> list:
        return self.apply(self.proto.receive_text(msg if isinstance(msg, str) else json.dumps(msg)))

    def pump(self, until, timeout: float = 60) -> None:
        """Feed engine events until `until(message)` holds for a queued JSON message or the socket closes."""
        while not any(until(m) for m in self.queued()) and self.close is None:
            self.apply(self.proto.engine_event(self.events.get(timeout=timeout)))

    def pump_all(self, timeout: float = 0.5) -> None:
        """Feed whatever else the engine still sends within `timeout`."""
        try:
            while True:
                self.apply(self.proto.engine_event(self.events.get(timeout=timeout)))
        except queue.Empty:
            pass

    def queued(self) -> list:
        return [_load(s.data) for s in self.outbox]

    def deliver(self) -> list:
        """The socket writes everything queued: account it as sent, return it."""
        out = []
        for s in self.outbox:
            if s.stream is not None:
                self.proto.note_sent(s.stream, s.audio_ms)
            out.append(_load(s.data))
        self.outbox = []
        self.delivered += out
        return out


def _load(data):
    return json.loads(data) if isinstance(data, str) else data


def jsons(items: list) -> list[dict]:
    return [m for m in items if isinstance(m, dict)]
