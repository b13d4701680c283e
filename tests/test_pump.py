"""The gateway's event pump: every event reaches its connection, in order, and the backlog it reports
(which holds the engine) counts events until the event loop has applied them."""
from __future__ import annotations

import asyncio
import threading

from talkgate.gateway import pump as pump_module
from talkgate.gateway.pump import EventPump


class Recorder:
    """A connection's two pump-facing calls: engine_event on the pump thread, apply on the loop."""

    def __init__(self, gate: threading.Event):
        self.gate, self.applied = gate, []

    def engine_event(self, ev):
        self.gate.wait(10)                   # the pump thread stalls here until the test opens the gate
        return [ev]

    def apply(self, actions):
        self.applied.extend(actions)


def test_backlog_holds_until_applied_and_nothing_is_dropped(monkeypatch):
    monkeypatch.setattr(pump_module, "MAX_BACKLOG", 5)

    async def scenario():
        gate = threading.Event()
        conn = Recorder(gate)
        p = EventPump(asyncio.get_running_loop())
        for i in range(8):
            p.put(conn, i)
        assert p.backlog() == 8 and p.behind()
        gate.set()
        for _ in range(200):
            if not p.backlog():
                break
            await asyncio.sleep(0.01)
        assert p.backlog() == 0 and not p.behind()
        assert conn.applied == list(range(8))
        p.stop()

    asyncio.run(scenario())
