"""Prometheus metrics of one server (its own registry: several servers in one process stay apart).

With gateway worker processes (`talkgate serve`) every worker writes its series to files in
PROMETHEUS_MULTIPROC_DIR (prometheus_client's multiprocess mode, chosen when that variable is set at start)
and renders all workers' files, so /metrics shows the whole server whichever worker answers: counters and
histograms summed, `talkgate_connections` and `talkgate_contexts_active` summed over live workers, the
`talkgate_worker_*` series and the event-loop lag per worker. The engine series (step time, slots, batch, audio
made) come from the stats every engine process publishes to every worker (EngineCollector), with an `engine`
label; a single-process server (`--workers 0`) has them without it.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time

from prometheus_client import (
    CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from talkgate.ipc.wire import STEP_BUCKETS
from talkgate.synth.request import FRAME_S

_MS_BUCKETS = (2, 5, 10, 15, 20, 30, 50, 75, 100, 150, 250, 500, 1000, 2500, 5000)
_WORKER_S_BUCKETS = (.0005, .001, .002, .005, .01, .02, .05, .1, .25, 1)    # a worker's loop lag and step delivery
# A wake-up of a worker's loop this late is logged with its time (at most one line a second): every connection of the
# worker waited that long, and a stream 320 ms ahead of its player runs dry (512 streams on an H200, docs/benchmarks.md)
LOOP_STALL_S = 0.1
# the protocol label of every front end (the label each passes to Gateway.new_session)
PROTOCOLS = ("openai", "native", "elevenlabs", "cartesia", "deepgram", "deepgram_v2", "dashscope", "twilio")
log = logging.getLogger("talkgate.metrics")
ENGINE_AUDIO_HELP = "Audio the engine made, seconds (80 ms a codec frame): rate() gives audio seconds per wall second"
ENGINE_PREFIX_HELP = ("New contexts whose prompt's prefix (its positions but the last: instructions, role, voice) could be "
                      "kept, by whether it was: kept (copied at the open, no prefill on the way to the first audio) or "
                      "prefilled (a prompt not seen lately, then kept); synth/runner.py")
ENGINE_LANE_HELP = ("New contexts whose open and first frame were launched on the first-frame lane, beside the step in "
                    "flight (synth/lane.py)")
ENGINE_FIRST_APART_HELP = ("Steps whose new contexts' prefill and first frame were launched as a pass of their own, "
                           "ahead of the running rows' (synth/engine.py first_frames_apart)")
ENGINE_FIRST_DECODES_HELP = ("Steps whose new contexts' first frames were decoded ahead of their running rows' (past the "
                             "lane's rows: synth/engine.py FIRST_DECODE_MAX_ROWS)")
ENGINE_KEEP_WARM_HELP = ("Touches of the GPU by the engine while idle (one small operation every serve --keep-warm "
                         "seconds without a step): the first audio after a quiet spell takes a warm launch path")
ENGINE_KV_FULL_HELP = ("Running contexts failed (engine_full) because no KV page was free for their next frame: more of "
                       "them grew long at once than the reserve admission keeps allows for (synth/pages.py)")
ENGINE_KV_PAGES_HELP = "The Talker's KV pages of 64 positions (synth/pages.py): contexts take them as they grow"
ENGINE_KV_FREE_HELP = ("KV pages no context holds; new contexts are refused (free slots 0) while no more are free than "
                       "one context's whole length, kept for the open ones' growth")
# counts an engine keeps in its stats (key -> metric name, help), each a counter per engine
ENGINE_COUNTS = {"lane_launches": ("talkgate_engine_lane_launches", ENGINE_LANE_HELP),
                 "first_apart_launches": ("talkgate_engine_first_apart_launches", ENGINE_FIRST_APART_HELP),
                 "first_decodes": ("talkgate_engine_first_decodes", ENGINE_FIRST_DECODES_HELP),
                 "keep_warm_touches": ("talkgate_engine_keep_warm_touches", ENGINE_KEEP_WARM_HELP),
                 "kv_full_failures": ("talkgate_engine_kv_full_failures", ENGINE_KV_FULL_HELP)}
ENGINE_SLOTS_FREE_HELP = "Engine slots a new context may take: not held by a context (0 while the KV pages have no room)"
ENGINE_GRAPHS_PENDING_HELP = ("CUDA graphs the engine captures after its warm-up, one at a time in a quiet moment: "
                              "each holds the engine up to seconds (on an H200 3 s), so first audio measured while any "
                              "are pending includes those holds (docs/operations.md)")
ENGINE_ROOF_HELP = ("The engine's steps at their roofline: the seconds their work (FLOPs and bytes counted from the model's "
                    "shapes, synth/roofline.py) takes at the GPU's datasheet peaks; over talkgate_engine_step_seconds_sum, "
                    "the share of the peak its steps achieve. Only for a GPU whose peaks are known (H100 SXM, H200)")


class Metrics:
    def __init__(self, worker: int = 0, engines=None):
        """worker: this process's worker index (the label of its loop lag); engines: a gateway worker's
        RemoteEngines, whose published stats become the engine series (None: an in-process engine, whose
        stats and step times the server reads itself)."""
        self.worker, self.multiprocess = str(worker), "PROMETHEUS_MULTIPROC_DIR" in os.environ
        self.engines = engines
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)
        self.connections = Gauge("talkgate_connections", "Open WebSocket connections", ["protocol"], registry=r,
                                 multiprocess_mode="livesum")
        self.contexts = Gauge("talkgate_contexts_active", "Contexts in flight (all protocols)", registry=r,
                              multiprocess_mode="livesum")
        self.contexts_total = Counter("talkgate_contexts_total", "Contexts started", ["protocol"], registry=r)
        for protocol in PROTOCOLS:          # each at 0 from the start: a series made by a context costs it 0.1 ms
            self.contexts_total.labels(protocol)
        self.ttfa = Histogram("talkgate_ttfa_ms", "Text ready to first audio sent, ms", buckets=_MS_BUCKETS, registry=r)
        self.frames = Counter("talkgate_frames_total", "Codec frames (80 ms) delivered", registry=r)
        self.audio_seconds = Counter("talkgate_audio_seconds_total", "Audio delivered, seconds", registry=r)
        self.underrun_risk = Counter("talkgate_underrun_risk_total",
                                     "Audio writes to a socket after a real-time player fed by the writes, "
                                     "started at the first, would have run dry", registry=r)
        self.finished = Counter("talkgate_contexts_finished_total", "Contexts ended", ["reason"], registry=r)
        self.cancels = Counter("talkgate_cancels_total", "Contexts cancelled by clients", registry=r)
        self.errors = Counter("talkgate_errors_total", "Errors answered: WebSocket error events and error "
                              "closes, HTTP error responses, refused connections", ["code"], registry=r)
        if engines is None:
            self.step_seconds = Histogram("talkgate_engine_step_seconds", "Engine step time", buckets=STEP_BUCKETS,
                                          registry=r)
            self.engine_running = Gauge("talkgate_engine_running", "Contexts in the engine's batch", registry=r)
            self.engine_waiting = Gauge("talkgate_engine_waiting", "Contexts waiting for text or a slot", registry=r)
            self.engine_slots = Gauge("talkgate_engine_slots", "Engine context slots", registry=r)
            self.engine_slots_free = Gauge("talkgate_engine_slots_free", ENGINE_SLOTS_FREE_HELP, registry=r)
            self.engine_kv_pages = Gauge("talkgate_engine_kv_pages", ENGINE_KV_PAGES_HELP, registry=r)
            self.engine_kv_pages_free = Gauge("talkgate_engine_kv_pages_free", ENGINE_KV_FREE_HELP, registry=r)
            self.engine_audio = Counter("talkgate_engine_audio_seconds", ENGINE_AUDIO_HELP, registry=r)
            self._engine_frames = 0             # the engine's frame count at the last scrape
            self.engine_roof = None             # a Counter once the engine reports its steps' roofline
            self._engine_roof_s = 0.0
            self.engine_prefixes = Counter("talkgate_engine_prompt_prefixes", ENGINE_PREFIX_HELP, ["found"],
                                           registry=r)
            self._engine_prefixes: dict[str, int] = {}
            # counts the engine keeps (its stats' keys): a counter takes what is new at each scrape
            self.engine_counts = {key: Counter(name, doc, registry=r) for key, (name, doc) in ENGINE_COUNTS.items()}
            self._engine_counted = dict.fromkeys(self.engine_counts, 0)
            self.engine_graphs_pending = Gauge("talkgate_engine_graphs_pending", ENGINE_GRAPHS_PENDING_HELP,
                                               registry=r)
        # for proxies and autoscalers (docs/deploy.md), set at each scrape (observe); over worker processes the
        # sessions add up and the load and drain flags are the largest any worker says
        self.engine_slots_used = Gauge("talkgate_engine_slots_used", "Engine slots held by a context", registry=r,
                                       multiprocess_mode="livemax")
        self.sessions = Gauge("talkgate_sessions_active", "Open WebSocket sessions, all protocols", registry=r,
                              multiprocess_mode="livesum")
        self.load = Gauge("talkgate_load", "Share of this server's capacity in use, 0-1: the larger of engine slots "
                          "used / slots and WebSocket sessions / --max-connections (a worker's share of them)",
                          registry=r, multiprocess_mode="livemax")
        self.draining = Gauge("talkgate_draining", "1 while the server drains (SIGTERM or POST /admin/drain)",
                              registry=r, multiprocess_mode="livemax")
        self.loop_lag = Histogram("talkgate_event_loop_lag_seconds", "Event-loop lag (late wake-ups), per worker",
                                  ["worker"], buckets=_WORKER_S_BUCKETS, registry=r)
        self._lag = self.loop_lag.labels(self.worker)
        self.step_delivery = Histogram("talkgate_engine_step_delivery_seconds", "From an engine process emitting a "
                                       "step's audio to a worker handling it (the socket and the worker's backlog), per worker",
                                       ["worker"], buckets=_WORKER_S_BUCKETS, registry=r)
        self.worker_connections = Gauge("talkgate_worker_connections", "Open WebSocket connections of a worker",
                                        ["worker"], registry=r, multiprocess_mode="livesum")
        self.worker_contexts = Gauge("talkgate_worker_contexts", "Contexts a worker has open in the engines",
                                     ["worker"], registry=r, multiprocess_mode="livesum")
        self.worker_cpu = Gauge("talkgate_worker_cpu_seconds", "CPU time of a worker process", ["worker"],
                                registry=r, multiprocess_mode="livesum")
        self.worker_cpu_wait = Gauge("talkgate_worker_cpu_wait_seconds", "Time a worker's event-loop thread was ready "
                                     "to run but waited for a CPU (Linux schedstat): its cores held by other processes",
                                     ["worker"], registry=r, multiprocess_mode="livesum")
        self.worker_gc = Gauge("talkgate_worker_gc_seconds", "Time a worker process paused in garbage collections",
                               ["worker"], registry=r, multiprocess_mode="livesum")
        self.worker_gc_max = Gauge("talkgate_worker_gc_pause_max_seconds", "A worker process's longest "
                                   "garbage-collection pause", ["worker"], registry=r, multiprocess_mode="livesum")

    def observe(self, stats: dict, sessions: int, max_sessions: int, draining: bool) -> None:
        """The gauges read at a scrape: `stats` the engine's (running, waiting, free_slots, slots; an in-process
        engine's gauges are set from them) or the engine processes' totals (RemoteEngines.stats), `sessions`
        the open WebSocket sessions of at most `max_sessions` (this process's)."""
        if self.engines is None:
            for gauge, key in ((self.engine_running, "running"), (self.engine_waiting, "waiting"),
                               (self.engine_slots, "slots"), (self.engine_slots_free, "free_slots"),
                               (self.engine_kv_pages, "kv_pages"), (self.engine_kv_pages_free, "free_kv_pages"),
                               (self.engine_graphs_pending, "graphs_pending")):
                if key in stats:
                    gauge.set(stats[key])
            if "frames" in stats:               # the engine counts frames; a counter only takes what is new
                self.engine_audio.inc((stats["frames"] - self._engine_frames) * FRAME_S)
                self._engine_frames = stats["frames"]
            if "step_roof_s" in stats:
                if self.engine_roof is None:
                    self.engine_roof = Counter("talkgate_engine_step_roof_seconds", ENGINE_ROOF_HELP,
                                               registry=self.registry)
                self.engine_roof.inc(stats["step_roof_s"] - self._engine_roof_s)
                self._engine_roof_s = stats["step_roof_s"]
            for found, n in stats.get("prompt_prefixes", {}).items():
                self.engine_prefixes.labels(found).inc(n - self._engine_prefixes.get(found, 0))
                self._engine_prefixes[found] = n
            for key, counter in self.engine_counts.items():
                if key in stats:
                    counter.inc(stats[key] - self._engine_counted[key])
                    self._engine_counted[key] = stats[key]
        load = sessions / max_sessions
        if stats.get("slots"):
            used = max(0, stats["slots"] - stats["free_slots"])
            self.engine_slots_used.set(used)
            load = max(load, used / stats["slots"])
        self.sessions.set(sessions)
        self.load.set(load)
        self.draining.set(int(draining))

    def render(self) -> bytes:
        if not self.multiprocess:
            return generate_latest(self.registry)
        from prometheus_client import multiprocess
        r = CollectorRegistry()
        multiprocess.MultiProcessCollector(r)
        ProcessCollector(registry=r)
        if self.engines is not None:
            r.register(EngineCollector(self.engines))
        return generate_latest(r)

    async def watch_loop_lag(self, interval: float = 0.05, sample=None) -> None:
        """Sleep `interval` repeatedly and record how late each wake-up is; every 10th wake-up call
        `sample()` (a worker's gauges)."""
        said = 0.0
        for tick in range(1 << 62):
            t = time.perf_counter()
            await asyncio.sleep(interval)
            now = time.perf_counter()
            lag = max(0.0, now - t - interval)
            self._lag.observe(lag)
            if lag >= LOOP_STALL_S and now - said >= 1.0:
                said = now
                log.warning("worker %s: its event loop woke %.0f ms late (every connection of the worker waited)",
                            self.worker, lag * 1000)
            if sample is not None and tick % 10 == 0:
                sample()


class EngineCollector:
    """The engine processes' series from the stats they published to this worker, labelled by engine."""

    def __init__(self, engines):
        self.engines = engines

    def collect(self):
        """Each series labelled by `engine` (its index); with several models served, by `model` too and `engine` its
        index among that model's (a server of one model keeps the series it always had)."""
        engines = self.engines.stats()["engines"]
        by_model = any("model" in e for e in engines)      # ModelEngines names each engine's model only then
        names = ["engine", "model"] if by_model else ["engine"]
        family = lambda name, doc: GaugeMetricFamily(name, doc, labels=names)
        ready = family("talkgate_engine_ready", "1 while the engine process is warm and connected")
        slots = family("talkgate_engine_slots", "Engine context slots")
        free = family("talkgate_engine_slots_free", ENGINE_SLOTS_FREE_HELP)
        kv_pages = family("talkgate_engine_kv_pages", ENGINE_KV_PAGES_HELP)
        kv_free = family("talkgate_engine_kv_pages_free", ENGINE_KV_FREE_HELP)
        running = family("talkgate_engine_running", "Contexts in the engine's batch")
        waiting = family("talkgate_engine_waiting", "Contexts waiting for text or a slot")
        cpu = family("talkgate_engine_cpu_seconds", "CPU time of the engine process")
        behind = family("talkgate_engine_workers_behind", "Workers whose contexts it fails (worker_behind)")
        step = HistogramMetricFamily("talkgate_engine_step_seconds", "Engine step time", labels=names)
        loop = CounterMetricFamily("talkgate_engine_loop_seconds", "The engine process's main loop by phase: receive "
                                   "(workers' messages), turn (steps and graph captures), peers (backlogs, stats), "
                                   "idle (waiting for messages)", labels=[*names, "phase"])
        gpu_wait = CounterMetricFamily("talkgate_engine_gpu_wait_seconds", "Time the engine's turns spent blocked "
                                       "on the GPU (a step's codes or PCM)", labels=names)
        cpu_wait = CounterMetricFamily("talkgate_engine_cpu_wait_seconds", "Time the engine's loop thread was ready to "
                                       "run but waited for a CPU (Linux schedstat): its cores held by other processes",
                                       labels=names)
        slow = CounterMetricFamily("talkgate_engine_slow_turns", "Turns of the engine loop over 40 ms (steps that can "
                                   "make a new context's second frame late; the log says where their time went)",
                                   labels=names)
        gc = CounterMetricFamily("talkgate_engine_gc_seconds", "Time the engine process paused in garbage "
                                 "collections", labels=names)
        gc_max = family("talkgate_engine_gc_pause_max_seconds", "The engine process's longest garbage-collection pause")
        gc_frozen = family("talkgate_engine_gc_frozen_objects", "Objects frozen out of the engine process's garbage "
                           "collections (gc.freeze after warm-up)")
        audio = CounterMetricFamily("talkgate_engine_audio_seconds", ENGINE_AUDIO_HELP, labels=names)
        roof = CounterMetricFamily("talkgate_engine_step_roof_seconds", ENGINE_ROOF_HELP, labels=names)
        prefixes = CounterMetricFamily("talkgate_engine_prompt_prefixes", ENGINE_PREFIX_HELP, labels=[*names, "found"])
        counts = {key: CounterMetricFamily(name, doc, labels=names) for key, (name, doc) in ENGINE_COUNTS.items()}
        pending = family("talkgate_engine_graphs_pending", ENGINE_GRAPHS_PENDING_HELP)
        index: dict[str | None, int] = {}              # model -> its engines so far
        for e in engines:
            model = e.get("model")
            label = [str(index.setdefault(model, 0)), *([model] if by_model else [])]
            index[model] += 1
            ready.add_metric(label, float(e["state"] == "ready"))
            if "slots" not in e:
                continue                                    # not heard from yet
            slots.add_metric(label, e["slots"])
            free.add_metric(label, e["free_slots"])
            if "kv_pages" in e:
                kv_pages.add_metric(label, e["kv_pages"])
                kv_free.add_metric(label, e["free_kv_pages"])
            running.add_metric(label, e["running"])
            waiting.add_metric(label, e["waiting"])
            cpu.add_metric(label, e.get("cpu_s", 0.0))
            behind.add_metric(label, e.get("workers_behind", 0))
            cum, buckets = 0, []
            for bound, n in zip((*map(str, STEP_BUCKETS), "+Inf"), e["step_buckets"]):
                cum += n
                buckets.append((bound, cum))
            step.add_metric(label, buckets, e["step_sum"])
            for phase, seconds in e.get("loop_s", {}).items():
                loop.add_metric([*label, phase], seconds)
            gpu_wait.add_metric(label, e.get("gpu_wait_s", 0.0))
            if e.get("cpu_wait_s") is not None:
                cpu_wait.add_metric(label, e["cpu_wait_s"])
            slow.add_metric(label, e.get("slow_turns", 0))
            gc.add_metric(label, e.get("gc_s", 0.0))
            gc_max.add_metric(label, e.get("gc_max_s", 0.0))
            gc_frozen.add_metric(label, e.get("gc_frozen", 0))
            audio.add_metric(label, e["frames"] * FRAME_S)
            if "step_roof_s" in e:
                roof.add_metric(label, e["step_roof_s"])
            for found, n in e.get("prompt_prefixes", {}).items():
                prefixes.add_metric([*label, found], n)
            for key, count in counts.items():
                count.add_metric(label, e.get(key, 0))
            pending.add_metric(label, e.get("graphs_pending", 0))
        yield from (ready, slots, free, kv_pages, kv_free, running, waiting, cpu, behind, step, loop, gpu_wait, cpu_wait, slow, gc, gc_max,
                    gc_frozen, audio, prefixes, *counts.values(), pending)
        if roof.samples:
            yield roof


class ContextObserver:
    """What a Session reports, turned into metrics; one per protocol label."""

    def __init__(self, metrics: Metrics, protocol: str):
        self.m, self.protocol = metrics, protocol

    def started(self) -> None:
        self.m.contexts.inc()
        self.m.contexts_total.labels(self.protocol).inc()

    def first_audio(self, ttfa_ms: float) -> None:
        self.m.ttfa.observe(ttfa_ms)

    def audio(self, frames: int) -> None:
        self.m.frames.inc(frames)
        self.m.audio_seconds.inc(frames * FRAME_S)

    def underrun_risk(self) -> None:
        self.m.underrun_risk.inc()

    def ended(self, reason: str) -> None:
        self.m.contexts.dec()
        self.m.finished.labels(reason).inc()
        if reason == "cancelled":
            self.m.cancels.inc()
