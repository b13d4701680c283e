"""The engine: one thread owns the model and the GPU; clients reach it only through commands and events.

    engine = Engine.from_pretrained("/tmp/ck", device="cuda", max_contexts=256)
    engine.start()                      # warm-up, compiles, first-audio graphs; returns when ready
    client = engine.connect(deliver)    # deliver(events) runs on the engine thread, once per step
    engine.submit(client, [OpenContext(1, ContextParams(voice="ryan")), AppendText(1, ids, seconds),
                           EndText(1, tail_ids, 0.0)])
    ...                                 # deliver gets [AudioChunk(1, ...)] each step, then ContextDone(1, ...)
    engine.disconnect(client)           # cancels what is still open
    engine.stop()

Contexts are keyed by (client, context id chosen by the client), so a client opens one without a round
trip. Text arrives as token ids: tokenizing is the client's job (synth.tokenizer.StreamingTokenizer).
submit never blocks and never raises for a context: it checks an open's params (prompt resolution)
and takes a free slot under the lock, or queues ContextFailed(invalid_params / unknown_voice /
engine_full / ...) for the client; the rest is O(1) list work. The engine thread applies queued
commands at the step boundary, then runs one step:

    prefill, decode = scheduler.schedule(now)      # who runs (pure Python)
    step = runner.launch(prefill, decode)          # every tensor lives in the runner
    self._emit_audio()                             # the last step's PCM, decoded while this one was launched
    self._postprocess(prefill + decode, runner.codes_of(step))    # eos, limits; this step's audio pending

A frame's audio is emitted once its decode is done, during the next step (or at once when no next step
runs; and before the next step's launch where the step made only new contexts' first frames: an idle engine's new
context would otherwise wait for that launch's host work, which can outlast a one-row decode), and each client gets
that step's audio in one `deliver` call before the engine waits for the next step's codes; what the codes decide
(eos, failures) is delivered at the end of run_once. A context that reached its frame limit gets its ContextDone right
after its last AudioChunk. Where new contexts join running ones and every running client has audio to spare
(first_frames_apart), the step may be two launches: the new rows' prefill and first frame, then the running rows'
frame; the first frames' audio is delivered as soon as it is decoded, while the running rows' launch runs.

While the running rows' launch runs where first_frames_apart allows, the engine thread looks for new commands
(Engine.poll) instead of blocking on the GPU, and a new context that can take it has its open and first frame
launched on the first-frame lane beside the step (synth/lane.py); its audio goes out as soon as it is decoded, and
it runs with the others from the next step on.

A cancelled context makes no event from its CancelContext on (the flag is checked as events are made); those it
made before, still waiting for their deliver, go to the client, which drops them (server/engine_client.py: the
one place a gateway filters stale events). A cancelled context's slot is free at once; the engine drops it from
the scheduler before the next step, and a new context re-initializes every per-slot tensor when its own open
command is applied (commands apply in order).
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from talkgate.synth.api import (
    ENGINE_STAGES, SAMPLE_RATE, SEED_RANGE, AppendText, AudioChunk, CancelContext, ContextDone, ContextFailed,
    ContextParams, Deliver, EndText, EngineCommand, EngineError, EngineEvent, EngineFull, EngineStopped, FlushText,
    InvalidParams, MakeVoice, ModelInfo, OpenContext, StageTimes, TextSpoken, VoiceFailed, VoiceMade, VoicePrompt,
    seed_fits,
)
from talkgate.synth.lane import LANE_SETS
from talkgate.synth.pages import PagePool
from talkgate.synth.request import Request, Status
from talkgate.synth.scheduler import Scheduler

log = logging.getLogger("talkgate.engine")

DEFAULT_MAX_FRAMES = 750        # 60 s of audio per context
DEFAULT_BUDGET_FACTOR = 4.0     # runaway guard: max(4 * frames_for_text, 50) frames
DEFAULT_BUDGET_MIN = 50
HOLD_POLL_S = 0.001             # how often a held engine asks again
IDLE_WAIT_S = 0.5               # how long an idle engine thread waits for a command before it looks again
# How often an idle engine touches its GPU (Runner.keep_warm; Engine.set_keep_warm, serve --keep-warm): a new context's
# open and first launch after a quiet second took 0.57 / 1.11 ms of the engine thread against 0.36 / 0.84 ms with a
# small CUDA operation every 20 ms meanwhile, where a busy Python loop did not help (1.7B on an H200, bench/idle_gap.py,
# docs/benchmarks.md): what cools is the CUDA launch path, not the core
KEEP_WARM_S = 0.02
# step batches delivered to a client on another thread and not yet routed by it (about that many steps of audio)
# at which its `hold` makes the engine wait before the next step (synth.api.EngineInterface.max_behind)
STEPS_HELD_FOR_A_CLIENT = 32
# After warm-up the other buckets' graphs are captured one at a time on the engine thread (each holds it for
# up to about a second, cuDNN's algorithm search mostly: docs/engine.md): once no context has been open for
# QUIET_S (a request arriving during a capture waits for it); on a server that found no such moment for
# BUSY_S after warm-up, also between steps where no running context would notice (none waits for its
# first audio, every ready one ahead of its client by CAPTURE_MARGIN times the longest capture so far, and
# by CAPTURE_SLACK_S at least: captures of 1.0-1.25 s against a fixed 0.5 s gave 0.5-s underruns under load,
# docs/benchmarks.md)
QUIET_S = 1.0
BUSY_S = 30.0
CAPTURE_SLACK_S = 0.5
CAPTURE_MARGIN = 1.5
MAX_VOICES_QUEUED = 8           # MakeVoice commands waiting for the engine thread; more are refused (engine_full)


# New contexts prefilled a step (in chunks of runner.PREFILL_ROWS[-1] rows, one graph each): 4 a step made the
# 512th of a burst of new contexts wait 128 steps (2.2 s at 0.6B, docs/benchmarks.md); bench/engine.py's 16
MAX_PREFILLS = 16


def capture_slack(longest_capture_s: float) -> float:
    """How far ahead of its client every running context must be for the engine thread to capture a graph."""
    return max(CAPTURE_SLACK_S, CAPTURE_MARGIN * longest_capture_s)


def unnoticed(scheduler: Scheduler, now: float, slack: float = CAPTURE_SLACK_S) -> bool:
    """Whether the engine thread may stop for a capture now: no context ready for its first frame, and
    every ready context's audio at least `slack` seconds ahead of its client (contexts waiting for text
    cannot run anyway)."""
    return not any(r.ready for r in scheduler.waiting) and all(
        r.deadline - now >= slack for r in scheduler.running if r.ready)


# A step that takes new contexts while others run may launch the new ones' prefill and first frame as a step of
# their own just ahead of the running rows' (issue 45): their first audio then costs a pass of the new rows, not a
# step of the whole batch; the running rows' frame comes that pass later, and the pass runs the code predictor and
# decoder again at a few rows (1.7B on an H200: the pass about 5 ms; the mean step at 20 req/s 7.3 -> 7.7 ms). So
# only where nobody notices: every running context's client has audio for FIRST_APART_STEPS of the last step's
# length still to play, and the running rows are at most FIRST_APART_MAX_ROWS (beyond, the passes' cost is the
# engine's capacity: at 135 req/s of 1.7B on an H200 every step took new contexts, and 4 times more requests found
# the slots full, docs/benchmarks.md). Not where engine processes share a GPU (Engine(first_apart=False)): there
# the pass waits for the other processes' kernels, and first audio's p95 rose from 57 to 64 ms (three 1.7B models
# under CUDA MPS, 3 x 20 req/s)
FIRST_APART_STEPS = 2.0
FIRST_APART_MAX_ROWS = 64
# Past those rows (and as long as every running context has the same audio to spare), a step's new contexts (at most
# runner.FIRST_DECODE_ROWS[-1]) have their first frames decoded ahead of the running rows' by a decode of their own,
# their audio handed out while the running rows' decode runs: the step is longer by that small decode (1.7B on an
# H200: about 0.7 ms) instead of by a pass of the new rows (about 5 ms), up to FIRST_DECODE_MAX_ROWS running rows
FIRST_DECODE_MAX_ROWS = 128


# While the running rows' launch runs and a first-frame lane is open (synth/lane.py), the engine thread looks at the
# GPU and for new commands this often instead of blocking on the codes (a sleep, so that the other threads of its
# process run: the gateway's in a single-process server, the Flusher in an engine process)
LANE_POLL_S = 50e-6

# Each AudioChunk carries the engine's step (its step_s: a lone first token's hold scales with it, sessions/session.py
# first_hold_s) as a running mean over about this many steps, not the last step's length: a context's frame 0 is
# handed over after the step that prefilled it, which is that step's longest (at 20 req/s of 0.6B on an H200 the
# last step's length held 4 of 50 lone first tokens 64-69 ms where 40 ms was the rule, first audio's p95 +2 ms)
STEP_MEAN_STEPS = 8


def mean_step_ms(mean_ms: float, step_ms: float, steps: int) -> float:
    """The running mean of the step after a step of `step_ms`, the `steps`-th (the first step sets it)."""
    return step_ms if steps <= 1 else mean_ms + (step_ms - mean_ms) / STEP_MEAN_STEPS


def first_frames_apart(running: list[Request], now: float, step_s: float, max_rows: int = FIRST_APART_MAX_ROWS) -> bool:
    """Whether new contexts' first frames may run apart from `running`'s frame: as a step of their own ahead of it,
    or on the first-frame lane beside it (synth/lane.py; tried beside up to 1,024 running rows: at 100 req/s of 1.7B
    on an H200 first audio's p95 rose 26.5 -> 36.2 ms and the sweep's highest clean level fell 210 -> 190 req/s,
    docs/benchmarks.md); with max_rows FIRST_DECODE_MAX_ROWS, whether their first frames may be decoded apart."""
    return len(running) <= max_rows and all(r.deadline - now >= FIRST_APART_STEPS * step_s for r in running)


SCHEDULED, LAUNCHED, CODES = (ENGINE_STAGES.index(s) for s in ("scheduled", "launched", "codes"))


def stamp(reqs: list[Request], stage: int) -> None:
    """The time of ENGINE_STAGES[stage] for the traced contexts of `reqs` that reached the stage before it (a
    prefill is a context's first frame: its stages are stamped once)."""
    for req in reqs:
        if req.trace is not None and len(req.trace) == stage:
            req.trace.append(time.monotonic_ns())


@dataclass(eq=False)
class _Client:
    deliver: Deliver
    contexts: dict            # context id -> Request, the client's open contexts


class Engine:
    """The in-process engine: synth.api.EngineInterface on a thread of its own (start()), or driven by its caller."""

    max_behind = STEPS_HELD_FOR_A_CLIENT

    def __init__(self, runner, tokenizer_factory, prompts, info: ModelInfo, *, max_prefills: int = MAX_PREFILLS,
                 budget_factor: float = DEFAULT_BUDGET_FACTOR, budget_min: int = DEFAULT_BUDGET_MIN,
                 default_seed: int | None = None, first_apart: bool = True):
        """runner: synth.runner.Runner (owns the tensors); tokenizer_factory() -> a StreamingTokenizer
        (for clients: the engine takes token ids); prompts: resolves ContextParams into a prompt (raises
        InvalidParams) and knows the TTS ids; default_seed: the sampling seed of contexts that set none
        (None: a fresh random seed each), so that the same text and settings give the same audio (seeded
        noise does not depend on the batch); first_apart: new contexts' first frames may be launched as a pass of
        their own ahead of the running rows (first_frames_apart; False where engine processes share the GPU: the
        pass would wait for the others' kernels; the lane, of the highest priority, is the runner's)."""
        self.runner, self.new_tokenizer, self.prompts, self.info = runner, tokenizer_factory, prompts, info
        self.default_seed, self.first_apart = default_seed, first_apart
        self.budget_factor, self.budget_min = budget_factor, budget_min
        # an untrained checkpoint's contexts end by the text-length rule (ModelInfo.end_of_speech, chosen at load)
        self.length_rule = info.end_of_speech == "text_length_rule"
        # the Talker's KV pages (synth/pages.py): new contexts are refused while fewer are free than one context's
        # whole length, kept for the open ones' growth
        self.pages = PagePool(runner.pages, runner.page_len, reserve=min(runner.slot_pages, runner.pages - 2))
        self.scheduler = Scheduler(runner.max_batch, min(max_prefills, runner.max_batch), self.pages)
        self._kv_full_failures = 0              # running contexts failed for want of a KV page
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._commands: collections.deque = collections.deque()
        self._opens_queued = 0                  # opens admitted, still in _commands (their first KV page not taken)
        self._clients: dict[int, _Client] = {}
        self._client_ids = itertools.count(1)
        self._pending: dict[int, list[EngineEvent]] = {}          # events not delivered yet, per client
        self._traced: list[StageTimes] = []     # traced contexts' stage times pending with their first frame
        self._free_slots = list(range(runner.num_slots - 1, -1, -1))
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping = False
        self._start_error: BaseException | None = None
        self._ready_at = self._open_at = 0.0            # when warm-up ended; when a context was last open
        self._steps = self._frames = 0
        self._apart_launches = 0                # steps whose new contexts' first frames were launched apart
        # the launched steps' frames whose PCM is not emitted yet: [(step, [(row, req, frame, finish)])]
        self._audio: list[tuple] = []
        self._lanes: collections.deque = collections.deque()    # the lane's launches in flight, each with its context
        self._step_ms_last = self._step_ms_total = self._step_ms_mean = 0.0
        self._step_t0 = 0.0                     # when the step in progress began (_emit_frames before any step ended)
        self._roof_s_total = 0.0                # the steps' roofline seconds (runner.roof, where the GPU is known)
        self._voices: collections.deque = collections.deque()     # (client, MakeVoice) not begun yet
        self._voice: list | None = None         # the one being made: [client, MakeVoice, its steps, ms so far]
        self._voices_made = 0
        self._voice_ms_last = self._voice_ms_max = 0.0
        # called on the engine thread after every step with (ms, contexts in the step); must not block
        self.on_step = None
        # called on the engine thread before every step: while it returns True the engine waits (the
        # gateway's event loop is behind on the batches delivered to it); must not block
        self.hold = None
        # called on the engine thread while it waits for a step beside an open lane: takes the commands that arrived
        # (an engine process reads its sockets; submit() needs no call); must not block
        self.poll = None
        # called on the engine thread while it waits for any step's codes, where other engines share the thread
        # (ipc/engine_group.py): they take their commands and lanes; must not block
        self.beside = None
        # where other engines share the thread: called with perf_counter() before a graph capture, True where none
        # of their contexts would notice the thread held for it either
        self.others_unnoticed = None
        # how often an idle engine touches its GPU (None: never; nothing to keep warm on the CPU): set_keep_warm
        self.keep_warm_s: float | None = None
        self.set_keep_warm(KEEP_WARM_S)
        self._active_at = 0.0                   # the last turn that did something (keep_warm_s counts from there)
        self.keep_warm_touches = 0

    def set_keep_warm(self, seconds: float | None) -> None:
        """An idle engine touches its GPU every `seconds` (KEEP_WARM_S by default; None or 0: never), where its
        runner is on a GPU."""
        self.keep_warm_s = (seconds or None) if self.runner.device.type == "cuda" else None

    @classmethod
    def from_pretrained(cls, path_or_id: str, **kw) -> "Engine":
        """Load a checkpoint (directory or Hugging Face id) and make its Engine: begin_pretrained's arguments."""
        return cls.begin_pretrained(path_or_id, **kw)()

    @classmethod
    def begin_pretrained(cls, path_or_id: str, device: str | None = None, dtype: str | None = None,
                         max_contexts: int | None = None, max_frames_per_context: int = DEFAULT_MAX_FRAMES,
                         max_batch: int | None = None, cuda_graphs: bool = True, max_prompt: int | None = None,
                         decoder_dtype: str | None = None, torch_compile: bool = True,
                         untrained_length: str = "text-rule", memory_share: float | None = None,
                         lane: bool | None = None, kv_pages: int | None = None,
                         **engine_kw) -> Callable[[], "Engine"]:
        """from_pretrained in two parts (runner_build.begin_runner): this one loads the checkpoint and starts a
        fresh cache's compile helpers, the function it returns waits for them and makes the Engine. device None:
        cuda if available, else cpu; dtype None: bfloat16 on cuda, float32 on cpu; max_contexts None: sized from
        free memory, or from `memory_share` of the GPU's memory where engines share it (docs/engine.md); max_batch
        None: max_contexts when given, else 512 or 256 by the GPU's memory (runner_build.default_max_batch);
        max_prompt None: 128 positions, 385 for a Base checkpoint (an ICL voice of 30 s); decoder_dtype None:
        float16 on cuda where its probe at load allows, else float32 (synth/decoder_precision.py);
        torch_compile: fuse the step's kernels with torch.compile on cuda (minutes of warm-up, cached);
        untrained_length: how an untrained checkpoint's contexts end, "text-rule" or "runaway"
        (synth.api.end_of_speech); lane: a first-frame lane (synth/lane.py), None: where the step runs CUDA graphs;
        kv_pages: the Talker's KV pages (synth/pages.py), None: sized from memory with the slots, or every slot's whole
        length where max_contexts is given."""
        from talkgate.synth.runner_build import begin_runner
        finish = begin_runner(path_or_id, device=device, dtype=dtype, max_contexts=max_contexts,
                              max_frames_per_context=max_frames_per_context, max_batch=max_batch,
                              cuda_graphs=cuda_graphs, max_prompt=max_prompt, decoder_dtype=decoder_dtype,
                              torch_compile=torch_compile, untrained_length=untrained_length,
                              memory_share=memory_share, lane=lane, kv_pages=kv_pages)
        return lambda: cls(*finish(), **engine_kw)

    # ----- lifecycle -----
    def start(self) -> None:
        """Start the engine thread (warm-up happens there); return when it is ready: everything compiled and
        the graphs a first audio needs captured. The thread captures the other batch buckets' graphs later,
        one at a time when no context would notice (stats(): graphs_pending)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="talkgate-engine", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            raise RuntimeError("engine warm-up failed") from self._start_error

    def stop(self) -> None:
        """Stop the thread; open contexts get ContextFailed(engine_stopped), delivered from this thread."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            left = [req for c in self._clients.values() for req in c.contexts.values()]
            voices, self._voices = self._voices, collections.deque()
            if self._voice is not None:
                voices.appendleft(tuple(self._voice[:2]))
                self._voice = None
            for client, cmd in voices:
                self._pending.setdefault(client, []).append(VoiceFailed(cmd.request, "engine_stopped", "engine stopped"))
        for req in left:
            self._fail(req, EngineStopped("engine stopped"))
        self._deliver()

    # ----- clients -----
    def connect(self, deliver: Deliver) -> int:
        """A new client; deliver(events) is called on the engine thread with each step's events of its
        contexts, in order (one list per step); it must not block."""
        with self._lock:
            client = next(self._client_ids)
            self._clients[client] = _Client(deliver, {})
        return client

    def disconnect(self, client: int) -> None:
        """Cancel every open context of the client and forget it; nothing more is delivered to it."""
        with self._lock:
            c = self._clients.pop(client, None)
            self._pending.pop(client, None)
            if c is None:
                return
            self._voices = collections.deque((k, cmd) for k, cmd in self._voices if k != client)
            for req in c.contexts.values():
                self._cancel_locked(req)
            c.contexts.clear()
        self._wake.set()

    def fail_client(self, client: int, err: EngineError) -> None:
        """Fail every open context of the client with err at the next step boundary (their ContextFailed
        events are delivered as usual); the client stays connected."""
        with self._lock:
            c = self._clients.get(client)
            for req in c.contexts.values() if c is not None else ():
                self._commands.append(("fail", req, err))
        self._wake.set()

    def submit(self, client: int, commands: list[EngineCommand]) -> None:
        """Queue commands for the next step boundary, in order. Never blocks on a step, never raises for a
        context: a refused open is answered by ContextFailed; text or a cancel for a context that is not
        open (finished, failed, cancelled) is ignored."""
        opens = {id(cmd): self._resolve(cmd.params) for cmd in commands if isinstance(cmd, OpenContext)}
        with self._lock:
            c = self._clients.get(client)
            if c is None:
                return
            for cmd in commands:
                if isinstance(cmd, OpenContext):
                    err = self._open_locked(client, c, cmd.context, opens[id(cmd)])
                    if err is not None:
                        self._pending.setdefault(client, []).append(ContextFailed(cmd.context, err.code, err.message))
                    continue
                if isinstance(cmd, MakeVoice):
                    err = (EngineStopped("engine stopped") if self._stopping else
                           EngineFull(f"{MAX_VOICES_QUEUED} voices are being made; try again in a moment")
                           if len(self._voices) >= MAX_VOICES_QUEUED else None)
                    if err is None:
                        self._voices.append((client, cmd))
                    else:
                        self._pending.setdefault(client, []).append(VoiceFailed(cmd.request, err.code, err.message))
                    continue
                req = c.contexts.get(cmd.context)
                if req is None:
                    continue
                if (req.trace is not None and not req.trace and not isinstance(cmd, CancelContext)
                        and (cmd.ids or not isinstance(cmd, AppendText))):   # the first text that can make it ready
                    req.trace.append(time.monotonic_ns())
                if isinstance(cmd, AppendText):
                    self._commands.append(("text", req, (cmd.ids, cmd.seconds)))
                elif isinstance(cmd, FlushText):
                    self._commands.append(("flush", req, (cmd.ids, cmd.seconds)))
                elif isinstance(cmd, EndText):
                    self._commands.append(("end", req, (cmd.ids, cmd.seconds)))
                elif isinstance(cmd, CancelContext):
                    self._cancel_locked(req)
                else:
                    raise TypeError(f"not an engine command: {cmd!r}")
        self._wake.set()

    def send_now(self) -> None:
        """Nothing to do: submit hands commands to the engine thread at once (synth.api.EngineInterface)."""

    def _resolve(self, params: ContextParams) -> tuple[ContextParams, object] | EngineError:
        """(params with the default seed, resolved prompt), or the error that refuses the open."""
        try:
            prompt = self.prompts.resolve(params)                  # InvalidParams / UnknownVoice / ...
            self.prompts.check_fits(prompt, self.runner.max_prompt)
            if params.fixed_frames is not None and params.fixed_frames < 1:
                raise InvalidParams("fixed_frames must be >= 1")
            seed = params.sampling.seed
            if seed is not None and not seed_fits(seed):
                raise InvalidParams(f"seed must fit in 64 bits ({SEED_RANGE})")
        except EngineError as e:
            return e
        except Exception as e:                                      # a malformed params object
            return InvalidParams(f"invalid context parameters: {e}")
        if seed is None and self.default_seed is not None:
            params = dataclasses.replace(params, sampling=dataclasses.replace(params.sampling, seed=self.default_seed))
        return params, prompt

    def _open_locked(self, client: int, c: _Client, context: int, resolved) -> EngineError | None:
        """Take a slot for a new context and queue its open; or the error that refuses it."""
        if self._stopping:
            return EngineStopped("engine stopped")
        if isinstance(resolved, EngineError):
            return resolved
        if context in c.contexts:
            return InvalidParams(f"context {context} is already open")
        if not self._free_slots:
            return EngineFull(f"all {self.runner.num_slots} context slots are in use")
        if not self.pages.room(self._opens_queued):
            return EngineFull("the speech memory is full (the open contexts hold or may grow into every KV page); "
                              "try again in a moment")
        params, prompt = resolved
        req = Request(context=context, client=client, slot=self._free_slots.pop(), params=params, prompt=prompt,
                      frame_limit=self.runner.max_frames, budget_factor=self.budget_factor,
                      budget_min=self.budget_min, text_lead=prompt.ref_text_ids,
                      prefill_text=prompt.text_positions, length_rule=self.length_rule,
                      trace=[] if params.trace_latency else None)
        c.contexts[context] = req
        self._commands.append(("open", req, None))
        self._opens_queued += 1
        return None

    def _cancel_locked(self, req: Request) -> None:
        req.cancelled = True
        if self._free_locked(req):
            self._commands.append(("cancel", req, None))

    def _free_locked(self, req: Request) -> bool:
        """Take req out of its client's open contexts and give its slot back, exactly once."""
        if req.freed:
            return False
        req.freed = True
        c = self._clients.get(req.client)
        if c is not None and c.contexts.get(req.context) is req:
            del c.contexts[req.context]
        self._free_slots.append(req.slot)
        return True

    @property
    def free_slots(self) -> int:
        """Slots a new context may take now: not taken by an open context, and none while the KV pages have no room
        for one (no lock: callable from deliver)."""
        return len(self._free_slots) if self.pages.room(self._opens_queued) else 0

    def stats(self) -> dict:
        with self._lock:
            free, clients = self.free_slots, len(self._clients)
        steps, captures = self._steps, self.runner.capture_ms
        return {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                "voices_made": self._voices_made, "voice_ms_last": round(self._voice_ms_last, 3),
                "voice_ms_max": round(self._voice_ms_max, 3),
                "free_slots": free, "slots": self.runner.num_slots, "max_batch": self.runner.max_batch,
                "clients": clients, "steps": steps,
                "frames": self._frames, "step_ms_last": round(self._step_ms_last, 3),
                "gpu_wait_s": self.runner.gpu_wait_s,
                "step_ms_avg": round(self._step_ms_total / steps, 3) if steps else 0.0,
                "graphs_captured": len(self.runner.graphs), "graphs_pending": len(self.runner.pending),
                "capture_ms_max": round(max(captures), 1) if captures else 0.0,
                "prompt_prefixes": dict(self.runner.prefix_counts),
                "lane_launches": self.runner.lane.launches if self.runner.lane is not None else 0,
                "first_apart_launches": self._apart_launches, "first_decodes": self.runner.first_decodes,
                "keep_warm_touches": self.keep_warm_touches,
                "kv_pages": self.pages.pages - 1, "free_kv_pages": self.pages.free,
                "kv_full_failures": self._kv_full_failures,
                **({"step_roof_s": self._roof_s_total} if self.runner.roof is not None else {})}

    # ----- engine thread -----
    def _run(self) -> None:
        try:
            self.warm_up()
        except BaseException as e:                              # reported by start()
            self._start_error = e
            self._ready.set()
            return
        self._ready.set()
        while not self._stopping:
            self._wake.clear()
            if self.hold is not None and self.hold():
                time.sleep(HOLD_POLL_S)
                continue
            if not self.turn():
                self._wake.wait(timeout=self.idle_s())

    def idle_s(self) -> float:
        """After a turn with nothing to do: how long the loop may wait for a command, at most until the first context
        that sits out for its lead (ContextParams.lead_s) is due, or the next touch of the GPU (keep_warm_s). The
        engine thread's (the scheduler is its own)."""
        now = time.perf_counter()
        due = self.scheduler.due_in(now)
        wait = IDLE_WAIT_S if due is None else min(IDLE_WAIT_S, due)
        if self.keep_warm_s:
            wait = min(wait, max(0.0, self._active_at + self.keep_warm_s - now))
        return wait

    def warm_up(self, every_graph: bool = False) -> None:
        """Compiles and the graphs a first audio needs, or every graph (the engine thread's start; an engine
        process that drives the loop itself calls it, then turn())."""
        self.runner.warmup(first_audio_only=not every_graph)
        self._ready_at = self._open_at = time.perf_counter()

    def turn(self) -> bool:
        """One turn of the engine loop: run_once, then a pending graph capture if no context would notice; where
        neither did anything for keep_warm_s, a touch of the GPU (Runner.keep_warm). False when there was nothing to
        do."""
        stepped = self.run_once()
        busy = self._capture_if_unnoticed() or stepped
        now = time.perf_counter()
        if busy:
            self._active_at = now
        elif self.keep_warm_s and now - self._active_at >= self.keep_warm_s:
            self.keep_warm_touches += self.runner.keep_warm()
            self._active_at = now
        return busy

    def _capture_if_unnoticed(self) -> bool:
        """Capture one pending graph if no context would notice (QUIET_S, BUSY_S above); the last step's
        audio is handed out first. True if it captured."""
        self.runner.adopt_compiles()            # a compile helper's late kernels: their graphs join pending
        if not self.runner.pending:
            return False
        now = time.perf_counter()
        if not self.capture_unnoticed(now) or (self.others_unnoticed is not None and not self.others_unnoticed(now)):
            return False
        with self._lock:
            if self._commands or self._voices or self._voice is not None:
                return False
        self._emit_audio()
        self._deliver()
        try:
            self.runner.capture_next()
        except Exception:                                       # the engine serves on from the captured buckets
            log.exception("capturing a graph failed; the remaining buckets stay uncaptured")
            self.runner.pending.clear()
        return True

    def capture_unnoticed(self, now: float) -> bool:
        """Whether this engine's contexts would not notice its thread held for a graph capture now (QUIET_S, BUSY_S
        above)."""
        with self._lock:
            open_now = any(c.contexts for c in self._clients.values())
        if open_now:
            self._open_at = now
        quiet = not open_now and now - self._open_at >= QUIET_S
        return quiet or (now - self._ready_at >= BUSY_S
                         and unnoticed(self.scheduler, now, capture_slack(self.runner.longest_capture_s)))

    def run_once(self) -> bool:
        """Apply queued commands, then one step, then deliver its events; False when nobody was ready and
        nothing was delivered. The engine thread's loop body: call it directly only on an engine that was
        not started (benchmarks drive it so)."""
        self._apply_commands()
        stepped = self._step()
        voiced = self._make_voice()
        return self._deliver() or stepped or voiced

    def _apply_commands(self) -> None:
        """The queued commands in order; the opens' slots are initialized together at the end (only the
        runner's tensors wait for that: text, an end or a cancel of a context opened here is host state)."""
        with self._lock:
            commands, self._commands = self._commands, collections.deque()
        opens, taken = [], 0                        # taken: the opens off the queue, cancelled or failed ones too
        for op, req, arg in commands:
            taken += op == "open"
            if op == "cancel":
                self.scheduler.remove(req)
            elif req.freed:
                continue
            elif op == "fail":
                self._fail(req, arg)
            elif op == "open":
                opens.append(req)
            else:
                self._apply_text(op, req, arg)
        self._open([req for req in opens if not req.freed])
        if taken:                                   # their first pages are taken now
            with self._lock:
                self._opens_queued -= taken

    def _open(self, reqs: list[Request]) -> None:
        """Initialize the new contexts' slots and schedule them; if that fails, each alone, so that only the one
        that cannot open fails."""
        full = [req for req in reqs if not self.pages.reach(req, 0)]      # its prompt's prefix goes into page 0
        for req in full:
            self._fail(req, EngineFull("the speech memory is full (no free KV page); try again in a moment"))
        reqs = [req for req in reqs if not req.freed]
        if not reqs:
            return
        try:
            self.runner.open_slots(reqs)
        except Exception as e:
            if len(reqs) > 1:
                for req in reqs:
                    self._open([req])
                return
            log.exception("opening context %d of client %d failed", reqs[0].context, reqs[0].client)
            self._fail(reqs[0], e)                          # this context fails; the engine goes on
            return
        for req in reqs:
            self.scheduler.add(req)

    def _apply_text(self, op: str, req: Request, arg: tuple) -> None:
        """Text, a flush or the end of a context's text; held while a flush is being spoken."""
        if req.flushing:
            req.held.append((op, arg))
            return
        ids, seconds = arg
        req.text_ids.extend(ids)
        req.text_seconds += seconds
        if op == "end":
            req.text_ended = True
            if not req.has_new_text:                        # nothing (more) to say
                self.scheduler.remove(req)
                self._then(req, ("done", req.spoken_reason))
            else:
                self._check_limits(req)
        elif op == "flush":
            if not req.has_new_text:
                self._then(req, ("spoken", "empty"))
            else:
                req.flushing = True
                self._check_limits(req)

    def _make_voice(self) -> bool:
        """Advance the voice being made (the first queued MakeVoice) by one step of its work (the speaker
        encoder, the codec encoder, a chunk of an ICL voice's decoder priming) when contexts are open, by all
        of it when none is: a voice delays the next step by at most one of its steps, and never audio made
        already (the last step's audio goes out first). False if no voice is queued."""
        with self._lock:
            if self._voice is None:
                if not self._voices:
                    return False
                client, cmd = self._voices.popleft()
                self._voice = [client, cmd, self._voice_steps(cmd), 0.0]
        client, cmd, steps, _ = self._voice
        self._emit_audio()
        t0 = time.perf_counter()
        ev = None
        try:
            while True:
                next(steps)
                if self.scheduler.running or self.scheduler.waiting:
                    break
        except StopIteration as made:
            ev = made.value
        except EngineError as e:
            ev = VoiceFailed(cmd.request, e.code, e.message)
        except Exception as e:                                  # the voice fails; the engine goes on
            log.exception("making voice %d of client %d failed", cmd.request, client)
            ev = VoiceFailed(cmd.request, "engine_error", f"making the voice failed: {e}")
        self._voice[3] += (time.perf_counter() - t0) * 1000
        if ev is None:
            return True
        ms, self._voice = self._voice[3], None
        if isinstance(ev, VoicePrompt):
            self._voices_made += 1
            self._voice_ms_last, self._voice_ms_max = ms, max(self._voice_ms_max, ms)
            ev = VoiceMade(cmd.request, ev, round(ms, 3))
        with self._lock:
            if client in self._clients:
                self._pending.setdefault(client, []).append(ev)
        return True

    def _voice_steps(self, cmd: MakeVoice):
        """A MakeVoice's work in steps (a generator returning the voice): the voice checked as an open would
        check it (a reference text too long, a prompt over max_prompt), an ICL voice's decoder state primed
        for its first context."""
        from talkgate.synth.voice import voice_prompt_steps

        if not isinstance(cmd.audio, bytes) or len(cmd.audio) % 4:
            raise InvalidParams("reference audio must be float32 samples (a whole number of 4-byte values)")
        voice = yield from voice_prompt_steps(self.runner.tts, np.frombuffer(cmd.audio, "<f4"), SAMPLE_RATE,
                                              cmd.ref_text)
        self.prompts.check_fits(self.prompts.resolve(ContextParams(voice_prompt=voice)), self.runner.max_prompt)
        if voice.icl:
            yield
            yield from self.runner.priming(voice)
        return voice

    def _step(self) -> bool:
        """One step over every ready context, and the last step's audio; False when there was neither. New
        contexts' first frames are launched apart, ahead of the running rows, where first_frames_apart allows:
        their audio goes out while the running rows' frame is made; where it allows, a new context that arrives
        while the running rows' frame is made takes the lane beside it (synth/lane.py). First frames with no running
        rows go out once decoded, before the next step is launched (other steps' audio goes out after it)."""
        t0 = self._step_t0 = time.perf_counter()
        self.pages.settle()                                     # no step in flight writes the pages given back
        prefill, decode = self.scheduler.schedule(t0)
        if not prefill and not decode:
            emitted = self._emit_audio()
            return self._fail_starved(idle=True) or emitted
        if prefill:
            stamp(prefill, SCHEDULED)
            prefill.sort(key=lambda r: not r.prefixed)         # the runner's order: frame 0 by a Talker step first
        apart_now = self.first_apart and bool(prefill)
        unnoticed = (bool(decode) and (apart_now or self.runner.lane is not None)
                     and first_frames_apart(decode, t0, self._step_ms_last / 1000, FIRST_APART_MAX_ROWS))
        apart = unnoticed and apart_now
        self._apart_launches += apart
        launches = [(prefill, []), ([], decode)] if apart else [(prefill, decode)]
        decode_first = (apart_now and not apart and bool(decode)        # (the runner: at most 4 new contexts)
                        and first_frames_apart(decode, t0, self._step_ms_last / 1000, FIRST_DECODE_MAX_ROWS))
        # beside the one- and two-row persistent kernels too: they are cooperative grids, which start only when
        # all their programs can be resident, so the lane's kernels wait for the step's kernel in flight, not the step
        lane = unnoticed and self.runner.lane is not None
        try:
            steps = []
            for new, old in launches:
                steps.append((self.runner.launch(new, old, decode_first), new + old))
                if new:                                         # the first frames' launch, apart or not
                    stamp(new, LAUNCHED)
            self._emit_audio()
            self._deliver()                                     # the last step's audio, while this one runs
            # a launch of first frames goes out once decoded: apart, while the running rows' launch runs; alone (no
            # running rows), before the next step's launch, whose host work can outlast a one-row decode
            alone = not decode and self.beside is None
            for i, (step, reqs) in enumerate(steps):
                last = i == len(steps) - 1
                own_lane = {r.slot for r in prefill + decode} if last and lane else None
                codes = (self._await_codes(step, own_lane) if own_lane is not None or self.beside is not None
                         else self.runner.codes_of(step))
                if prefill and i == 0:
                    stamp(prefill, CODES)
                self._postprocess(step, reqs, codes)
                if step.first is not None:                      # decoded ahead: out while the others' decode runs
                    self._emit_first(step.first)
                if not last or alone:
                    self._emit_audio()
                    self._deliver()
            while self._lanes:                                  # their contexts run in the next step
                self._land_lane()
            self._fail_starved()                                # after the contexts that ended in it gave pages back
        except Exception as e:                                  # fail this step's contexts, keep serving
            log.exception("engine step failed")
            self._audio = []
            lost = prefill + decode
            lost.extend(req for _, req in self._lanes)
            self._lanes.clear()
            for req in lost:
                if not req.freed:
                    self._fail(req, e)
            return True
        dt = (time.perf_counter() - t0) * 1000
        self._steps += 1
        self._step_ms_last, self._step_ms_total = dt, self._step_ms_total + dt
        self._step_ms_mean = mean_step_ms(self._step_ms_mean, dt, self._steps)
        if self.runner.roof is not None:
            n = len(prefill) + len(decode)
            position = sum(step.positions for step, _ in steps) / n
            self._roof_s_total += self.runner.roof.step_s(n, position,
                                                          [r.prompt_len for r in prefill if not r.prefixed])
        if self.on_step is not None:
            self.on_step(dt, len(prefill) + len(decode))
        return True

    def _fail_starved(self, idle: bool = False) -> bool:
        """(After the audio made so far is out.) Running contexts are due but no KV page is free for their next frame
        and none is coming back at the next step: the newest of them fails, its pages for the others. Admission keeps a
        context's whole length of pages in reserve, so this takes more contexts growing long at once than it allows for.
        Where none is starved, the step was `idle` (nothing could run) and no running context is ready (one sitting
        out for its lead will run and end), new contexts waiting for their prompt's pages would wait for the clients
        of the others: the newest of them fails. True where one failed."""
        starved = [req for req in self.scheduler.starved if not req.freed]
        if not starved and idle and self.scheduler.blocked and not any(req.ready for req in self.scheduler.running):
            starved = [req for req in self.scheduler.blocked if not req.freed]
        if not starved or self.pages.returning:
            return False
        req = max(reversed(starved), key=lambda r: r.t_ready or 0.0)    # of those ready at once, the last admitted
        self._kv_full_failures += 1
        log.warning("no KV page for context %d of client %d (%d pages, %d contexts running): it fails", req.context,
                    req.client, self.pages.pages - 1, len(self.scheduler.running))
        self._fail(req, EngineFull("the speech memory is full: this context could not go on; try again in a moment"))
        return True

    def _await_codes(self, step, busy: set[int] | None) -> np.ndarray:
        """The launched step's codes. While it runs: where `busy` is given (the step's slots: a slot freed during the
        step is still being written by it), a new context that arrives takes the lane (LANE_SETS in flight at most, one
        behind the other), and its first audio goes out as soon as it is decoded; where other engines share this
        thread (`beside`), they take theirs."""
        while True:
            if busy is not None:
                if self._lanes and self.runner.audio_ready(self._lanes[0][0]):
                    self._land_lane()
                    self._emit_audio()
                    self._deliver()
                if len(self._lanes) < LANE_SETS:
                    if self.poll is not None:
                        self.poll()
                    self._launch_lanes(busy)
            if self.beside is not None:
                self.beside()
            if self.runner.codes_ready(step):
                return self.runner.codes_of(step)
            time.sleep(LANE_POLL_S)

    @property
    def first_frames_waiting(self) -> bool:
        """Commands are queued (a new context's among them, as a rule) or a context is ready for its first frame: where
        engines share a thread (ipc/engine_group.py), this one's step comes before theirs."""
        with self._lock:
            if self._commands:
                return True
        return self.scheduler.new_ready

    @property
    def lane_in_flight(self) -> bool:
        """A context's first frame is on the lane (beside_turn lands it once it is done)."""
        return bool(self._lanes)

    def beside_turn(self) -> None:
        """While another engine of this thread steps (ipc/engine_group.py), without waiting for the GPU: a first frame
        on the lane that is done lands, the audio whose decode is done goes out (this engine's next step is a turn of
        the loop away), and a new context that can take the lane launches there (behind one in flight) once no step of
        this engine's is still running (all its audio out: a slot freed meanwhile, a cancelled context's, is no longer
        written)."""
        lane = self.runner.lane is not None
        while lane and self._lanes and self.runner.audio_ready(self._lanes[0][0]):
            self._land_lane()
        self._emit_audio(wait=False)
        if lane and not self._audio:
            self._launch_lanes(set())
        self._deliver()

    def _launch_lanes(self, busy: set[int]) -> None:
        """Contexts that can take the lane launched there, one behind the other, while fewer than LANE_SETS are."""
        while len(self._lanes) < LANE_SETS and self._launch_lane(busy):
            pass

    def _launch_lane(self, busy: set[int]) -> bool:
        """The first context that can take the lane (_fits_lane), with its queued text applied, launched there; its
        commands leave the queue (a context's commands before its first frame concern it alone), the others stay for
        the step boundary. False where none could."""
        with self._lock:
            req = next((req for op, req, arg in self._commands if self._fits_lane(req, op, arg, busy)), None)
            # the pages of its prompt and first frame (a prompt's prefix, then its last position)
            if req is None or not self.pages.reach(req, req.next_position):
                return False
            opened = req.prefixed                           # its slot set at a boundary already (streamed text)
            mine = [cmd for cmd in self._commands if cmd[1] is req]
            self._commands = collections.deque(cmd for cmd in self._commands if cmd[1] is not req)
            self._opens_queued -= sum(op == "open" for op, _, _ in mine)
        for op, _, arg in mine:
            if req.freed:
                break
            if op == "fail":
                self._fail(req, arg)
            elif op != "open":
                self._apply_text(op, req, arg)
        if req.freed:                                       # its cancel was among its commands: its pages go back
            self.scheduler.remove(req)
            return True
        req.t_ready, req.status = time.perf_counter(), Status.RUNNING
        stamp([req], SCHEDULED)
        try:
            step = self.runner.launch_lane(req, open_slot=not opened)
        except Exception as e:                                  # this context fails; the engine goes on
            log.exception("launching context %d of client %d on the lane failed", req.context, req.client)
            self._fail(req, e)
            return True
        stamp([req], LAUNCHED)
        self._lanes.append((step, req))
        return True

    def _fits_lane(self, req: Request, op: str, arg, busy: set[int]) -> bool:
        """(Under the lock, `op` queued for req.) Whether req can take the lane now, its slot not written by the step
        in flight: a new context (its open queued) whose prompt's prefix is kept (runner.kept_prefix) and whose text
        for frame 0 is queued too; or one opened at a step boundary before its text came (streamed text: its slot
        holds its prompt's prefix, `prefixed`), waiting, whose first text is this command."""
        if req.freed or req.slot in busy:
            return False
        if op == "open":
            return self.runner.kept_prefix(req.prompt) and any(
                o in ("text", "flush", "end") and a[0] for o, r, a in self._commands if r is req)
        # WAITING: never scheduled (no frame yet); not ready: its first text is not applied yet (one that is waits
        # for the boundary's prefill room)
        return (op in ("text", "flush", "end") and bool(arg[0]) and req.prefixed and req.status is Status.WAITING
                and not req.ready)

    def _land_lane(self) -> None:
        """The lane's context's first frame, as a step's (waits for its codes): from here on it runs with the others."""
        step, req = self._lanes.popleft()
        codes = self.runner.codes_of(step)
        stamp([req], CODES)
        if not req.freed:
            self.scheduler.join(req)
        self._postprocess(step, [req], codes)

    def _postprocess(self, step, reqs: list[Request], codes: np.ndarray) -> None:
        """codes[i] = the 16 codes of reqs[i]'s new frame: on eos the context finishes (a flushing one has
        spoken its flush, and the eos row changed nothing of its slot: runner); otherwise its audio is
        pending (emitted by _emit_audio), and an end or spoken flush reached at this frame follows it."""
        eos = self.runner.codec_eos
        frames = []
        for i, req in enumerate(reqs):
            if req.cancelled:
                continue
            if int(codes[i, 0]) == eos:                         # the runner only lets eos through if allowed
                if req.flushing:
                    self._spoken(req, "eos")
                else:
                    self._finish(req, "eos")
                continue
            req.frames += 1
            self._frames += 1
            frames.append((i, req, req.frames - 1, []))
        first, late = step.first, frames
        if first is not None:                                   # rows [0, first.n), leading: decoded ahead
            k = next((j for j, f in enumerate(frames) if f[0] >= first.n), len(frames))
            if k:
                self._audio.append((first, frames[:k]))
            late = frames[k:]
        if late:
            self._audio.append((step, late))
        for _, req, _, _ in frames:
            self._check_limits(req)

    def _check_limits(self, req: Request) -> None:
        """A context at its frame limit stops being scheduled and ends; a flushing one at its flush's
        length has spoken it. Either after the audio it has (text of many short tokens can stream ahead
        of its frames, so a limit known once the text ends or is flushed may be reached already)."""
        limit, reason = req.limit()
        if req.frames >= limit:
            self.scheduler.remove(req)
            self._then(req, ("done", reason))
        elif req.flushing:
            limit, reason = req.flush_limit()
            if req.frames >= limit:
                self._spoken(req, reason)

    def _spoken(self, req: Request, reason: str) -> None:
        """The flush is spoken: the context waits for text, TextSpoken follows its audio, and what was held
        meanwhile applies (it may start the next flush, or end the context)."""
        req.spoken(reason, self.runner.text_eos, self.runner.text_pad)
        self._then(req, ("spoken", reason))
        while req.held and not req.flushing:
            op, arg = req.held.popleft()
            self._apply_text(op, req, arg)

    def _then(self, req: Request, end: tuple[str, str]) -> None:
        """("done", reason) or ("spoken", reason), after the context's audio made so far: after its pending
        frame's audio, else at once."""
        end = (*end, req.frames)
        for _, r, _, after in (frame for _, frames in self._audio for frame in frames):
            if r is req:
                after.append(end)
                return
        self._end(req, end)

    def _end(self, req: Request, end: tuple[str, str, int]) -> None:
        kind, reason, frames = end
        if kind == "done":
            self._finish(req, reason)
        else:
            self._emit(req, TextSpoken(req.context, reason, frames))

    def _emit_audio(self, wait: bool = True) -> bool:
        """Queue the launched steps' PCM for their contexts (waits for their decode; wait=False: only those decoded
        already, in order); False if none was emitted."""
        ready = len(self._audio)
        if not wait:
            ready = 0
            while ready < len(self._audio) and self.runner.audio_ready(self._audio[ready][0]):
                ready += 1
        if not ready:
            return False
        pending, self._audio = self._audio[:ready], self._audio[ready:]
        for step, frames in pending:
            self._emit_frames(step, frames)
        return True

    def _emit_first(self, first) -> None:
        """A step's first frames decoded ahead of its other rows (Runner.launch's `first`): emitted and handed out as
        soon as their decode is done (the step's own decode runs meanwhile)."""
        if self._audio and self._audio[0][0] is first:
            _, frames = self._audio.pop(0)
            self._emit_frames(first, frames)
            self._deliver()

    def _emit_frames(self, step, frames: list[tuple]) -> None:
        pcm = self.runner.audio_of(step).copy()                 # one copy; each chunk is a row of it
        now = time.perf_counter()
        # before any step ended (an engine's first frame 0, handed out inside its step) the step's time so far
        step_s = self._step_ms_mean / 1000 or now - self._step_t0
        ends = []
        with self._lock:
            for i, req, frame, after in frames:
                if req.cancelled:
                    continue
                if req.trace is not None and frame == 0:
                    req.trace.append(time.monotonic_ns())
                    times = StageTimes(req.context, req.trace)
                    req.trace = None
                    self._traced.append(times)
                    self._pending.setdefault(req.client, []).append(times)
                self._pending.setdefault(req.client, []).append(AudioChunk(req.context, pcm[i], frame, 1, now, step_s))
                ends += [(req, end) for end in after]
        for req, end in ends:
            self._end(req, end)

    def _emit(self, req: Request, ev: EngineEvent) -> None:
        with self._lock:
            if not req.cancelled:
                self._pending.setdefault(req.client, []).append(ev)

    def _deliver(self) -> bool:
        """Hand every client its pending events in one call; a client whose deliver raises is disconnected. False
        if none."""
        broken = []
        with self._lock:
            if not self._pending:
                return False
            pending, self._pending = self._pending, {}
            if self._traced:
                stamp_now = time.monotonic_ns()
                for times in self._traced:
                    times.stamps.append(stamp_now)
                self._traced.clear()
            for client, events in pending.items():
                c = self._clients.get(client)
                if c is None:
                    continue
                try:
                    c.deliver(events)
                except Exception:
                    log.exception("delivering to client %d failed: disconnecting it", client)
                    broken.append(client)
        for client in broken:
            self.disconnect(client)
        return True

    def _release(self, req: Request) -> None:
        """A finished or failed context: its slot is free, the scheduler drops it."""
        with self._lock:
            self._free_locked(req)
        self.scheduler.remove(req)

    def _finish(self, req: Request, reason: str) -> None:
        self._emit(req, ContextDone(req.context, reason, req.frames))
        self._release(req)

    def _fail(self, req: Request, err: BaseException) -> None:
        code = getattr(err, "code", "engine_error")
        self._emit(req, ContextFailed(req.context, code, str(err) or type(err).__name__))
        self._release(req)
