"""End-to-end load generator for a running talkgate server: measures what its users experience.

    talkgate bench --url http://127.0.0.1:8080 --protocol openai --rps 5 --duration 30 --out results/x
    talkgate bench --protocol native --encoding opus --concurrency 256 --duration 60 --out results/c
    talkgate bench --protocol openai --sweep 1,2,5,10,20,40,60,80 --duration 30 --out results/s
    talkgate bench --dump-prompts > prompts.json

Open loop (`--rps`): Poisson arrivals at the target rate, independent of completions, so a slow server
meets the same offered load a real one would (a closed loop would slow down with it and hide queueing).
Fixed concurrency (`--concurrency N`): N clients, each starting its next request when the last one ends.
Time zero of a request is its first text byte sent. Every request records TTFB, first playable sample
(TTFA), end-to-end time, the gaps between audio chunks, and the underruns of a simulated real-time
player that starts at the first sample. Any error fails the run (exit status 1). docs/bench-load.md
explains every number.
"""
from __future__ import annotations

import asyncio
import bisect
import collections
import itertools
import json
import random
import re
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import aiohttp

from talkgate.ipc.wire import STATS_INTERVAL_S
from talkgate.loadgen import prompts as prompt_set
from talkgate.loadgen import report
from talkgate.loadgen.measure import (
    HEADER, histogram_delta, opus_packet_ms, parse_audio_header, parse_prometheus, poisson_arrivals, qwen_tokenizer,
    simulate_player, stats, text_slack, token_messages,
)
from talkgate.synth.request import frames_for_text   # the engine's documented text-length rule
from talkgate.system import descriptors, heap

ENCODING_CODES = {"opus": 1, "pcm_s16le": 2}
DEFAULT_RATE = {"opus": 48000, "pcm_s16le": 24000}
OPENAI_RATE = 24000                     # stream_format "audio" with response_format "pcm": s16le 24 kHz mono
READY_TIMEOUT_S = 10.0                  # native: connection accepted -> session.ready
CANCEL_POINT = (0.2, 0.8)               # a cancelled request is cancelled after this share of its audio
# a scrape waits this long first, so that the audio made before it is all in the engine processes' series: those
# are the stats they publish every STATS_INTERVAL_S, at the end of the turn running then
SCRAPE_SETTLE_S = 3 * STATS_INTERVAL_S
METRICS = ("ttfb_ms", "ttfa_ms", "e2e_ms", "rtf", "max_gap_ms", "underrun_ms", "connect_ms", "text_lag_ms",
           "server_ttfa_ms", "cancel_to_cancelled_ms", "cancel_to_last_audio_ms")


# ----------------------------------------------------------------------------- one request
@dataclass
class Job:
    """What one request will do, drawn from the seeded RNG before the run starts."""
    idx: int
    prompt: dict
    frames: int | None           # fixed_frames sent to the server (None: the model decides the length)
    cancel_at: float | None      # cancel after this share of the expected audio (None: never)


@dataclass
class Result:
    """Everything measured about one request; times in ms from its time zero (first text byte sent)."""
    idx: int
    prompt_id: str
    lang: str
    bucket: str
    chars: int
    frames_requested: int | None
    scheduled_s: float | None = None       # arrival offset in the Poisson schedule
    start_s: float | None = None           # time zero, seconds from the start of the run
    connect_ms: float | None = None        # connection set-up before time zero (not part of TTFA)
    text_done_ms: float | None = None      # native: last text delta and flush sent
    text_lag_ms: float | None = None       # native: the most a text delta went out after its scheduled time (the
                                           # client's own lag: text the server gets late can underrun any server)
    ttfb_ms: float | None = None           # first audio byte
    ttfa_ms: float | None = None           # first playable sample
    e2e_ms: float | None = None            # end of the stream (completed requests only)
    audio_ms: float = 0.0                  # audio received
    chunks: int = 0
    max_gap_ms: float | None = None
    gaps_ms: list = field(default_factory=list)
    underruns: int = 0
    underrun_ms: float = 0.0
    first_underrun_audio_ms: float | None = None   # audio played when the player first ran dry (80 ms a frame)
    rtf: float | None = None               # e2e / audio duration (completed requests only)
    server_ttfa_ms: float | None = None    # native `timing` event
    done_reason: str | None = None
    cancel_planned: bool = False
    cancel_sent_at_audio_ms: float | None = None
    cancel_to_cancelled_ms: float | None = None
    cancel_to_last_audio_ms: float | None = None
    stream_lead_s: float | None = None     # native: the server's stream lead (session.ready), None where off
    error: dict | None = None


class Timeline:
    """Audio arrivals of one request (perf_counter seconds, duration ms) and the first playable one."""

    def __init__(self):
        self.chunks: list[tuple[float, float]] = []
        self.audio_ms = 0.0                     # playable audio received so far
        self.first_byte: float | None = None
        self.first_playable: float | None = None

    def add(self, t: float, ms: float, playable: bool) -> None:
        if self.first_byte is None:
            self.first_byte = t
        if playable and self.first_playable is None:
            self.first_playable = t
        if self.first_playable is not None:
            self.chunks.append((t, ms))
            self.audio_ms += ms

    def record(self, r: Result, t0: float, until: float | None, tolerance_ms: float) -> None:
        """Fill r's audio numbers; chunks after `until` (a cancel) are not played."""
        ms = lambda t: (t - t0) * 1000
        played = [(ms(t), d) for t, d in self.chunks if until is None or t <= until]
        r.ttfb_ms = ms(self.first_byte) if self.first_byte is not None else None
        r.ttfa_ms = ms(self.first_playable) if self.first_playable is not None else None
        r.audio_ms, r.chunks = self.audio_ms, len(self.chunks)
        r.gaps_ms = [round(b[0] - a[0], 3) for a, b in itertools.pairwise(played)]
        r.max_gap_ms = max(r.gaps_ms) if r.gaps_ms else None
        r.underruns, r.underrun_ms, r.first_underrun_audio_ms = simulate_player(played, tolerance_ms)


class RequestError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


def expected_audio_ms(job: Job, prompt_text: str) -> float:
    return 80.0 * (job.frames if job.frames is not None else frames_for_text(prompt_text))


async def native_request(http: aiohttp.ClientSession, cfg: Config, job: Job, r: Result) -> None:
    """One utterance over the native WebSocket protocol: text streamed as token deltas, then flush."""
    text, now = job.prompt["text"], time.perf_counter
    t_connect = now()
    async with http.ws_connect(cfg.ws_url, headers=cfg.auth_headers(), heartbeat=None, autoping=True,
                               max_msg_size=16 * 1024 * 1024) as ws:
        try:
            msg = await ws.receive(timeout=READY_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise RequestError("no_session", f"no session.ready within {READY_TIMEOUT_S:.0f} s (the server waits "
                               "for an `auth` message when it needs an API key: --api-key)") from None
        ready = json.loads(msg.data) if msg.type == aiohttp.WSMsgType.TEXT else {}
        if ready.get("type") != "session.ready":
            raise RequestError("no_session", f"expected session.ready, got {msg.type.name} {str(msg.data)[:200]}")
        r.stream_lead_s = ready.get("limits", {}).get("stream_lead_s")
        r.connect_ms = (now() - t_connect) * 1000
        cid, rate = f"r{job.idx}", cfg.sample_rate
        start = {"type": "context.start", "context_id": cid, "language": job.prompt["language"],
                 "format": {"encoding": cfg.encoding, "sample_rate": rate}}
        if cfg.voice:
            start["voice"] = cfg.voice
        if cfg.instructions:
            start["instructions"] = cfg.instructions
        if job.frames is not None:
            start["fixed_frames"] = job.frames
        await ws.send_str(json.dumps(start))
        await asyncio.sleep(cfg.first_token_delay_ms / 1000)

        lock, state = asyncio.Lock(), {"cancel_sent": None}
        t0 = r.start_s = now()

        async def send_text():
            r.text_lag_ms = 0.0
            deltas = text_messages(text, cfg)
            for i, delta in enumerate(deltas):
                due = t0 + i / cfg.tokens_per_second if i else t0       # one delta when tokens_per_second is 0
                if i:
                    await asyncio.sleep(max(0.0, due - now()))
                async with lock:
                    if state["cancel_sent"] is not None:
                        return
                    await ws.send_str(json.dumps({"type": "text", "context_id": cid, **delta}))
                r.text_lag_ms = max(r.text_lag_ms, (now() - due) * 1000)
            async with lock:
                if state["cancel_sent"] is None:
                    await ws.send_str(json.dumps({"type": "flush", "context_id": cid}))
                    r.text_done_ms = (now() - t0) * 1000

        sender = asyncio.create_task(send_text())
        timeline, stream, next_seq = Timeline(), None, 0
        decoder = OpusProbe(rate) if cfg.encoding == "opus" else None
        cancel_after = None if job.cancel_at is None else job.cancel_at * expected_audio_ms(job, text)
        t_end = None
        try:
            while t_end is None:
                msg = await ws.receive()
                t = now()
                if msg.type == aiohttp.WSMsgType.BINARY:
                    enc, s, seq, _ = parse_audio_header(msg.data)
                    payload = msg.data[HEADER.size:]
                    if stream is None or s != stream:
                        raise RequestError("foreign_stream", f"audio for stream {s}, expected {stream}")
                    if enc != ENCODING_CODES[cfg.encoding]:
                        raise RequestError("wrong_encoding", f"audio encoding {enc}, asked for {cfg.encoding}")
                    if seq != next_seq:
                        raise RequestError("seq_gap", f"audio seq {seq}, expected {next_seq}")
                    next_seq += 1
                    if decoder is not None:
                        timeline.add(t, opus_packet_ms(payload), decoder.playable(payload))
                    else:
                        timeline.add(t, len(payload) / 2 / rate * 1000, len(payload) >= 2)
                    if cancel_after is not None and state["cancel_sent"] is None and timeline.audio_ms >= cancel_after:
                        async with lock:
                            state["cancel_sent"] = now()
                            await ws.send_str(json.dumps({"type": "cancel", "context_id": cid}))
                        r.cancel_sent_at_audio_ms = timeline.audio_ms
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    ev = json.loads(msg.data)
                    kind = ev.get("type")
                    if kind == "context.started":
                        stream = ev["stream"]
                    elif kind == "timing":
                        r.server_ttfa_ms = ev.get("ttfa_ms")
                    elif kind == "context.done":
                        t_end, r.done_reason = t, ev.get("reason")
                        if job.frames is not None and ev.get("frames") != job.frames:
                            raise RequestError("length_mismatch", f"context.done after {ev.get('frames')} "
                                               f"frames, asked for fixed_frames={job.frames}")
                    elif kind == "context.cancelled":
                        t_end, r.done_reason = t, "cancelled"
                        if state["cancel_sent"] is None:
                            raise RequestError("unexpected_cancel", "context.cancelled without a cancel")
                    elif kind == "error":
                        raise RequestError(ev.get("code", "error"), ev.get("message", ""))
                else:
                    raise RequestError("closed", f"connection ended ({msg.type.name}, {ws.close_code}) "
                                       "before the context finished")
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
    finish(r, timeline, t0, t_end, state["cancel_sent"], cfg)


async def openai_request(http: aiohttp.ClientSession, cfg: Config, job: Job, r: Result) -> None:
    """One utterance over the streaming OpenAI endpoint: the whole text up front, raw PCM back."""
    text, now = job.prompt["text"], time.perf_counter
    body = {"model": cfg.model, "input": text, "response_format": "pcm", "stream": True,
            "stream_format": "audio", "language": job.prompt["language"]}
    if cfg.voice:
        body["voice"] = cfg.voice
    if cfg.instructions:
        body["instructions"] = cfg.instructions
    if job.frames is not None:
        body["fixed_frames"] = job.frames
    sent: list[float] = []      # filled by the trace hook when the body's first byte is written
    t_post = now()
    timeline, cancel_sent, odd, t_end = Timeline(), None, 0, None
    cancel_after = None if job.cancel_at is None else job.cancel_at * expected_audio_ms(job, text)
    async with http.post(cfg.url + "/v1/audio/speech", json=body, headers=cfg.auth_headers(),
                         trace_request_ctx={"sent": sent}) as resp:
        t0 = r.start_s = sent[0] if sent else t_post
        r.connect_ms = (t0 - t_post) * 1000
        if resp.status != 200:
            detail = (await resp.text())[:300]
            raise RequestError(f"http_{resp.status}", detail)
        if resp.content_type != "audio/pcm":
            raise RequestError("wrong_content_type", f"content-type {resp.content_type}, expected audio/pcm")
        async for chunk in resp.content.iter_any():
            t = now()
            whole, odd = divmod(odd + len(chunk), 2)     # a sample split across chunks plays with the next
            timeline.add(t, whole / OPENAI_RATE * 1000, whole > 0)
            if cancel_after is not None and timeline.audio_ms >= cancel_after:
                cancel_sent = now()
                r.cancel_sent_at_audio_ms, r.done_reason = timeline.audio_ms, "disconnected"
                resp.close()        # a client that goes away: the server must cancel the work
                break
        else:
            t_end = now()
            r.done_reason = "complete"
            want = expected_audio_ms(job, text) if job.frames is not None else None
            if want is not None and abs(timeline.audio_ms - want) > 0.5:
                raise RequestError("length_mismatch", f"{timeline.audio_ms:.1f} ms of audio, "
                                   f"expected {want:.0f} ms for fixed_frames={job.frames}")
    finish(r, timeline, t0, t_end, cancel_sent, cfg)


def finish(r: Result, timeline: Timeline, t0: float, t_end: float | None, cancel_sent: float | None,
           cfg: Config) -> None:
    """Fill in a finished request's numbers (t_end: the end event; None for an HTTP cancel)."""
    timeline.record(r, t0, cancel_sent, cfg.underrun_tolerance_ms)
    if timeline.first_playable is None and cancel_sent is None:
        raise RequestError("no_audio", "the stream ended without any audio")
    if cancel_sent is None:
        r.e2e_ms = (t_end - t0) * 1000
        r.rtf = r.e2e_ms / r.audio_ms if r.audio_ms else None
    else:
        if t_end is not None:
            r.cancel_to_cancelled_ms = (t_end - cancel_sent) * 1000
            last = max((t for t, _ in timeline.chunks), default=cancel_sent)
            r.cancel_to_last_audio_ms = max(0.0, (last - cancel_sent) * 1000)


class OpusProbe:
    """Decodes packets only until the first one decodes: that is the first playable sample."""

    def __init__(self, rate: int):
        import opuslib
        self.decoder, self.rate, self.ok = opuslib.Decoder(rate, 1), rate, False
        self.undecodable = (opuslib.OpusError, ValueError)

    def playable(self, packet: bytes) -> bool:
        if not self.ok:
            try:
                self.decoder.decode(packet, int(self.rate * opus_packet_ms(packet) / 1000))
                self.ok = True
            except self.undecodable:
                return False
        return True


# ----------------------------------------------------------------------------- monitors
class GpuMonitor:
    """Samples `nvidia-smi` utilisation and memory every 500 ms in a background thread (when present)."""

    def __init__(self):
        self.samples: list[tuple[float, float]] = []
        self.proc = None
        self.thread = None

    def start(self) -> GpuMonitor:
        exe = shutil.which("nvidia-smi")
        if exe:
            self.proc = subprocess.Popen([exe, "--query-gpu=utilization.gpu,memory.used",
                                          "--format=csv,noheader,nounits", "-lms", "500"],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.thread = threading.Thread(target=self._read, daemon=True)
            self.thread.start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                util, mem = (float(x) for x in line.split(",")[:2])
            except ValueError:
                continue
            self.samples.append((util, mem))

    def stop(self) -> dict | None:
        if self.proc is None:
            return None
        self.proc.terminate()
        self.proc.wait(5)
        self.thread.join(5)
        if not self.samples:
            return None
        utils = [u for u, _ in self.samples]
        return {"samples": len(utils), "util_mean_pct": sum(utils) / len(utils), "util_max_pct": max(utils),
                "mem_max_mib": max(m for _, m in self.samples)}


async def watch_loop_lag(lags: list[float], interval: float = 0.02) -> None:
    """The client's own event-loop lag: a saturated client would inflate every latency it measures."""
    while True:
        t = time.perf_counter()
        await asyncio.sleep(interval)
        lags.append(max(0.0, time.perf_counter() - t - interval) * 1000)


async def scrape(http: aiohttp.ClientSession, cfg: Config) -> dict:
    await asyncio.sleep(SCRAPE_SETTLE_S)
    try:
        async with http.get(cfg.url + "/metrics", headers=cfg.auth_headers()) as resp:
            return parse_prometheus(await resp.text()) if resp.status == 200 else {}
    except aiohttp.ClientError:
        return {}


def _series_key(labels: dict, label: str) -> str:
    """A series' name in a by-engine table: its `label` value, and its model's name before it where the server
    serves several models (their engines are numbered per model: engine 0 of each)."""
    return f"{labels['model']}/{labels[label]}" if "model" in labels else labels[label]


def _process_key(labels: dict, kind: str) -> str:
    """A process's name in a by-process table: worker3, engine0; an engine of a server of several models by its model
    too (engine cv/0: each model's engines are numbered from 0, so engine0 would name three processes)."""
    return f"engine {_series_key(labels, kind)}" if kind == "engine" and "model" in labels else f"{kind}{labels[kind]}"


def server_numbers(before: dict, after: dict, wall_s: float, model: str | None = None) -> dict:
    """What /metrics says about the run; series the server does not expose come out as None. `model`: the run's
    model, where the server serves several (its engines' series carry a `model` label): the first frames made on
    the lane, the audio made and the steps' roofline share are those of its engines, the run's own requests' (the
    other models' loads are not this run's)."""
    cpu = [m.get(("process_cpu_seconds_total", ())) for m in (before, after)]
    counter = lambda name: (sum(v for (n, _), v in after.items() if n == name)
                            - sum(v for (n, _), v in before.items() if n == name)) if any(
                                n == name for n, _ in after) else None
    # a run naming one of several served models: its model's engines' series (the other models' are other runs')
    run_model = model if any(("model", model) in labels for _, labels in after) else None
    of_run = lambda labels: run_model is None or ("model", run_model) in labels
    def model_counter(name: str) -> float | None:
        """counter(name) over the run's model's series (every engine's for a one-model server, or a run not naming
        one of the served models)."""
        total = lambda m: sum(v for (n, labels), v in m.items() if n == name and of_run(labels))
        return total(after) - total(before) if any(n == name for n, _ in after) else None
    def increase(key, v: float) -> float | None:
        """A cumulative series' increase over the run, per wall second (None for a process restarted meanwhile,
        which counts from 0, or one not seen before the run)."""
        start = before.get(key)
        return (v - start) / wall_s if start is not None and v >= start and wall_s > 0 else None

    # with worker processes: CPU and garbage-collection pauses per process (their gauges and counters), loop lag
    # per worker and step time per engine
    def per_process(worker_series: str, engine_series: str) -> dict:
        shares = {}
        for name, kind in ((worker_series, "worker"), (engine_series, "engine")):
            for (n, labels), v in after.items():
                if n == name and (share := increase((n, labels), v)) is not None:
                    shares[_process_key(dict(labels), kind)] = share
        return shares
    cores = per_process("talkgate_worker_cpu_seconds", "talkgate_engine_cpu_seconds")
    gc_share = per_process("talkgate_worker_gc_seconds", "talkgate_engine_gc_seconds_total")
    cpu_wait = per_process("talkgate_worker_cpu_wait_seconds", "talkgate_engine_cpu_wait_seconds_total")
    gc_longest = {_process_key(dict(labels), kind): v for (n, labels), v in after.items() for kind in ("worker", "engine")
                  if n == f"talkgate_{kind}_gc_pause_max_seconds"}
    def by(name: str, label: str) -> dict:
        """A histogram's delta per value of `label` (per engine of each model where a server serves several)."""
        out = {}
        for n, labels in after:
            d = dict(labels)
            if n == name + "_count" and label in d:
                only = {k: d[k] for k in (label, "model") if k in d}
                out[_series_key(d, label)] = histogram_delta(before, after, name, **only)
        return out
    # the engine processes' loop: each phase's share of the run's wall time, summed over the engines
    loop = {}
    for (n, labels), v in after.items():
        if n in ("talkgate_engine_loop_seconds_total", "talkgate_engine_gpu_wait_seconds_total"):
            share = increase((n, labels), v)
            if share is not None:
                phase = dict(labels).get("phase", "gpu_wait")
                loop[phase] = loop.get(phase, 0.0) + share
    # the headline figure: audio the engines made per wall second, each (`engine` label; none with `--workers 0`)
    # and in all
    audio = {labels: rate for (n, labels), v in after.items() if n == "talkgate_engine_audio_seconds_total"
             and of_run(labels) and (rate := increase((n, labels), v)) is not None}
    # beside it, the share of the GPU's peak the engines' steps achieved: their roofline seconds over their step time
    # (engines on a GPU whose peaks the server knows: synth/roofline.py)
    roof, stepped = {}, {}
    for (n, labels), v in after.items():
        step_key = ("talkgate_engine_step_seconds_sum", labels)
        if n == "talkgate_engine_step_roof_seconds_total" and step_key in after and of_run(labels):
            r, t = increase((n, labels), v), increase(step_key, after[step_key])
            if r is not None and t:
                roof[labels], stepped[labels] = r, t
    total = sum(cores.values()) if cores else None
    return {"cpu_cores": total if total is not None else
            (cpu[1] - cpu[0]) / wall_s if None not in cpu and wall_s > 0 else None,
            "cpu_cores_by_process": cores or None,
            "event_loop_lag_s": histogram_delta(before, after, "talkgate_event_loop_lag_seconds"),
            "event_loop_lag_s_by_worker": by("talkgate_event_loop_lag_seconds", "worker") or None,
            "engine_step_s": histogram_delta(before, after, "talkgate_engine_step_seconds"),
            "engine_step_s_by_engine": by("talkgate_engine_step_seconds", "engine") or None,
            "engine_audio_s_per_wall_s": sum(audio.values()) if audio else None,
            "engine_audio_s_per_wall_s_by_engine": {_series_key(dict(labels), "engine"): rate
                                                    for labels, rate in audio.items() if labels} or None,
            "engine_roofline_fraction": sum(roof.values()) / sum(stepped.values()) if roof else None,
            "engine_roofline_fraction_by_engine": {_series_key(dict(labels), "engine"): roof[labels] / stepped[labels]
                                                   for labels in roof if labels} or None,
            "engine_loop_share": loop or None,
            "step_delivery_s": histogram_delta(before, after, "talkgate_engine_step_delivery_seconds"),
            "gc_share_by_process": gc_share or None,
            "gc_longest_s_by_process": gc_longest or None,
            "cpu_wait_share_by_process": cpu_wait or None,
            "engine_slow_turns": counter("talkgate_engine_slow_turns_total"),
            "engine_lane_launches": model_counter("talkgate_engine_lane_launches_total"),
            "engine_first_decodes": model_counter("talkgate_engine_first_decodes_total"),
            # graphs still to capture at the run's start and end: the engine's captures then held it up to seconds
            "engine_graphs_pending": [sum(v for (n, _), v in m.items() if n == "talkgate_engine_graphs_pending")
                                      for m in (before, after)] if any(
                n == "talkgate_engine_graphs_pending" for n, _ in after) else None,
            "server_ttfa_ms": histogram_delta(before, after, "talkgate_ttfa_ms"),
            "underrun_risk": counter("talkgate_underrun_risk_total"),
            "contexts_active_after": after.get(("talkgate_contexts_active", ())),   # a leak shows here
            "errors": counter("talkgate_errors_total")}


# ----------------------------------------------------------------------------- a run
@dataclass
class Config:
    url: str = "http://127.0.0.1:8080"
    protocol: str = "openai"
    rps: float | None = None
    concurrency: int | None = None
    duration_s: float = 30.0
    requests: int | None = None            # stop issuing after this many
    lang: str = "all"
    bucket: str = "all"
    length: str = "text"                   # "text": fixed_frames = frames_for_text; "model": the server decides
    cancel_share: float = 0.0
    encoding: str = "pcm_s16le"
    sample_rate: int = 24000
    tokens_per_second: float = 25.0        # native: LLM tokens (Qwen's) a second; 0: the whole text at once
    token_ids: bool = False                # native, streamed: each token as its id (`ids`), not its text
    first_token_delay_ms: float = 0.0
    voice: str | None = None
    instructions: str | None = None        # a VoiceDesign model's voice description, or a style to speak in
    model: str = "talkgate"
    api_key: str | None = None
    max_in_flight: int = 512
    request_timeout_s: float = 180.0
    underrun_tolerance_ms: float = 1.0
    ttfa_limit_ms: float = 150.0
    seed: int = 0
    processes: int = 1                     # client processes the load is split over
    ramp_s: float = 0.0                    # closed loop: client i of N starts at i / N of this (0: all at once)
    ramp_offset: float = 0.0               # this process's clients' place among all clients' starts (0-1)

    @property
    def ws_url(self) -> str:
        return re.sub(r"^http", "ws", self.url) + "/v1/ws"

    def auth_headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def job_stream(cfg: Config, rng: random.Random):
    """Jobs drawn from the seeded RNG, one after another, for as long as they are asked for."""
    pool = prompt_set.select(cfg.lang, cfg.bucket)
    for i in itertools.count():
        p = pool[rng.randrange(len(pool))]
        cancel = rng.uniform(*CANCEL_POINT) if rng.random() < cfg.cancel_share else None
        yield Job(i, p, frames_for_text(p["text"]) if cfg.length == "text" else None, cancel)


async def run_one(http, cfg: Config, job: Job, t_run: float, scheduled: float | None) -> Result:
    r = Result(job.idx, job.prompt["id"], job.prompt["lang"], job.prompt["bucket"], len(job.prompt["text"]),
               job.frames, scheduled_s=scheduled, cancel_planned=job.cancel_at is not None)
    client = native_request if cfg.protocol == "native" else openai_request
    try:
        await asyncio.wait_for(client(http, cfg, job, r), cfg.request_timeout_s)
    except RequestError as e:
        r.error = {"code": e.code, "message": e.message}
    except asyncio.TimeoutError:
        r.error = {"code": "timeout", "message": f"no end within {cfg.request_timeout_s} s"}
    except (aiohttp.ClientError, OSError, ValueError) as e:
        r.error = {"code": "client_error", "message": f"{type(e).__name__}: {e}"}
    if r.start_s is not None:
        r.start_s -= t_run
    return r


async def _mark_sent(session, ctx, params) -> None:
    """Trace hook: the time the first byte of a request body was written (time zero over HTTP)."""
    if ctx.trace_request_ctx and not ctx.trace_request_ctx["sent"]:
        ctx.trace_request_ctx["sent"].append(time.perf_counter())


def client_session(cfg: Config) -> aiohttp.ClientSession:
    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(_mark_sent)
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=cfg.max_in_flight, limit_per_host=cfg.max_in_flight),
        trace_configs=[trace], timeout=aiohttp.ClientTimeout(total=None, sock_connect=30))


async def warm_up(cfg: Config, n: int) -> list[Result]:
    """n short requests one after another before any measurement (first-use costs); -> their results."""
    warm = replace(cfg, bucket="short", cancel_share=0.0, seed=cfg.seed + 1)
    jobs = job_stream(warm, random.Random(warm.seed))
    async with client_session(cfg) as http:
        return [await run_one(http, warm, next(jobs), time.perf_counter(), None) for _ in range(n)]


async def run_load(cfg: Config) -> dict:
    """One run at a fixed offered load -> {"config", "summary", "requests"}; with cfg.processes > 1 the load is
    split over that many client processes (each its share of the rate or clients, its own seed), whose
    results are merged, so that a saturated client does not inflate what it measures."""
    read_tokenizer(cfg)
    async with client_session(cfg) as http:
        before = await scrape(http, cfg)
        gpu = GpuMonitor().start()
        try:
            if cfg.processes > 1:
                parts = await asyncio.to_thread(_drive_in_processes, cfg)
            else:
                parts = [await drive(cfg, http)]
        finally:
            gpu_stats = gpu.stop()
        after = await scrape(http, cfg)
    results, offset = [], 0
    for part in parts:                                   # one process's job indices follow the previous one's
        for r in part["results"]:
            r.idx += offset
        results += part["results"]
        offset = 1 + max((r.idx for r in results), default=-1)
    wall_s = max(p["wall_s"] for p in parts)
    windows = [p["issue_window"] for p in parts]
    issue_window = None if None in windows else max(windows)
    lags = [v for p in parts for v in p["lags"]]
    results.sort(key=lambda r: r.idx)
    summary = summarize(cfg, results, wall_s, issue_window, sum(p["peak"] for p in parts),
                        server_numbers(before, after, wall_s, cfg.model), gpu_stats, lags)
    return {"config": asdict(cfg), "summary": summary, "requests": [asdict(r) for r in results]}


def text_messages(text: str, cfg: Config) -> list[dict]:
    """A native request's `text` messages' contents: the whole text (tokens_per_second 0), one Qwen token's text each
    (as an LLM streams), or one token id each (token_ids: a client whose LLM speaks Qwen's tokenizer)."""
    return token_messages(text, cfg.token_ids) if cfg.tokens_per_second > 0 else [{"text": text}]


def read_tokenizer(cfg: Config) -> None:
    """Read the tokenizer files of the text deltas now: inside the first request they would stall the event
    loop, and every stream on it, for half a second."""
    if cfg.protocol == "native" and cfg.tokens_per_second > 0:
        qwen_tokenizer()


def _share(cfg: Config, k: int) -> Config:
    """Client process k's part of the load."""
    n = cfg.processes
    return replace(cfg, processes=1, seed=cfg.seed + 1000 * k, rps=cfg.rps / n if cfg.rps else None,
                   ramp_offset=k / n,
                   concurrency=cfg.concurrency // n + (k < cfg.concurrency % n) if cfg.concurrency else None,
                   requests=None if cfg.requests is None else cfg.requests // n + (k < cfg.requests % n),
                   max_in_flight=max(1, cfg.max_in_flight // n))


def _drive_in_processes(cfg: Config) -> list[dict]:
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    start_at = time.time() + 3.0                         # every process starts its clock together
    with ctx.Pool(cfg.processes) as pool:
        return pool.starmap(_drive_process, [(asdict(_share(cfg, k)), start_at) for k in range(cfg.processes)])


def _drive_process(cfg_dict: dict, start_at: float) -> dict:
    cfg = Config(**cfg_dict)
    read_tokenizer(cfg)             # before the common start, so that this process does not start late

    async def go():
        async with client_session(cfg) as http:
            await asyncio.sleep(max(0.0, start_at - time.time()))
            return await drive(cfg, http)
    return asyncio.run(go())


async def drive(cfg: Config, http) -> dict:
    """Issue one run's requests (open or closed loop) -> results, wall time, issue window, peak, client lags."""
    rng = random.Random(cfg.seed)
    arrivals = poisson_arrivals(cfg.rps, cfg.duration_s, rng, cfg.requests) if cfg.rps else None
    jobs = itertools.islice(job_stream(cfg, rng), cfg.requests)
    results: list[Result] = []
    in_flight = {"now": 0, "peak": 0}
    lags: list[float] = []
    # Before the run's first connection, two stalls of every stream here (underruns that are the client's) away:
    # room for all its connections (a descriptor table that grows mid-run stalls the loop tens of ms at 64 and 128
    # sockets, talkgate/system/descriptors.py), and what this process holds (the tokenizer's tables, the modules) out of
    # the garbage collector (a full collection walked it in 25-40 ms, measured, at the ramp's end)
    descriptors.reserve(max(cfg.concurrency or 0, cfg.max_in_flight) + descriptors.SPARE)
    heap.freeze("bench client")

    async def tracked(job, t_run, scheduled):
        in_flight["now"] += 1
        in_flight["peak"] = max(in_flight["peak"], in_flight["now"])
        try:
            results.append(await run_one(http, cfg, job, t_run, scheduled))
        finally:
            in_flight["now"] -= 1

    lag_task = asyncio.create_task(watch_loop_lag(lags))
    t_run = time.perf_counter()
    tasks: list[asyncio.Task] = []
    try:
        if arrivals is not None:
            for job, at in zip(jobs, arrivals):
                await asyncio.sleep(max(0.0, t_run + at - time.perf_counter()))
                if in_flight["now"] >= cfg.max_in_flight:
                    results.append(Result(job.idx, job.prompt["id"], job.prompt["lang"], job.prompt["bucket"],
                                          len(job.prompt["text"]), job.frames, scheduled_s=at, error={
                                              "code": "client_cap", "message": f"{cfg.max_in_flight} requests "
                                              "already in flight: the server is not keeping up"}))
                    continue
                tasks.append(asyncio.create_task(tracked(job, t_run, at)))
            truncated = cfg.requests is not None and len(arrivals) == cfg.requests
            issue_window = arrivals[-1] if truncated else cfg.duration_s
        else:
            async def worker(i: int):
                # interleaved with the other processes' clients: together one start every ramp / N seconds
                await asyncio.sleep(cfg.ramp_s * (i + cfg.ramp_offset) / cfg.concurrency)
                while time.perf_counter() - t_run < cfg.duration_s:
                    job = next(jobs, None)
                    if job is None:
                        return
                    await tracked(job, t_run, None)

            tasks = [asyncio.create_task(worker(i)) for i in range(cfg.concurrency)]
            issue_window = None
        await asyncio.gather(*tasks)     # each request is bounded by request_timeout_s
    finally:
        for t in tasks:
            t.cancel()
        wall_s = time.perf_counter() - t_run
        lag_task.cancel()
    return {"results": results, "wall_s": wall_s, "issue_window": issue_window, "peak": in_flight["peak"],
            "lags": lags}


def summarize(cfg: Config, results: list[Result], wall_s: float, issue_window: float | None, peak: int,
              server: dict, gpu: dict | None, lags: list[float]) -> dict:
    ok = [r for r in results if r.error is None]
    errors: dict[str, int] = {}
    for r in results:
        if r.error:
            errors[r.error["code"]] = errors.get(r.error["code"], 0) + 1
    metrics = {name: stats([getattr(r, name) for r in ok]) for name in METRICS}
    metrics["gap_ms"] = stats([g for r in ok for g in r.gaps_ms])
    underruns = sum(r.underruns for r in ok)
    ttfa = metrics["ttfa_ms"]
    clean = not errors and underruns == 0 and ttfa is not None and ttfa["p95"] <= cfg.ttfa_limit_ms
    return {
        "mode": "rps" if cfg.rps else "concurrency", "load": cfg.rps or cfg.concurrency,
        "requests": len(results), "completed": sum(1 for r in ok if r.cancel_sent_at_audio_ms is None),
        "cancelled": sum(1 for r in ok if r.cancel_sent_at_audio_ms is not None), "errors": errors,
        "wall_s": wall_s,
        "achieved_rps": len(results) / issue_window if issue_window else len(ok) / wall_s,
        "peak_in_flight": peak,
        "audio_s_per_wall_s": sum(r.audio_ms for r in ok) / 1000 / wall_s,
        "underruns": underruns, "requests_with_underruns": sum(1 for r in ok if r.underruns),
        "underrun_ms_total": sum(r.underrun_ms for r in ok),
        "underrun_requests": underrun_requests(cfg, ok),
        "metrics": metrics, "server": server, "gpu": gpu,
        "client_loop_lag_ms": stats(lags),
        "in_flight_trend": in_flight_trend(ok, issue_window) if cfg.rps else None,
        "ttfa_by_arrival": ttfa_by_arrival(ok),
        # the server's stream leads its WebSocket sessions said (a paced stream is made at about real time past it)
        "stream_leads_s": sorted({r.stream_lead_s for r in ok if r.stream_lead_s is not None}),
        "clean": clean,
    }


# A request that starts this soon after the one before it may find that one's first frame still being made (the
# engine's first-frame lane busy, synth/lane.py): first audio is reported for such requests and the others apart
CLOSE_ARRIVAL_S = 0.010


def ttfa_by_arrival(ok: list[Result]) -> dict:
    """First audio (measure.stats) of the requests that started within CLOSE_ARRIVAL_S of the one before them
    ("close") and of the others ("apart"); and of those that started while an earlier request of the run was still
    receiving audio ("during_another": at a low rate the engine is then making that one's frames, and the new first
    frame shares the GPU with its step) and of those that found none ("alone")."""
    started = sorted((r.start_s, r.ttfa_ms, r.e2e_ms) for r in ok if r.start_s is not None and r.ttfa_ms is not None)
    close, apart, during, alone = [], [], [], []
    flags = during_another([(start, e2e) for start, _, e2e in started])
    for i, ((start, ttfa, _), flag) in enumerate(zip(started, flags)):
        (close if i and start - started[i - 1][0] < CLOSE_ARRIVAL_S else apart).append(ttfa)
        (during if flag else alone).append(ttfa)
    return {"within_ms": CLOSE_ARRIVAL_S * 1000, "close": stats(close), "apart": stats(apart),
            "during_another": stats(during), "alone": stats(alone)}


def during_another(started: list[tuple[float, float | None]]) -> list[bool]:
    """For requests (start_s, e2e_ms or None) in order of start: whether an earlier one was still receiving audio
    when it began."""
    flags, last_end = [], float("-inf")
    for start, e2e in started:
        flags.append(start < last_end)
        if e2e is not None:
            last_end = max(last_end, start + e2e / 1000)
    return flags


# where in an open-loop level the requests in flight are counted (fractions of the level's window): after its first
# requests' e2e (a level starts from none in flight), and at its end
TREND_EARLY, TREND_LATE = (0.3, 0.6), (0.7, 1.0)
TREND_SAMPLES = 50


def in_flight_trend(ok: list[Result], window: float | None) -> list[float] | None:
    """[mean requests in flight over 30-60% of the level's window, over 70-100%]: a server that keeps up with the
    offered rate holds it level; one that falls behind lets it grow (more contexts, each slower) until its slots
    refuse or its audio underruns, which a level shorter than that never shows. None without completed requests."""
    done = [r for r in ok if r.start_s is not None and r.e2e_ms is not None]
    if not done or not window:
        return None
    starts = sorted(r.start_s for r in done)
    ends = sorted(r.start_s + r.e2e_ms / 1000 for r in done)

    def mean_in_flight(part: tuple[float, float]) -> float:
        times = [window * (part[0] + (part[1] - part[0]) * (i + 0.5) / TREND_SAMPLES) for i in range(TREND_SAMPLES)]
        # in flight at t: started at or before t, not ended at or before t
        return round(sum(bisect.bisect_right(starts, t) - bisect.bisect_right(ends, t) for t in times)
                     / TREND_SAMPLES, 1)

    return [mean_in_flight(TREND_EARLY), mean_in_flight(TREND_LATE)]


UNDERRUN_PROMPTS = 5        # the prompts with the most underrun requests, in the summary


def underrun_requests(cfg: Config, ok: list[Result]) -> dict:
    """The requests with underruns by when they started (in the closed loop's ramp or after it), by the frame at
    which their player first ran dry (a stream's first frames have the least margin), and the prompts that had the
    most of them, each as [underrun requests, requests] (a prompt's text can decide it: a first token committed by
    its own delta leaves frame 1 no time to spare, docs/engine.md)."""
    dry = [r for r in ok if r.first_underrun_audio_ms is not None]
    frames = collections.Counter(min(int(r.first_underrun_audio_ms // 80), 4) for r in dry)
    in_ramp = sum(1 for r in dry if r.start_s is not None and r.start_s < cfg.ramp_s)
    asked = collections.Counter(r.prompt_id for r in ok)
    prompts = collections.Counter(r.prompt_id for r in dry).most_common(UNDERRUN_PROMPTS)
    split = {"in_ramp": in_ramp, "after_ramp": len(dry) - in_ramp,
             "first_dry_frame": {"4+" if f == 4 else str(f): n for f, n in sorted(frames.items())},
             "prompts": {p: [n, asked[p]] for p, n in prompts}}
    if prompts and cfg.protocol == "native" and cfg.tokens_per_second > 0 and not cfg.token_ids:
        # streamed as text: what each one's text leaves a server at this pace (0: no server keeps up unheld)
        texts = {p["id"]: p["text"] for p in prompt_set.select()}
        split["prompt_slack_ms"] = {p: round(text_slack(texts[p], cfg.tokens_per_second)[0], 1)
                                    for p, _ in prompts if p in texts}
    return split


async def sweep(cfg: Config, levels: list[float], out: Path | None) -> tuple[float | None, float | None, bool]:
    """Raise the load level by level until a level is not clean -> (highest clean level, highest clean level that
    also held (open loop), any errors)."""
    runs = []
    for level in levels:
        step = replace(cfg, concurrency=int(level)) if cfg.concurrency else replace(cfg, rps=level)
        run = await run_load(step)
        s = run["summary"]
        runs.append(run)
        print(report.one_line(s), flush=True)
        if out:
            report.write_run(out / f"{s['mode']}-{level:g}", run)
        if not s["clean"]:
            break
    clean = [r["summary"]["load"] for r in runs if r["summary"]["clean"]]
    best = clean[-1] if clean else None     # levels rise and the sweep stops at the first unclean one
    kept = [r["summary"]["load"] for r in runs if r["summary"]["clean"] and report.held(r["summary"])]
    best_held = kept[-1] if kept else None
    if out:
        report.write_sweep(out, asdict(cfg), runs, best, best_held)
    return best, best_held, any(r["summary"]["errors"] for r in runs)


async def wait_ready(cfg: Config, timeout_s: float) -> None:
    """Poll /ready until the server says it is ready (it answers 503 while warming up)."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(cfg.url + "/ready", headers=cfg.auth_headers()) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"error: {cfg.url}/ready did not answer 200 within {timeout_s:.0f} s")
            await asyncio.sleep(0.5)
