"""The runner owns every tensor of the engine: per-slot pools, static step buffers, CUDA graphs.

Per-context GPU state lives in pools indexed by slot (num_slots + 1 rows: the last is a dummy slot
that padded batch rows write to): the Talker's KV (in pages: a slot's row of the page table names the pages of its
positions, which the engine's PagePool hands out as a context grows, synth/pages.py), the codec-embedding sum of the
last frame
(the next Talker input minus its text token), sampling parameters, seed, repetition-penalty history
(codebook-0 ids seen) and the codec decoder's carried state. Per step the host sends one small int64
block (slot, position, text id, frame index and the page of the position per row: the step writes it into the page
table) and gets back the 16 codes per row, then the
1920 samples per row: one host-to-device and two device-to-host copies a step. A new context's slot is set by an
open graph from two pinned blocks (its slot, eos frame, prefix entry and sampling values), its prompt by a prefill
graph from its cached prompt embeddings and one pinned block (slot, length, text ids): a launch from Python is what
the engine thread pays on the way to first audio, not the work (bench/host_path.py).

Prompt prefixes. A prompt's positions but its last hold no text (instructions, role, the codec prefix; the last is
the first text id + codec bos), so their keys and values are the same for every context of that prompt (a voice,
language and instructions): they are kept, for the last PREFIX_ENTRIES prompts of at most PREFIX_POSITIONS + 1
positions, in a store beside the slots. The open graph copies a context's prefix from the store into its slot and
sets its next Talker input to the prompt's last position's embedding, so its first frame is a Talker step like any
running row's, at that position with its first text id (no prefill on the way to its first audio: the one-row
prefill graph took 2.0 ms of an H200 against 1.5 for the one-row Talker step). A prompt not in the store yet is
prefilled without its last position into the slot of its first context at its open, and copied into the store from
there; that context's frame 0 is a Talker step too, so that every context of a prompt computes its first frame alike
(a prefill's last position and a Talker step differ by rounding: the same request twice gives the same audio). A
prompt with an in-context cloned voice (its text starts within the reference frames) or a longer one is prefilled
whole at its first step, as before.

A step is three parts, each one CUDA graph per batch bucket ([1, 2, 4, 8] + multiples of 16 up to
max_batch; a batch runs in the smallest captured bucket that holds it, padded with dummy rows):
  talker:  x = next_embed[slot] + embed_text(text id); hidden = Talker(x, position, slot)
  codes:   codebook 0 from the Talker head (repetition penalty, control ids suppressed, eos allowed
           from frame 2 unless the length is fixed: fixed_frames or an untrained checkpoint's text rule; one
           kernel on CUDA, which also marks the id in the slot's seen row), 15 code-predictor steps with sampling
           inside, and the embedding sum for the next step
  decode:  one incremental codec-decoder step of those codes -> 1920 samples a row
A row that samples eos makes no frame and changes none of its slot's state but the Talker's KV at its
position, which the slot's next step (if a flushed context goes on) overwrites.
launch() queues a step and returns; codes_of() waits for its codes, audio_of() for its PCM. The next
step needs only the codes, so the host's work between steps (events, scheduling, the next launch) runs
while the GPU decodes: the engine takes step t's codes, launches step t + 1 (queued behind step t's
decode on the same stream), then hands out step t's audio, then waits for step t + 1's codes (a step of new
contexts' first frames alone has its audio handed out before the next launch: Engine._step). All on
one stream, in order: the decoder of step t on a stream of its own beside step t + 1 was measured (H100,
docs/benchmarks.md) and lost at batch 1, where the persistent kernels hold every SM (first PCM 11.0
against 7.8 ms), and hung a GPU test once; at 16-512 rows it saved 4-5% at 16-64 rows and lost 1-3% at
256-512 (H200, 2026-12-04: every part's kernels fill the SMs while they run); on SMs of its own (two green
contexts; docs/experiments/) the decoder and the persistent kernels slowed down more than they overlapped
(5.25 against 3.83 ms a step); beside them on the same SMs, their registers capped to make room
(docs/experiments/), the cap cost more than the overlap saved (3.72-3.83 against 3.71 ms).
New contexts are prefilled eagerly (batched, right-padded: the padding's KV sits beyond the row's
position and is overwritten before it is ever attended) and their last hidden state joins the
running rows' in the codes part, so a new context's first frame and PCM come out of the same step; or
the engine launches them as a step of their own (launch(new, [])) just ahead of the running rows'
(launch([], running)), so that their first PCM is ready after a pass of the new rows alone.
A new context that arrives while a step runs may have its open and frame 0 launched on the first-frame lane
(launch_lane, synth/lane.py): a stream of the highest priority beside the step, with buffers, graphs and a memory
pool of its own; the main stream waits for it before its next open or launch.
A context with an in-context (ICL) cloned voice starts its decoder state where decoding its voice's
reference frames left it: the reference decodes reference + generated frames in one sequence and cuts the
reference's samples off, which this continues exactly (docs/engine.md "Voice cloning"). That state is a
function of the voice alone: it is computed once per voice and kept for the last PRIMED_VOICES voices.
"""
from __future__ import annotations

import bisect
import collections
import contextlib
import functools
import logging
import os
import sys
import time
import types
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from talkgate.synth import compile_cache, precompiled
from talkgate.synth.api import FRAME_SAMPLES, SAMPLE_RATE, SamplingParams, VoicePrompt
from talkgate.synth.lane import LANE_ROWS, LANE_SETS, Lane
from talkgate.synth.model import sample_codes
from talkgate.synth.request import Request
from talkgate.synth.sampling import FLOAT_FIELDS, INT_FIELDS, FrameSampler, RowSampling, kernel_module
from talkgate.synth.voice import cudnn_heuristics, finish, make_voice_prompt

log = logging.getLogger("talkgate.runner")

CODES = 16
INPUT_ROWS = 5                         # a step's inputs per row: slot, position, text id, frame, page of the position
OPEN_FIXED = 4                         # an open's ints before the sampling ones: slot, eos frame, prefix entry, page 0
PARTS = ("talker", "codes", "decode")  # a step's graphs, in launch order
LATER_POLL_S = 0.5                      # adopt_compiles: how often it asks the compile helper
# compile_kinds' prefill tasks: prefill@16, prefill@32, prefill@max -> the prefill lengths T with low < T <= high
PREFILL_TASKS = {"16": (0, 16), "32": (16, 32), "max": (32, float("inf"))}
PREFILL_ROWS = (1, 2, 4)               # prefill graph buckets: new contexts per graph (more: in chunks)
# open graph buckets: contexts whose slots one replay initializes (more: in chunks). Each launch from Python costs
# the engine thread 7 us in a loop and about three times that after the thread idled (a 1-req/s server: H200,
# bench/host_path.py); a new context's slot was 19 launches, 0.7-0.9 ms on the way to its first audio
OPEN_ROWS = (1, 2, 4, 16)
# Captured before the engine reports ready: every prefill graph, the batch buckets up to this size and the
# largest (a batch pads up to the nearest captured bucket); the others one at a time afterwards, when no
# context would notice (Engine, docs/engine.md)
FIRST_AUDIO_BATCH = 16
# Launches whose host buffers may be in use at once: the last step's, whose PCM is taken while the next runs, and
# the next step's two launches where it is split (a new context's first frame launched apart: Engine)
HOST_SETS = 3
LANE_SET = HOST_SETS                   # the first-frame lane's host buffers (synth/lane.py): LANE_SETS from here
# A step's new contexts' first frames may be decoded ahead of its other rows, by a decode of their own, so that their
# audio goes out while the step's decode runs (launch(decode_first=True): Engine); graph buckets of that decode
FIRST_DECODE_ROWS = (1, 2, 4)
NO_EOS = 1 << 40                       # eos allowed from this frame on, for fixed_frames contexts: never
EOS_FROM = 2                           # the reference's min_new_tokens
PRIMED_VOICES = 32                     # ICL voices whose primed decoder state is kept (5.3 MB each, 0.6B/1.7B fp32)
WARMUP_VOICE_S = 10                    # the reference clip of the voice made at warm-up (Base checkpoints)
PRIME_CHUNK = 64                       # reference frames decoded per call when priming
PREFIX_ENTRIES = 32                    # prompts whose prefix keys and values are kept (the last used)
PREFIX_POSITIONS = 64                  # ... for prompts of at most this many positions + 1 (1.7B: 7.3 MB a prompt)


@dataclass
class Launched:
    """One launched step: its rows (decode rows first on the GPU, reported prefill rows first) and
    which of the HOST_SETS sets of host buffers (inputs, codes, PCM) it uses."""
    n: int
    nd: int
    prefill: bool
    buf: int
    positions: int = 0      # the rows' Talker positions summed (a prefill row's: its last prompt position)
    first: "Launched | None" = None     # its new contexts' first frames, decoded ahead of its other rows


def input_columns(rows: int) -> int:
    """The columns of a [INPUT_ROWS, rows] inputs buffer: an even number, so that each of its rows starts 16 bytes after the
    first. Triton specializes a kernel on its pointer arguments' 16-byte alignment, and the inputs' rows are such
    arguments (slots, positions): with an odd row length (an engine sized from a share of its GPU: 255 rows; the
    lane's one row) the kernels that the compile helpers compiled at one row length were compiled again at warm-up by
    every engine or lane whose rows were aligned otherwise (the one-row persistent kernels: 20-27 s of a three-model
    fresh start on an H200, 24 s for a one-row lane; docs/benchmarks.md)."""
    return rows + rows % 2


@dataclass
class StepBuffers:
    """A step's static device buffers (rows [:b] are the batch) and those of its open graphs (columns [:rows] are the
    contexts opened). The runner's main set serves every step; the lane has one of its own (synth/lane.py)."""
    inputs: torch.Tensor            # [INPUT_ROWS, rows]: slot, position, text id, frame, page of the position
    hidden: torch.Tensor            # [rows, hidden]: the Talker's last hidden state
    codes: torch.Tensor             # [rows, 16]
    pcm: torch.Tensor               # [rows, 1920]
    open_ints: torch.Tensor         # [OPEN_FIXED + sampling's int fields, open rows]: slot, eos frame, prefix entry,
                                    # page 0, ...
    open_floats: torch.Tensor       # [sampling's float fields, open rows]

    @classmethod
    def zeros(cls, rows: int, hidden: int, dtype: torch.dtype, open_rows: int) -> "StepBuffers":
        """On the current default device."""
        return cls(torch.zeros(INPUT_ROWS, input_columns(rows), dtype=torch.long), torch.zeros(rows, hidden, dtype=dtype),
                   torch.zeros(rows, CODES, dtype=torch.long), torch.zeros(rows, FRAME_SAMPLES),
                   torch.zeros(OPEN_FIXED + len(INT_FIELDS), open_rows, dtype=torch.long),
                   torch.zeros(len(FLOAT_FIELDS), open_rows))


def fit_bucket(captured: list[int], n: int) -> int:
    """The smallest of the captured buckets (ascending; the largest is always captured) that holds n rows."""
    return captured[bisect.bisect_left(captured, n)]


def batch_buckets(max_batch: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16)) + [max_batch]
    return sorted(set(sizes))


class Runner:
    def __init__(self, tts, num_slots: int, max_frames: int, max_prompt: int, max_batch: int,
                 device: torch.device, dtype: torch.dtype, cuda_graphs: bool = True, torch_compile: bool = True,
                 compile_folder: Path | None = None, lane: bool = False, pages: int | None = None):
        """tts: synth.loader.LoadedTTS. A slot holds max_prompt + max_frames Talker positions; a step takes at
        most max_batch rows (load_runner keeps it within the slots; a compile helper's runner of 2 slots runs
        more, every row on the dummy slot). On CUDA with torch_compile, compile_folder keeps the compiled
        functions (compile_hot_functions). lane: a new context's first frame may be launched beside a step in
        flight (synth/lane.py, launch_lane). pages: the Talker's KV pages (synth/model.py Talker.setup_cache; None:
        every slot all the pages of its positions), handed out by the engine's PagePool."""
        self.tts, self.device, self.dtype = tts, device, dtype
        self.talker, self.predictor, self.decoder = tts.talker, tts.code_predictor, tts.codec_decoder
        self.num_slots, self.max_frames, self.max_prompt = num_slots, max_frames, max_prompt
        self.max_batch = max_batch
        self.dummy = num_slots                          # padded rows write here
        self.codec_eos, self.text_eos, self.text_pad = tts.config.talker.codec_eos, tts.config.tts_eos, tts.config.tts_pad
        self.use_graphs = cuda_graphs and device.type == "cuda"
        if device.type == "cuda":
            # cuDNN times its algorithms per shape once (during warm-up, before capture) and keeps the
            # fastest: the codec decoder's convolutions at batch 1 otherwise get slow defaults
            torch.backends.cudnn.benchmark = True
            # cuBLASLt's heuristics pick faster kernels than cuBLAS's for some of the Talker's and code
            # predictor's projections at 256 rows (the down projections: docs/benchmarks.md "cuBLASLt for every
            # multiply")
            torch.backends.cuda.preferred_blas_library("cublaslt")
        # torch.compile fuses the small elementwise chains of the model's leaf functions (see
        # compile_hot_functions); replayed inside the CUDA graphs they cost no Python time
        self.compiled = torch_compile and device.type == "cuda"
        if self.compiled:
            if compile_folder is None:
                raise ValueError("torch_compile on CUDA needs a compile_folder for the compiled functions")
            log.info("torch.compile: %d methods of the model bound to compiled functions",
                     compile_hot_functions(self.talker, self.predictor, self.decoder, folder=compile_folder))
        # written once a warm-up here has met every kind of input it meets (a fresh start's parallel compile
        # is skipped then: synth/parallel_compile.py)
        self.warmed_marker = warmed_marker(compile_folder, max_prompt) if self.compiled else None
        S, H, B = num_slots + 1, self.talker.hidden_size, max(self.max_batch, 2)
        with torch.device(device):
            self.talker.setup_cache(S, max_prompt + max_frames, device, dtype, pages=pages)
            self.page_len, self.pages = self.talker.page_len, self.talker.kv.shape[2]
            self.slot_pages = self.talker.page_table.shape[1]       # the pages of a slot's positions
            self.prompt_pages = -(-max_prompt // self.page_len)       # ... of a prompt's (a prefill's host block)
            self.dec_state = self.decoder.alloc_state(S)
            self.next_embed = torch.zeros(S, H, dtype=dtype)
            self.sampling = RowSampling.build([SamplingParams(seed=0)] * S, tts.generation_config, device)
            self.min_frames = torch.zeros(S, dtype=torch.long)            # eos allowed from this frame on
            self.seen = torch.zeros(S, self.talker.cfg.vocab_size, dtype=torch.bool)   # codebook-0 ids so far
            self.main = StepBuffers.zeros(B, H, dtype, OPEN_ROWS[-1])
            R = PREFILL_ROWS[-1]
            self.pre_x = torch.zeros(R, max_prompt, H, dtype=dtype)
            self.pre_pos = torch.arange(max_prompt).expand(R, max_prompt)
            # per prefill row: slot, last prompt position, the text id to embed at each position (-1: none), then the
            # pages of its prompt's positions (0: scratch, for the padding's)
            self.pre_in = torch.zeros(R, self._pre_columns(), dtype=torch.long)
            self.pre_h = torch.zeros(R, H, dtype=dtype)
            # prompt prefixes (the module's docstring): entry PREFIX_ENTRIES is none (zeros), what an open without
            # a prefix copies (its prefill writes over it)
            kv = self.talker.kv                       # a prefix fills one page at most
            self.prefix_len = min(PREFIX_POSITIONS, self.page_len)
            self.prefix_kv = torch.zeros(*kv.shape[:2], PREFIX_ENTRIES + 1, kv.shape[3], self.prefix_len,
                                         kv.shape[5], dtype=kv.dtype)
            self.prefix_embed = torch.zeros(PREFIX_ENTRIES + 1, H, dtype=dtype)
        self._prefixes: OrderedDict[object, int] = OrderedDict()     # Prompt -> its entry, the last used last
        # new contexts whose prompt could be kept: found kept (no prefill), or not (prefilled, then kept)
        self.prefix_counts = {"kept": 0, "prefilled": 0}
        pin = self.use_graphs
        # one set of host buffers per launch in flight (HOST_SETS): a launch's inputs may still wait to be copied,
        # its codes and PCM to be read, while the next ones are launched
        self.inputs_host = [torch.zeros(INPUT_ROWS, input_columns(B), dtype=torch.long, pin_memory=pin)
                            for _ in range(HOST_SETS)]
        self.codes_host = [torch.zeros(B, CODES, dtype=torch.long, pin_memory=pin) for _ in range(HOST_SETS)]
        self.pcm_host = [torch.zeros(B, FRAME_SAMPLES, pin_memory=pin) for _ in range(HOST_SETS)]
        self.launches = 0
        cuda = device.type == "cuda"
        self.codes_done = [torch.cuda.Event() if cuda else None for _ in range(HOST_SETS)]
        self.pcm_done = [torch.cuda.Event() if cuda else None for _ in range(HOST_SETS)]
        # pre_in's host blocks, one per prefill chunk of a step: a chunk's copy may still be pending when the next is
        # written (the step before's were read: the engine waited for its codes); then those of the prefixes
        # prefilled at a boundary's opens (read once `opened` is)
        self.pre_host = torch.zeros(self.max_batch // PREFILL_ROWS[-1] + 1, PREFILL_ROWS[-1], self._pre_columns(),
                                    dtype=torch.long, pin_memory=pin)
        self.prefix_host = torch.zeros(S // PREFILL_ROWS[-1] + 1, PREFILL_ROWS[-1], self._pre_columns(),
                                       dtype=torch.long, pin_memory=pin)
        # a step boundary's new contexts, OPEN_ROWS[-1] a chunk: slot, eos frame, prefix entry, page 0, then the sampling values of
        # RowSampling.host_values (open_slots); host blocks per chunk, read by the GPU in stream order (`opened`)
        O, chunks = OPEN_ROWS[-1], -(-S // OPEN_ROWS[-1])
        self.open_ints_host = torch.zeros(chunks, OPEN_FIXED + len(INT_FIELDS), O, dtype=torch.long, pin_memory=cuda)
        self.open_floats_host = torch.zeros(chunks, len(FLOAT_FIELDS), O, pin_memory=cuda)
        self.opened = torch.cuda.Event() if cuda else None
        # keep_warm's operand and event
        self._touch = torch.zeros(1, device=device) if cuda else None
        self._touched = torch.cuda.Event() if cuda else None
        # the first-frame lane (synth/lane.py): its step buffers, its host sets (the last LANE_SETS) and its graphs
        self.lane = None
        if lane:
            with torch.device(device):
                bufs = StepBuffers.zeros(LANE_ROWS, H, dtype, LANE_ROWS)
            self.lane = Lane.on(device, bufs,
                                [torch.zeros(OPEN_FIXED + len(INT_FIELDS), LANE_ROWS, dtype=torch.long,
                                             pin_memory=cuda)
                                 for _ in range(LANE_SETS)],
                                [torch.zeros(len(FLOAT_FIELDS), LANE_ROWS, pin_memory=cuda) for _ in range(LANE_SETS)])
            for _ in range(LANE_SETS):
                self.inputs_host.append(torch.zeros(INPUT_ROWS, input_columns(LANE_ROWS), dtype=torch.long,
                                                    pin_memory=pin))
                self.codes_host.append(torch.zeros(LANE_ROWS, CODES, dtype=torch.long, pin_memory=pin))
                self.pcm_host.append(torch.zeros(LANE_ROWS, FRAME_SAMPLES, pin_memory=pin))
                self.codes_done.append(torch.cuda.Event() if cuda else None)
                self.pcm_done.append(torch.cuda.Event() if cuda else None)
        self._joined = None         # the lane's last launch's end, not waited for by the main stream yet
        # the first frames decoded ahead (launch(decode_first=True)): their buffers, and a PCM host set (with its
        # event) for each of the main ones, from FIRST_SET on (pcm_host and pcm_done only)
        with torch.device(device):
            self.first_bufs = StepBuffers.zeros(FIRST_DECODE_ROWS[-1], H, dtype, 1)
        self.first_set = len(self.pcm_host)
        for _ in range(HOST_SETS):
            self.pcm_host.append(torch.zeros(FIRST_DECODE_ROWS[-1], FRAME_SAMPLES, pin_memory=pin))
            self.pcm_done.append(torch.cuda.Event() if cuda else None)
        self.first_decodes = 0                         # steps whose first frames were decoded ahead
        # the main stream's one- and two-row persistent kernels give way to a lane launch at their layer and pass
        # boundaries (synth/persistent.py, Yield) to the lane's gate, where it can be waited at inside a graph
        self._yield = None
        gate = self.lane.gate if self.lane is not None else None
        if gate is not None and gate.in_graphs and kernel_module("persistent") is not None:
            self._yield = gate
            log.info("the running step's one- and two-row kernels give way to the first-frame lane at their layer "
                     "and pass boundaries")
        # batch 1 has its own graphs although compiled functions specialize size 1 apart (more compiles at
        # warm-up): a padding row costs the code predictor's persistent kernel 0.4 ms a step
        self.buckets = batch_buckets(max(self.max_batch, 2))
        self.prefill_rows = list(PREFILL_ROWS)
        self.prefill_lens = sorted({t for t in (16, 32, 64, 128, 256) if t < max_prompt} | {max_prompt})
        self._primed: OrderedDict[bytes, object] = OrderedDict()     # reference codes -> DecoderState of 1 slot
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.captured: list[int] = []                  # buckets whose three graphs are captured, ascending
        self.pending: collections.deque = collections.deque()     # (part, bucket) graphs still to capture
        self.capture_ms: list[float] = []              # each capture_next()'s duration
        self.captured_later: list[tuple] = []          # the graphs capture_next() captured
        self.warmup_profile: list[tuple[str, float]] = []         # (what, seconds) of warmup()
        self.capture_split: dict[tuple, tuple[float, float]] = {}  # graph -> (its warm run, its capture) s
        self.longest_capture_s = 0.0                   # the longest a graph held the engine thread (warm run + capture)
        self.gpu_wait_s = 0.0                          # the engine thread's time blocked on a step's codes or PCM
        self.roof = None                               # its steps' roofline (synth.roofline.StepRoof): load_runner
        self._pool = self._stream = None
        self.warm = self._warming = False
        self.later = None                              # a compile helper still at kernels (compiling_later)
        self._later_poll = 0.0

    # ----- per-slot state -----
    def open_slots(self, reqs: list[Request]) -> None:
        """Initialize every per-slot tensor of new contexts (engine thread, step boundary): their values go to the
        GPU in one pinned block of each type per chunk of OPEN_ROWS[-1] contexts, and one open graph a chunk sets
        the slots from them, a kept prompt prefix included; the prefixes not kept yet are prefilled into their
        slots then (and kept). Nothing here waits for the GPU: the copies are queued behind the step in flight,
        which keeps running while the engine applies the next commands (the blocks of the boundary before were
        read already: `opened`)."""
        if self.opened is not None:
            self.opened.synchronize()
        self._join_lane()
        entries, missed = self._prefix_entries(reqs)
        O = OPEN_ROWS[-1]
        for c in range(0, len(reqs), O):
            chunk = reqs[c:c + O]
            rows = next(b for b in OPEN_ROWS if b >= len(chunk)) if self.use_graphs else len(chunk)
            eos_from = [EOS_FROM if r.samples_eos else NO_EOS for r in chunk]
            self._stage_opens(self.open_ints_host[c // O], self.open_floats_host[c // O], self.main,
                              [r.slot for r in chunk], eos_from, entries[c:c + O], [self._page(r, 0) for r in chunk],
                              [r.params.sampling for r in chunk], rows)
            g = self.graphs.get(("open", rows))
            if g is not None:
                g.replay()
            else:
                self._open_step(rows, self.main)
        if missed:
            self._keep_prefixes(missed)
        if self.opened is not None:
            self.opened.record()
        for req in reqs:                    # an ICL voice's slot starts from its reference frames' decoder state
            clone = req.prompt.clone if req.prompt is not None else None
            if clone is not None and clone.icl:
                self._prime_slot(req.slot, clone)

    def _prefix_entries(self, reqs: list[Request]) -> tuple[list[int], list[Request]]:
        """Each new context's prefix entry (PREFIX_ENTRIES: none), and those whose prefix is prefilled now: their
        prompt is not kept yet, nor by a context before them in this boundary (whose entry is written after their
        open). Either way a context whose prompt can be kept is `prefixed`: its prompt length is set, and its first
        step is a Talker step at the prompt's last position, so that every context of a prompt computes its first
        frame alike (the same request twice gives the same audio)."""
        entries, missed, new = [], [], set()
        for r in reqs:
            prompt, e = r.prompt, None
            if prompt is not None and self._prefixable(prompt):
                e = None if prompt in new else self._prefixes.get(prompt)
                self.prefix_counts["kept" if e is not None else "prefilled"] += 1
                r.prefixed, r.prompt_len = True, prompt.length
                if e is not None:
                    self._prefixes.move_to_end(prompt)
                else:
                    missed.append(r)
                    new.add(prompt)
            entries.append(PREFIX_ENTRIES if e is None else e)
        return entries, missed

    def _prefixable(self, prompt) -> bool:
        return prompt.text_positions == 1 and prompt.length - 1 <= self.prefix_len

    def _keep_prefixes(self, reqs: list[Request]) -> None:
        """Prefill each context's prompt but its last position into its slot, set its next Talker input to that
        position's embedding, and keep the first of each prompt's in the store (the least recently used entry makes
        room)."""
        prompts = self.tts.prompts
        bases = [prompts.base(r.prompt) for r in reqs]
        self._run_prefills([(r, base[:-1], 0, ()) for r, base in zip(reqs, bases)], self.prefix_host)
        for r, base in zip(reqs, bases):
            self.next_embed[r.slot] = base[-1]
            if r.prompt in self._prefixes:
                continue
            if len(self._prefixes) < PREFIX_ENTRIES:
                e = len(self._prefixes)
            else:
                _, e = self._prefixes.popitem(last=False)
            self._prefixes[r.prompt] = e
            self.prefix_kv[:, :, e] = self.talker.kv[:, :, self._page(r, 0), :, :self.prefix_len]
            self.prefix_embed[e] = base[-1]

    def _stage_opens(self, ints_host: torch.Tensor, floats_host: torch.Tensor, buf: StepBuffers, slots: list[int],
                     eos_from: list[int], entries: list[int], pages: list[int], sampling: list[SamplingParams],
                     rows: int) -> None:
        """Host blocks for opens of `slots` (their eos frames, prefix entries, first pages and sampling) padded to
        `rows` (the padding rows open the dummy slot, into the scratch page, with the first one's values), sent to
        buf's open_ints and open_floats."""
        n = len(slots)
        i, f = ints_host[:, :rows].numpy(), floats_host[:, :rows].numpy()
        i[0, :n], i[1, :n], i[2, :n], i[3, :n] = slots, eos_from, entries, pages
        RowSampling.host_values(sampling, self.tts.generation_config, i[OPEN_FIXED:, :n], f[:, :n])
        i[0, n:], i[3, n:] = self.dummy, 0
        i[1:3, n:], i[OPEN_FIXED:, n:], f[:, n:] = i[1:3, :1], i[OPEN_FIXED:, :1], f[:, :1]
        buf.open_ints.copy_(ints_host, non_blocking=True)      # whole blocks: contiguous
        buf.open_floats.copy_(floats_host, non_blocking=True)

    def _open_step(self, rows: int, buf: StepBuffers) -> None:
        """The slots of buf.open_ints' first `rows` columns set from its open_ints and open_floats (the open graph)."""
        ints, floats = buf.open_ints[:, :rows], buf.open_floats[:, :rows]
        slots, entries, page = ints[0], ints[2], ints[3]
        self.sampling.copy_rows_(slots, ints[OPEN_FIXED:], floats)
        self.min_frames.index_copy_(0, slots, ints[1])
        self.seen.index_fill_(0, slots, False)
        self.dec_state.reset_slots(slots)
        self.talker.page_table[slots, 0] = page
        self.talker.kv[:, :, page, :, :self.prefix_len] = self.prefix_kv[:, :, entries]
        self.next_embed[slots] = self.prefix_embed[entries]

    def _prime_slot(self, slot: int, clone: VoicePrompt) -> None:
        """The slot's decoder state after decoding the voice's reference frames (kept per voice)."""
        state = self.prime_voice(clone)
        s = self.dec_state
        s.tails[slot], s.kv[:, slot], s.pos[slot] = state.tails[0], state.kv[:, 0], state.pos[0]

    def prime_voice(self, clone: VoicePrompt):
        """An ICL voice's one-slot DecoderState after its reference frames, kept for the last PRIMED_VOICES
        voices (engine thread: at an open, or as the voice is made: priming)."""
        return finish(self.priming(clone))

    def priming(self, clone: VoicePrompt):
        """prime_voice in steps (a generator returning the state): it yields between chunks of PRIME_CHUNK
        reference frames, so that a voice being made delays a step by one chunk's decode at most."""
        state = self._primed.get(clone.codes)
        if state is not None:
            self._primed.move_to_end(clone.codes)
            return state
        codes = torch.from_numpy(clone.codes_array()).to(self.device).T[None]      # [1, 16, frames]
        state = self._primed[clone.codes] = yield from self._prime_chunks(codes)
        if len(self._primed) > PRIMED_VOICES:
            self._primed.popitem(last=False)
        return state

    def _make_warmup_voice(self) -> None:
        noise = np.random.default_rng(0).uniform(-0.3, 0.3, WARMUP_VOICE_S * SAMPLE_RATE).astype(np.float32)
        voice = make_voice_prompt(self.tts, noise, SAMPLE_RATE, "warm-up")
        self.prime_decoder(torch.from_numpy(voice.codes_array()).to(self.device).T[None])

    def prime_decoder(self, codes: torch.Tensor):
        """codes [1, 16, frames] -> a one-slot DecoderState that has decoded them (output discarded)."""
        return finish(self._prime_chunks(codes))

    def _prime_chunks(self, codes: torch.Tensor):
        with torch.inference_mode():
            state = self.decoder.alloc_state(1)
            one = torch.zeros(1, dtype=torch.long, device=self.device)
        for i in range(0, codes.shape[-1], PRIME_CHUNK):
            if i:
                yield
            with torch.inference_mode(), plain_functions(self.decoder, PLAIN_WHEN_PRIMING):
                self.decoder.decode_step(codes[..., i:i + PRIME_CHUNK], one, state)
        return state

    # ----- one step -----
    @torch.inference_mode()
    def launch(self, prefill: list[Request], decode: list[Request], decode_first: bool = False) -> Launched:
        """Queue frame `frames` of every row: Talker, codes (then copied back), decoder (then copied back). The new
        contexts with a kept prefix (`prefixed`) come first in `prefill` (Engine): their frame 0 is a Talker step
        beside the running rows'; the others' is their prompt's prefill. decode_first (at most FIRST_DECODE_ROWS[-1]
        new contexts beside running ones): the new contexts' first frames are decoded ahead of the others' and copied
        back on their own (the launch's `first`)."""
        self._join_lane()
        nd, n = len(decode), len(prefill) + len(decode)
        nt = nd + sum(r.prefixed for r in prefill)          # rows of the Talker step
        # decode rows first in the static buffers; a prefill row's position 0 is only written by the
        # talker graph's padding rows, and the prefill that runs after it overwrites it
        rows = decode + prefill
        b = self._bucket(n)
        launched = Launched(n, nd, bool(prefill), self.launches % HOST_SETS)
        self.launches += 1
        inputs_host = self.inputs_host[launched.buf]
        host = inputs_host.numpy()
        host[:, :n] = np.array([self._row(r, max(r.prompt_len + r.frames - 1, 0)) for r in rows], dtype=np.int64).T
        host[:, n:b] = np.array([[self.dummy], [0], [self.text_pad], [0], [0]])
        self.main.inputs[:, :b].copy_(inputs_host[:, :b], non_blocking=True)
        if nt:
            self._run("talker", self._bucket(nt))
        if nt < n:
            self._prefill(prefill[nt - nd:], nt)
        launched.positions = int(host[1, :nt].sum()) + sum(r.prompt_len - 1 for r in prefill[nt - nd:])
        self._gate()
        self._run("codes", b)
        self._copy_back(self.codes_host, self.codes_done, launched.buf, self.main.codes[:n])
        if decode_first and 0 < nd < n <= nd + FIRST_DECODE_ROWS[-1]:
            launched.first = self._decode_first(nd, n, launched.buf)
        self._gate()
        self._run("decode", b)
        self._copy_back(self.pcm_host, self.pcm_done, launched.buf, self.main.pcm[:n])
        return launched

    def _decode_first(self, nd: int, n: int, s: int) -> Launched:
        """Rows nd..n - 1 (the new contexts) decoded by themselves from the step's codes, their PCM copied back into
        the first host set of s; the step's decode then takes their slots for the dummy slot (their frame is made)."""
        nf, f = n - nd, self.first_bufs
        rows = next(r for r in FIRST_DECODE_ROWS if r >= nf) if self.use_graphs else nf
        f.codes[:nf] = self.main.codes[nd:n]
        f.inputs[0, :nf] = self.main.inputs[0, nd:n]
        if rows > nf:
            f.inputs[0, nf:rows] = self.dummy
        self.main.inputs[0, nd:n] = self.dummy
        g = self.graphs.get(("first", rows))
        if g is not None:
            g.replay()
        else:
            self._decode_step(rows, f)
        first = Launched(nf, 0, False, self.first_set + s)
        self._copy_back(self.pcm_host, self.pcm_done, first.buf, f.pcm[:nf])
        self.first_decodes += 1
        return first

    def kept_prefix(self, prompt) -> bool:
        """Whether a new context of `prompt` opens from a kept prefix (no prefill: what the lane can take)."""
        return prompt is not None and self._prefixable(prompt) and prompt in self._prefixes

    @torch.inference_mode()
    def launch_lane(self, req: Request, open_slot: bool = True) -> Launched:
        """Queue a new context's open and first frame on the lane (synth/lane.py), beside the step in flight: its
        slot set from its kept prefix (kept_prefix) and its sampling values (open_slot False: a context opened at a
        step boundary, `prefixed`, whose slot is set already), then a one-row Talker step at its prompt's last
        position, its codes and its decode, copied back as a step's are (codes_of, audio_of). At most LANE_SETS
        lane launches in flight, each behind the one before it on the lane's stream: a launch's host buffers are read
        (audio_of) before the LANE_SETS-th one after it. The main stream's next open or launch waits for the last."""
        lane = self.lane
        if open_slot:
            e = self._prefixes[req.prompt]
            self._prefixes.move_to_end(req.prompt)
            self.prefix_counts["kept"] += 1
            req.prefixed, req.prompt_len = True, req.prompt.length
        k = lane.launches % LANE_SETS
        s = LANE_SET + k
        launched = Launched(1, 0, True, s, positions=req.prompt_len - 1)
        lane.launches += 1
        with torch.cuda.stream(lane.stream) if lane.stream is not None else contextlib.nullcontext():
            if self.opened is not None:
                lane.stream.wait_event(self.opened)             # the prefix store and slots as the opens left them
            if open_slot:
                self._stage_opens(lane.open_ints_host[k], lane.open_floats_host[k], lane.bufs, [req.slot],
                                  [EOS_FROM if req.samples_eos else NO_EOS], [e], [self._page(req, 0)],
                                  [req.params.sampling], LANE_ROWS)
            inputs_host = self.inputs_host[s]
            inputs_host.numpy()[:, 0] = self._row(req, req.prompt_len - 1)
            lane.bufs.inputs.copy_(inputs_host, non_blocking=True)
            parts = self._parts_of(lane.bufs)
            # raised after the wait for `opened`, so that the main stream never waits at the gate for work queued
            # behind its own; lowered whatever happens, or the main stream would wait for ever
            if lane.gate is not None:
                lane.gate.up(lane.stream)
            try:
                for part in ("open", *PARTS) if open_slot else PARTS:
                    g = self.graphs.get(("lane", part))
                    if g is not None:
                        g.replay()
                    elif part == "open":
                        self._open_step(LANE_ROWS, lane.bufs)
                    else:
                        parts[part](LANE_ROWS)
                    if part == "codes":
                        self._copy_back(self.codes_host, self.codes_done, s, lane.bufs.codes[:LANE_ROWS])
            finally:
                if lane.gate is not None:
                    lane.gate.down(lane.stream)
            self._copy_back(self.pcm_host, self.pcm_done, s, lane.bufs.pcm[:LANE_ROWS])
            self._joined = self.pcm_done[s]
        return launched

    @staticmethod
    def _copy_back(host: list, done: list, s: int, rows: torch.Tensor) -> None:
        """Queue the copy of a launch's `rows` (codes or PCM) into host set s, and record its event (CUDA)."""
        host[s][:len(rows)].copy_(rows, non_blocking=True)
        if done[s] is not None:
            done[s].record()

    def _gate(self) -> None:
        """The main stream's next part waits while a lane launch runs (synth/stream_gate.py)."""
        if self.lane is not None and self.lane.gate is not None:
            self.lane.gate.wait(torch.cuda.current_stream())

    def _join_lane(self) -> None:
        """The main stream waits for the lane's last launch (its context's slot, or a slot freed meanwhile and
        opened again, is the main stream's from here on)."""
        if self._joined is not None:
            torch.cuda.current_stream().wait_event(self._joined)
            self._joined = None

    def keep_warm(self) -> bool:
        """One small operation on the engine's stream, waited for as a step's codes are (an idle engine's touch of the
        GPU: synth/engine.py KEEP_WARM_S); True where it touched. Not where the stream has work queued (engines that
        share this thread and its stream: another's step, which the wait would sit behind, keeps the path warm
        anyway), and not on the CPU."""
        if self._touch is None or not torch.cuda.current_stream().query():
            return False
        self._touch.add_(1)
        self._touched.record()
        self._touched.synchronize()
        return True

    def codes_ready(self, step: Launched) -> bool:
        """Whether codes_of(step) would return without waiting."""
        return self.codes_done[step.buf] is None or self.codes_done[step.buf].query()

    def audio_ready(self, step: Launched) -> bool:
        """Whether audio_of(step) would return without waiting."""
        return self.pcm_done[step.buf] is None or self.pcm_done[step.buf].query()

    def codes_of(self, step: Launched) -> np.ndarray:
        """[rows, 16] int64 codes of a launched step (waits for them), prefill rows first. Valid until
        HOST_SETS more steps are launched."""
        if self.codes_done[step.buf] is not None:
            self._wait(self.codes_done[step.buf])
        return self._prefill_first(step, self.codes_host[step.buf][:step.n].numpy())

    def audio_of(self, step: Launched) -> np.ndarray:
        """[rows, 1920] float32 PCM of a launched step (waits for it), prefill rows first. Valid until
        HOST_SETS more steps are launched."""
        if self.pcm_done[step.buf] is not None:
            self._wait(self.pcm_done[step.buf])
        return self._prefill_first(step, self.pcm_host[step.buf][:step.n].numpy())

    def _wait(self, event) -> None:
        t0 = time.perf_counter()
        event.synchronize()
        self.gpu_wait_s += time.perf_counter() - t0

    @staticmethod
    def _prefill_first(step: Launched, out: np.ndarray) -> np.ndarray:
        return np.concatenate([out[step.nd:], out[:step.nd]]) if step.prefill and step.nd else out

    def _bucket(self, n: int) -> int:
        """The batch size n runs at: the smallest captured bucket that holds it (CPU and eager: n)."""
        if not self.use_graphs or not self.captured:
            return n
        return fit_bucket(self.captured, n)

    def _run(self, part: str, b: int) -> None:
        g = self.graphs.get((part, b))
        if g is not None:
            g.replay()
        else:
            with self._yielding():
                self._parts[part](b)

    def _yielding(self):
        """Within: the main stream's parts, captured or run, yield to the lane (_yield; none: a null context)."""
        if self._yield is None:
            return contextlib.nullcontext()
        return kernel_module("persistent").yielding(self._yield)

    def _row(self, req: Request, pos: int) -> tuple[int, int, int, int, int]:
        """A step's inputs for req's row at Talker position pos."""
        return req.slot, pos, req.next_text_id(self.text_eos, self.text_pad), req.frames, self._page(req, pos)

    def _page(self, req: Request, pos: int) -> int:
        """The page of req's position pos: of its pages (the engine's PagePool), or where it has none (a runner driven
        without a pool: bench tools) its slot's own in the table setup_cache made."""
        if req.pages:
            return req.pages[pos // self.page_len]
        return 1 + req.slot * self.slot_pages + pos // self.page_len

    def _pre_columns(self) -> int:
        return 2 + self.max_prompt + self.prompt_pages

    def _prefill(self, reqs: list[Request], row0: int) -> None:
        """Prompt + text token 0 of each new context into its KV; last hidden -> hidden[row0 + i]."""
        prompts = self.tts.prompts
        items = []
        for r in reqs:
            base = prompts.base(r.prompt)
            at, text = prompts.text_part(r.prompt, r.prefill_track(self.text_eos, self.text_pad))
            items.append((r, base, at, text))
            r.prompt_len = base.shape[0]
        self._run_prefills(items, self.pre_host, row0)

    def _run_prefills(self, items: list[tuple], blocks: torch.Tensor, row0: int | None = None) -> None:
        """Prefill (context, embeddings [T, H], at, text ids) items into their slots' KV (the pages of their
        positions), the text ids embedded and added from position `at` on; with row0, the last position's hidden
        state -> hidden[row0 + i].
        Right-padded rows and lengths (a padding position's K/V lies beyond the row's position and is
        overwritten before it is ever attended); one CUDA graph per (rows, length) bucket, which embeds the
        rows' text ids (pre_in) and adds them to their prompts' cached embeddings (pre_x): a chunk costs the
        engine thread a copy per row, one host block's copy (blocks[chunk]) and the replay."""
        R = PREFILL_ROWS[-1]
        for i in range(0, len(items), R):
            chunk = items[i:i + R]
            n = len(chunk)
            block = blocks[i // R]
            host = block.numpy()
            lengths = []
            P = 2 + self.max_prompt                                        # the pages' columns
            for j, (req, base, at, text) in enumerate(chunk):
                self.pre_x[j, :base.shape[0]] = base
                lengths.append(base.shape[0])
                host[j, :2] = req.slot, base.shape[0] - 1
                host[j, 2:P] = -1
                host[j, 2 + at:2 + at + len(text)] = text
                used = -(-base.shape[0] // self.page_len)
                host[j, P:P + used] = [self._page(req, k * self.page_len) for k in range(used)]
                host[j, P + used:] = 0
            rows = next(b for b in self.prefill_rows if b >= n) if self.use_graphs else n
            T = next(t for t in self.prefill_lens if t >= max(lengths)) if self.use_graphs else max(lengths)
            host[n:rows] = -1                                              # padding rows: the dummy slot
            host[n:rows, :2] = self.dummy, 0
            host[n:rows, P:] = 0
            self.pre_in.copy_(block, non_blocking=True)                    # the whole block: contiguous
            g = self.graphs.get(("prefill", rows, T))
            if g is not None:
                g.replay()
            else:
                self._prefill_step(rows, T)
            if row0 is not None:
                self.main.hidden[row0 + i:row0 + i + n] = self.pre_h[:n]

    def _prefill_step(self, rows: int, T: int) -> None:
        slots, last, ids = self.pre_in[:rows, 0], self.pre_in[:rows, 1], self.pre_in[:rows, 2:2 + T]
        self.talker.page_table[slots, :self.prompt_pages] = self.pre_in[:rows, 2 + self.max_prompt:]
        text = torch.where((ids >= 0)[..., None], self.talker.embed_text(ids.clamp_min(0)), 0)
        h = self.talker(self.pre_x[:rows, :T] + text, self.pre_pos[:rows, :T], slots, fresh=True)
        self.pre_h[:rows] = h[torch.arange(rows, device=h.device), last]

    # ----- the two captured parts -----
    def _talker_step(self, b: int, buf: StepBuffers) -> None:
        slots, pos, text = buf.inputs[0, :b], buf.inputs[1, :b], buf.inputs[2, :b]
        self.talker.page_table[slots, pos // self.page_len] = buf.inputs[4, :b]
        x = self.next_embed[slots] + self.talker.embed_text(text)
        buf.hidden[:b] = self.talker(x[:, None], pos[:, None], slots)[:, 0]

    def _codes_step(self, b: int, buf: StepBuffers) -> None:
        slots, frame = buf.inputs[0, :b], buf.inputs[3, :b]
        h = buf.hidden[:b]
        sampler = FrameSampler(self.sampling, frame, slots)
        codes, embed_sum = sample_codes(self.talker, self.predictor, h, sampler, self.seen,
                                        frame >= self.min_frames[slots])
        # an eos row makes no frame: its slot keeps the state it had (eos is not marked seen; the dummy slot
        # takes the row's embedding), so a flushed context goes on from its last frame when more text comes
        # (Engine, FlushText)
        kept = torch.where(codes[:, 0] == self.codec_eos, self.dummy, slots)
        self.next_embed[kept] = embed_sum.to(self.dtype)
        buf.codes[:b] = codes

    def _decode_step(self, b: int, buf: StepBuffers) -> None:
        codes = buf.codes[:b, :, None]
        # an eos frame is never emitted (its codebook-0 id is out of the decoder's range) and leaves its slot's
        # decoder state as it was
        eos = codes[:, 0, 0] == self.codec_eos
        codes = torch.cat([torch.where(eos[:, None, None], 0, codes[:, :1]), codes[:, 1:]], 1)
        buf.pcm[:b] = self.decoder.decode_step(codes, torch.where(eos, self.dummy, buf.inputs[0, :b]), self.dec_state)

    # ----- warm-up and capture -----
    def warmup(self, first_audio_only: bool = False) -> None:
        """Run every part once, which compiles all that ever compiles (the general kind at the largest
        batch, so that Inductor tunes its kernels there, as before; the one-row, two-row and prefill kinds
        as their graphs are captured), then capture the graphs a first audio needs: every prefill graph,
        the buckets up to FIRST_AUDIO_BATCH and the largest. The other buckets are captured here too unless
        first_audio_only; then capture_next() captures them one at a time later. Runs once."""
        if self.warm:
            return
        self.warm = self._warming = True
        with torch.inference_mode():
            self._dummy_inputs()
            B = self.buckets[-1]
            for part in PARTS:
                search = part == "decode" and torch.backends.cudnn.benchmark
                if search:          # first without cuDNN's algorithm search (its compiles and traces alone)
                    with cudnn_heuristics():
                        self._timed(f"{part}@{B} eager", self._parts[part], B)
                self._timed(f"{part}@{B} " + ("cuDNN search" if search else "eager"), self._parts[part], B)
            self.pre_in[:, 0] = self.dummy
            self._timed("prefill eager", self._prefill_step, self.prefill_rows[-1], self.prefill_lens[0])
            if self.tts.config.model_type == "base":
                # a cloned voice's first-call costs now, not in the first upload: the speaker and codec
                # encoders (2.4-3.5 s on an H100 at first) and an ICL voice's decoder priming
                self._timed("make voice", self._make_warmup_voice)
            if self.use_graphs:
                self._capture_first(first_audio_only)
        self._warming = False
        if self.later is None:
            self._mark_warmed()
        log.info("warm-up: %s", ", ".join(f"{what} {sec:.2f} s" for what, sec in self.warmup_profile))
        if self.capture_split:
            warm, capture = (sum(x) for x in zip(*self.capture_split.values()))
            log.info("warm-up captures: %d graphs, their warm runs %.2f s (new kinds compiled, cuDNN searches), "
                     "the captures %.2f s", len(self.capture_split), warm, capture)
        if not self.pending:
            log.info("all %d graphs captured", len(self.graphs))

    def _mark_warmed(self) -> None:
        if self.warmed_marker is not None:
            try:
                self.warmed_marker.touch()
            except OSError as e:                  # a read-only cache: the next fresh start compiles in helpers again
                log.warning("warm-up not marked done in the compile cache (%s)", e)

    def compiling_later(self, helpers) -> None:
        """`helpers` (synth/parallel_compile.Helpers) still compile the persistent kernels of two rows
        (parallel_compile.LATE): until adopt_compiles() finds them done, two rows run the general kinds."""
        self.later = helpers
        for model in (self.talker, self.predictor):
            model.persistent_rows = 1

    def adopt_compiles(self) -> bool:
        """Between steps (the engine thread), at most every LATER_POLL_S: once the helper of compiling_later has
        ended, two rows take the persistent kernels it compiled (their graphs are captured again, pending) and
        the cache is marked warmed; a helper that failed leaves two rows on the general kinds. True once
        adopted."""
        if self.later is None:                 # every turn of the engine loop: nothing more while nothing compiles
            return False
        now = time.perf_counter()
        if now < self._later_poll:
            return False
        self._later_poll = now + LATER_POLL_S
        ok = self.later.late_done()
        if ok is None:
            return False
        self.later = None
        if not ok:
            log.warning("the persistent kernels of two rows were not compiled: two rows keep the general kinds")
            return False
        for model in (self.talker, self.predictor):
            del model.persistent_rows
        if self.use_graphs and self.warm:
            self.pending.extendleft((part, 2) for part in ("codes", "talker"))   # again, with the kernels
        if self.warm:
            self._mark_warmed()
        log.info("the persistent kernels of two rows compiled: two rows take them%s",
                 " once their graphs are captured again" if self.use_graphs and self.warm else "")
        return True

    def finish_compiles(self) -> None:
        """Wait for the helper of compiling_later and adopt its kernels (`talkgate warmup`: the cache complete)."""
        if self.later is not None:
            self.later.wait_late()
            self._later_poll = 0.0
            self.adopt_compiles()

    def _capture_first(self, first_audio_only: bool) -> None:
        torch.cuda.synchronize()
        self._pool, self._stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
        B = self.buckets[-1]
        first = [b for b in self.buckets if b <= FIRST_AUDIO_BATCH or b == B]
        # every graph's warm run searches cuDNN's algorithms (cudnn.benchmark): its heuristics pick channels-last
        # kernels up to 100x slower for some of the decoder's shapes (docs/benchmarks.md)
        for b in reversed(first):
            for part in PARTS:
                self._timed(f"{part}@{b}", self._capture, (part, b), self._parts[part], b)
            self.captured.insert(0, b)
        for rows in reversed(self.prefill_rows):
            for T in reversed(self.prefill_lens):
                self._timed(f"prefill {rows}x{T}", self._capture, ("prefill", rows, T), self._prefill_step, rows, T)
        # the open graphs warm up and are captured on opens of the dummy slot
        self._stage_opens(self.open_ints_host[0], self.open_floats_host[0], self.main, [self.dummy], [EOS_FROM],
                          [PREFIX_ENTRIES], [0], [SamplingParams(seed=0)], OPEN_ROWS[-1])
        for rows in OPEN_ROWS:
            self._timed(f"open {rows}", self._capture, ("open", rows), self._open_step, rows, self.main)
        if self.lane is not None:
            self._capture_lane()
        self._dummy_inputs(self.first_bufs)
        for rows in FIRST_DECODE_ROWS:
            self._timed(f"first decode {rows}", self._capture, ("first", rows),
                        functools.partial(self._decode_step, buf=self.first_bufs), rows)
        self.pending.extend((part, b) for b in self.buckets if b not in first for part in PARTS)
        t0 = time.perf_counter()
        while not first_audio_only and self.capture_next() is not None:
            pass
        if self.capture_ms:
            self.warmup_profile.append((f"{len(self.capture_ms)} more graphs", time.perf_counter() - t0))
        torch.cuda.synchronize()
        torch.cuda.empty_cache()         # cuDNN's algorithm search workspaces, no longer needed

    def compile_kinds(self, tasks: list[str]) -> None:
        """Run the warm-up's parts named by `tasks` once each, eagerly, which compiles the kinds of input they
        meet into the caches, as warmup() would (a compile helper's work: synth/parallel_compile.py). A task is
        prefill@16, prefill@32 or prefill@max (the prefill lengths of PREFILL_TASKS, four rows first as warm-up
        meets them), PART@B at the largest batch (the general kinds, tuned at that
        size, as warm-up tunes them), PART@1 (the one-row kinds and persistent kernels), or PART@2, which runs
        with the plain functions so that it compiles only the persistent kernels of two rows and never a
        general kind at two rows. The decoder's step is three tasks, its two longest compiles apart:
        early_convs@B and late_convs@B run it with only that half of the decoder's convs compiled, decode@B
        with all but those."""
        halves = ("early_convs", "late_convs")
        with torch.inference_mode():
            self._dummy_inputs()
            for task in tasks:
                part, b = task.split("@")
                if part == "prefill":
                    self.pre_in[:, 0] = self.dummy
                    low, high = PREFILL_TASKS[b]
                    for T in [t for t in self.prefill_lens if low < t <= high]:
                        for rows in reversed(self.prefill_rows):
                            self._timed(f"prefill {rows}x{T}", self._prefill_step, rows, T)
                    continue
                with contextlib.ExitStack() as plain:
                    if b == "2":
                        for root in (self.talker, self.predictor, self.decoder):
                            plain.enter_context(plain_functions(root, HOT_NAMES))
                    elif part in halves:
                        plain.enter_context(plain_functions(self.decoder, tuple(n for n in HOT_NAMES if n != part)))
                    elif part == "decode":
                        plain.enter_context(plain_functions(self.decoder, halves))
                    self._timed(task, self._parts["decode" if part in halves else part], int(b))

    def capture_next(self) -> float | None:
        """Capture the next pending batch graph (engine thread, between steps) and return its
        milliseconds; None when none is pending. A bucket serves batches once its three graphs are; a graph
        captured again (adopt_compiles) replaces the one that served until then."""
        if not self.pending:
            return None
        t0 = time.perf_counter()
        compiles = _compiled_graphs()
        part, b = self.pending[0]               # pending until captured (stats() reads it meanwhile)
        with torch.inference_mode():
            self._dummy_inputs()                # only the dummy slot's state changes
            self._capture((part, b), self._parts[part], b)
        self.captured_later.append(self.pending.popleft())
        if part == PARTS[-1] and b not in self.captured:
            bisect.insort(self.captured, b)
        if not self.pending:
            torch.cuda.empty_cache()
        ms = (time.perf_counter() - t0) * 1000
        self.capture_ms.append(ms)
        self.longest_capture_s = max(self.longest_capture_s, ms / 1000)
        if _compiled_graphs() != compiles:
            log.warning("capturing %s@%d compiled (a kind of input warmup() did not meet): %.0f ms", part, b, ms)
        if not self.pending and not self._warming:
            warm = sum(self.capture_split[(p, b)][0] for p, b in self.captured_later)
            log.info("all %d graphs captured; the last %d after warm-up in %.2f s (each at most %.0f ms; their "
                     "warm runs, cuDNN's searches mostly, %.2f s)", len(self.graphs), len(self.capture_ms),
                     sum(self.capture_ms) / 1000, max(self.capture_ms), warm)
        return ms

    def _parts_of(self, buf: StepBuffers) -> dict:
        """The step's parts over `buf`, each a function of the batch size."""
        return {part: functools.partial(fn, buf=buf) for part, fn in
                (("talker", self._talker_step), ("codes", self._codes_step), ("decode", self._decode_step))}

    @functools.cached_property
    def _parts(self) -> dict:
        return self._parts_of(self.main)

    def _dummy_inputs(self, buf: StepBuffers | None = None) -> None:
        buf = buf or self.main
        buf.inputs.zero_()
        buf.inputs[0] = self.dummy

    def _timed(self, what: str, fn, *args, **kw) -> None:
        t0 = time.perf_counter()
        fn(*args, **kw)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.warmup_profile.append((what, time.perf_counter() - t0))

    def _capture_lane(self) -> None:
        """The lane's open and step graphs (synth/lane.py), over its buffers, on its stream, into its pool: opens
        and a step of the dummy slot."""
        lane = self.lane
        self._stage_opens(lane.open_ints_host[0], lane.open_floats_host[0], lane.bufs, [self.dummy], [EOS_FROM],
                          [PREFIX_ENTRIES], [0], [SamplingParams(seed=0)], LANE_ROWS)
        self._dummy_inputs(lane.bufs)
        parts = {"open": functools.partial(self._open_step, buf=lane.bufs), **self._parts_of(lane.bufs)}
        for part in ("open", *PARTS):
            self._timed(f"lane {part}", self._capture, ("lane", part), parts[part], LANE_ROWS,
                        stream=lane.stream, pool=lane.pool)

    def _capture(self, key: tuple, fn, *args, stream=None, pool=None) -> None:
        """Warm this size outside the capture (cuDNN searches its algorithms there), then capture it into the
        shared pool (or `pool`), on a stream of its own (or `stream`) behind the work already queued. Not
        torch.cuda.graph: it synchronizes the device and empties the allocator's cache at every capture, which a
        capture between two steps must not do."""
        main = stream is None
        s = stream or self._stream
        pool = pool or self._pool
        s.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        t0 = time.perf_counter()
        with torch.cuda.stream(s), self._yielding() if main else contextlib.nullcontext():
            fn(*args)
            s.synchronize()
            t1 = time.perf_counter()
            g.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                fn(*args)
            finally:
                g.capture_end()
        torch.cuda.current_stream().wait_stream(s)
        self.graphs[key] = g
        self.capture_split[key] = (t1 - t0, time.perf_counter() - t1)
        self.longest_capture_s = max(self.longest_capture_s, sum(self.capture_split[key]))


def _compiled_graphs() -> int:
    """How many graphs Dynamo has compiled in this process (0 where it was never imported)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return utils.counters["stats"]["unique_graphs"] if utils is not None else 0


HOT_FUNCTIONS = (("model", "RMSNorm", "forward"), ("model", "RMSNorm", "residual"), ("model", "Attention", "qkv"),
                 ("model", "MLP", "forward"), ("codec_decoder", "RMSNorm", "residual"), ("codec_decoder", "Mlp", "forward"),
                 ("codec_decoder", "CodecDecoder", "codes_in"), ("codec_decoder", "CodecDecoder", "early_convs"),
                 ("codec_decoder", "CodecDecoder", "late_convs"))
HOT_NAMES = tuple(sorted({name for _, _, name in HOT_FUNCTIONS}))
_compiled: dict = {}           # (function, folder) -> its compiled version (a plain function), shared by every instance


def compile_hot_functions(*modules: torch.nn.Module, folder: str | os.PathLike) -> int:
    """torch.compile the model's leaf functions that every layer and every codebook calls (RMSNorm,
    q/k/v with q/k norm and RoPE, the SwiGLU MLP; the decoder transformer's SwiGLU MLP and layer-scaled
    residual add with the next norm), and the decoder's parts before and after its transformer whole
    (CodecDecoder.codes_in, early_convs and late_convs: the SnakeBetas, conv tails and window gathers fused
    around the multiplies): a frame is otherwise about 7,000 kernels of 1-5 us, mostly elementwise. Small graphs
    compile in seconds, the decoder's parts in about a minute (a whole-step compile took over 5 minutes).
    Compiled ahead of time, one kind of input at a time, and kept with their traces under `folder`
    (synth/precompiled.py; their kernels under compile_cache's folder), so that the next start loads them.
    Bound onto the instances inside `modules` only (the classes, and other models such as a CPU copy, keep
    the plain functions); one compiled function per method, shared by all its instances, as a kind of input
    is a kind whatever the instance. Idempotent; returns how many methods were bound."""
    import importlib

    # A function compiles once for each kind of input it meets (TORCH_LOGS=recompiles on the H100: a batch of
    # 1 or more, as dynamo specializes size 1; a contiguous tensor or a slice; made inside or outside
    # inference mode, whose dispatch keys differ; a prefill's length). Only the batch is marked dynamic
    # (precompiled._mark_batch_dynamic): with every size symbolic (dynamic=True) a restart's Dynamo traces took
    # 2-3x as long (the decoder's convs 13-17 s against 6 s at 1.7B on an H100) for kernels no faster
    # (docs/benchmarks.md, issue 22). The recompile limit bounds the kinds torch.compile's own path keeps
    # where a kind could not be compiled ahead of time (past the default of 8, which RMSNorm.residual passed
    # at the end of a 1.7B warm-up with 9 kinds, dynamo ran each new kind unfused inside the graphs).
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    precompiled.enable()
    folder = precompiled.code_folder(folder)
    # Not the decoder's whole step: it updates the per-slot state pools in place, which inductor copies
    # whole (5 ms a step). The sampler is one Triton kernel of its own (synth/sample_kernel.py).
    hot = {(getattr(importlib.import_module(f"talkgate.synth.{mod}"), cls), name) for mod, cls, name in HOT_FUNCTIONS}
    bound = 0
    for root in modules:
        for m in root.modules():
            for owner, name in hot:
                if isinstance(m, owner) and name not in vars(m):
                    fn = getattr(type(m), name)
                    if (fn, folder) not in _compiled:
                        where = folder / f"{fn.__module__}.{fn.__qualname__}"
                        _compiled[fn, folder] = precompiled.PrecompiledFunction(fn, where).function()
                    setattr(m, name, types.MethodType(_compiled[fn, folder], m))
                    bound += 1
    return bound


# Priming decodes up to PRIME_CHUNK frames a call, once per stored voice, with the plain functions: the
# decoder's compiled convs (early_convs, late_convs) do not build for a many-frame chunk (Inductor folds an index
# into an int32 constant that overflows, 1.7B Base on an H100), and cuDNN's algorithm search would run again for every new
# chunk length (a search takes up to a second).
PLAIN_WHEN_PRIMING = ("codes_in", "early_convs", "late_convs")


@contextlib.contextmanager
def plain_functions(root: torch.nn.Module, names: tuple[str, ...]):
    """Within: `root`'s modules run the class functions `names`, not the compiled ones that
    compile_hot_functions bound onto them, and cuDNN takes its heuristic algorithms (the engine thread only,
    between steps: nothing else launches then)."""
    unbound = [(m, name, vars(m).pop(name)) for m in root.modules() for name in names if name in vars(m)]
    try:
        with cudnn_heuristics():
            yield
    finally:
        for m, name, fn in unbound:
            setattr(m, name, fn)


def compile_folder(config, root: Path, device: torch.device, dtype: torch.dtype, decoder_dtype: torch.dtype) -> Path:
    """The compiled functions' folder of this checkpoint (its TTSConfig and folder) on this CUDA device, with
    Inductor's and Triton's caches pointed beside it (compile_cache.use)."""
    gpu, versions, shape = compile_cache.describe(config, root, device, dtype, decoder_dtype)
    folder = compile_cache.use(compile_cache.cache_key(gpu, versions, shape),
                               {"gpu": gpu, "versions": versions, "shape": shape})
    log.info("compile cache: %s", folder)
    return folder / compile_cache.FUNCTIONS


def warmed_marker(functions: Path, max_prompt: int) -> Path:
    """The file a warm-up that ran to its end writes: every kind of input it meets is saved under
    `functions` for this version of the code (prefill lengths depend on max_prompt)."""
    return precompiled.code_folder(functions) / f"warmed-prompt{max_prompt}"
