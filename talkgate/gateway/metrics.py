"""Prometheus metrics of one server (its own registry: several servers in one process stay apart)."""
from __future__ import annotations

import asyncio
import time

from prometheus_client import (
    CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest,
)

_MS_BUCKETS = (2, 5, 10, 15, 20, 30, 50, 75, 100, 150, 250, 500, 1000, 2500, 5000)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)
        self.connections = Gauge("talkgate_connections", "Open WebSocket connections", ["protocol"], registry=r)
        self.contexts = Gauge("talkgate_contexts_active", "Contexts in flight (all protocols)", registry=r)
        self.contexts_total = Counter("talkgate_contexts_total", "Contexts started", ["protocol"], registry=r)
        self.ttfa = Histogram("talkgate_ttfa_ms", "Text ready to first audio sent, ms", buckets=_MS_BUCKETS, registry=r)
        self.frames = Counter("talkgate_frames_total", "Codec frames (80 ms) delivered", registry=r)
        self.audio_seconds = Counter("talkgate_audio_seconds_total", "Audio delivered, seconds", registry=r)
        self.underrun_risk = Counter("talkgate_underrun_risk_total",
                                     "Audio chunks emitted after a real-time player started at the first "
                                     "sample would have run dry", registry=r)
        self.finished = Counter("talkgate_contexts_finished_total", "Contexts ended", ["reason"], registry=r)
        self.cancels = Counter("talkgate_cancels_total", "Contexts cancelled by clients", registry=r)
        self.errors = Counter("talkgate_errors_total", "Errors answered: WebSocket error events and error "
                              "closes, HTTP error responses, refused connections", ["code"], registry=r)
        self.step_seconds = Histogram("talkgate_engine_step_seconds", "Engine step time",
                                      buckets=(.001, .002, .003, .005, .0075, .01, .015, .02, .03, .04, .06, .1, .2, .5),
                                      registry=r)
        self.engine_running = Gauge("talkgate_engine_running", "Contexts in the engine's batch", registry=r)
        self.engine_waiting = Gauge("talkgate_engine_waiting", "Contexts waiting for text or a slot", registry=r)
        self.engine_slots = Gauge("talkgate_engine_slots", "Engine context slots", registry=r)
        self.engine_slots_free = Gauge("talkgate_engine_slots_free", "Engine slots not held by a context", registry=r)
        # for proxies and autoscalers (docs/deploy.md); set at each scrape, like the engine's gauges above
        self.engine_slots_used = Gauge("talkgate_engine_slots_used", "Engine slots held by a context", registry=r)
        self.sessions = Gauge("talkgate_sessions_active", "Open WebSocket sessions, all protocols", registry=r)
        self.load = Gauge("talkgate_load", "Share of this server's capacity in use, 0-1: the larger of engine slots "
                          "used / slots and WebSocket sessions / --max-connections", registry=r)
        self.draining = Gauge("talkgate_draining", "1 while the server drains (SIGTERM or POST /admin/drain)",
                              registry=r)
        self.loop_lag = Histogram("talkgate_event_loop_lag_seconds", "Event-loop lag (late wake-ups)",
                                  buckets=(.0005, .001, .002, .005, .01, .02, .05, .1, .25, 1), registry=r)

    def observe(self, stats: dict, sessions: int, max_sessions: int, draining: bool) -> None:
        """The gauges read at a scrape: `stats` the engine's (running, waiting, free_slots, slots; keys it
        lacks are left alone), `sessions` the open WebSocket sessions of at most `max_sessions`."""
        for gauge, key in ((self.engine_running, "running"), (self.engine_waiting, "waiting"),
                           (self.engine_slots, "slots"), (self.engine_slots_free, "free_slots")):
            if key in stats:
                gauge.set(stats[key])
        load = sessions / max_sessions
        if stats.get("slots"):
            used = stats["slots"] - stats["free_slots"]
            self.engine_slots_used.set(used)
            load = max(load, used / stats["slots"])
        self.sessions.set(sessions)
        self.load.set(load)
        self.draining.set(int(draining))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def watch_loop_lag(self, interval: float = 0.05) -> None:
        """Sleep `interval` repeatedly and record how late each wake-up is."""
        while True:
            t = time.perf_counter()
            await asyncio.sleep(interval)
            self.loop_lag.observe(max(0.0, time.perf_counter() - t - interval))


class ContextObserver:
    """What a Session reports, turned into metrics; one per protocol label."""

    def __init__(self, metrics: Metrics, protocol: str):
        self.m, self.protocol = metrics, protocol

    def started(self) -> None:
        self.m.contexts.inc()
        self.m.contexts_total.labels(self.protocol).inc()

    def first_audio(self, ttfa_ms: float) -> None:
        self.m.ttfa.observe(ttfa_ms)

    def audio(self, frames: int, late: bool) -> None:
        self.m.frames.inc(frames)
        self.m.audio_seconds.inc(frames * 0.08)
        if late:
            self.m.underrun_risk.inc()

    def ended(self, reason: str) -> None:
        self.m.contexts.dec()
        self.m.finished.labels(reason).inc()
        if reason == "cancelled":
            self.m.cancels.inc()
