"""Building the engine's runner from a checkpoint, its slots sized from the GPU memory left.

    runner, tokenizer_factory, prompts, info = load_runner(path_or_id, device, dtype, ...)
    finish = begin_runner(path_or_id, device, dtype, ...)      # the same in two parts (synth.engine.Engine's):
    runner, tokenizer_factory, prompts, info = finish()        # the checkpoint loaded, then its helpers awaited

On CUDA the compile helpers of a fresh compile cache (synth/parallel_compile.py) run beside the checkpoint's load,
and the slots are sized once they have ended (their GPU memory back); where the slots come from a share of the GPU
(engine processes sharing one), the helpers start once the slots are sized, at the step's own largest batch.
"""
from __future__ import annotations

import logging
import os
import time

import torch

from talkgate.synth import decoder_precision, parallel_compile
from talkgate.synth.checkpoint_dir import resolve_path
from talkgate.synth.loader import load_tts, read_config
from talkgate.synth.model import page_length
from talkgate.synth.prompt import CLONE_MAX_PROMPT
from talkgate.synth.roofline import StepRoof, gpu_peaks
from talkgate.synth.runner import Runner, compile_folder, warmed_marker
from talkgate.synth.tokenizer import StreamingTokenizer

log = logging.getLogger("talkgate.runner")     # a runner's start, logged with the runner's own lines

DEFAULT_MAX_PROMPT = 128               # prompt positions a slot holds (Base: CLONE_MAX_PROMPT, a 30 s ICL voice)


def _dtype(name) -> torch.dtype | None:
    if name is None or isinstance(name, torch.dtype):
        return name
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[str(name)]


def context_bytes(tts, dtype: torch.dtype) -> int:
    """GPU bytes one context slot takes but its Talker KV: codec decoder state + small per-slot pools."""
    d = tts.config.talker.dims
    one = tts.codec_decoder.alloc_state(1, device="meta")
    dec = sum(t.numel() * t.element_size() for t in (one.tails, one.kv, one.pos))
    return dec + tts.config.talker.vocab_size + 2 * d.hidden_size * dtype.itemsize + 128


def page_bytes(tts, page_len: int, dtype: torch.dtype) -> int:
    """GPU bytes of one Talker KV page (synth/pages.py): page_len positions of every layer's K and V."""
    d = tts.config.talker.dims
    return d.num_layers * 2 * d.num_kv_heads * page_len * d.head_dim * dtype.itemsize


# slots sized from memory at most: contexts hold the Talker's KV by use (synth/pages.py), so an H200 holds 2,048
# contexts of natural length at 1.7B or 0.6B beside 512 rows (engine.md "Memory budget")
DEFAULT_MAX_SLOTS = 2048
# KV pages budgeted per slot when sizing the slots from memory: a sentence with its prompt (~40 + 12.5 a second of
# speech positions) fits two pages of 64; the pool is shared, so a long context takes pages a short one left
MIN_CONTEXT_PAGES = 2
# rows a step takes at most by default; more contexts with text take turns (earliest deadline). 512 where the engine
# has LARGE_BUDGET of GPU memory (an H200 alone: 981 slots of 1.7B beside 512 rows), 256 below (an 80-GB H100: 530-595
# slots; several models on one H200): on an H200 a 1.7B server with 512 rows held 190 req/s (its requests in
# flight level) and made 1,161 audio s/s at 210, where 256 rows made ~960 and held none of 170-210 req/s
# (docs/benchmarks.md "Room for the load")
DEFAULT_MAX_BATCH = 256
LARGE_MAX_BATCH = 512
LARGE_BUDGET = 120 << 30
# warm-up's peak above the slots, the weights and the 4 GiB + 10% reserve, per row of the largest step: the H100
# peaked at 48.7 GiB with 256 slots and 256 rows at 0.6B (24.6 slots + 2.1 weights + 22 GiB, mostly cuDNN's
# algorithm search) and 50.6 GiB at 1.7B, 11.7 GiB of which the old reserve covered: 12.5 GiB at 256 rows
WARMUP_BYTES_PER_ROW = 50 << 20
# ... with a half-precision codec decoder: 17.4 MiB a row measured at 256 rows (1.7B, float16 decoder, H200,
# bench/first_lane.py, 2026-11-30), budgeted with a margin
HALF_WARMUP_BYTES_PER_ROW = 25 << 20


def warmup_bytes_per_row(decoder_dtype: torch.dtype) -> int:
    return WARMUP_BYTES_PER_ROW if decoder_dtype == torch.float32 else HALF_WARMUP_BYTES_PER_ROW


def size_from_memory(tts, max_len: int, dtype: torch.dtype, device: torch.device, cap: int = DEFAULT_MAX_SLOTS,
                     max_batch: int = DEFAULT_MAX_BATCH, memory_share: float | None = None,
                     per_row: int = WARMUP_BYTES_PER_ROW, reserved_before: int = 0) -> tuple[int, int]:
    """(slots, KV pages) as size_within gives them of this engine's budget of GPU memory: what is free, or with
    `memory_share` (several engines on one GPU) that fraction of the GPU's total less what this engine holds
    already (share_budget): what this process's allocator holds beyond `reserved_before`, its reservation when
    this engine began to load (the engines loaded before it in this process, `serve --colocate`, are theirs)."""
    free, total = torch.cuda.mem_get_info(device)
    page_len = page_length(max_len)
    sizes = (context_bytes(tts, dtype), page_bytes(tts, page_len, dtype), -(-max_len // page_len), cap, max_batch,
             per_row)
    if memory_share is None:
        slots, pages = size_within(free, *sizes)
        log.info("slots: %d, KV pages: %d of %d positions (%.1f GiB), from %.1f GiB free", slots, pages, page_len,
                 pages * sizes[1] / (1 << 30), free / (1 << 30))
        return slots, pages
    held = torch.cuda.memory_reserved(device) - reserved_before
    slots, pages = size_within(share_budget(total, held, memory_share), *sizes)
    log.info("slots: %d, KV pages: %d, from a %.3g share of %.1f GiB, %.1f GiB held (%.1f GiB free now)", slots, pages,
             memory_share, total / (1 << 30), held / (1 << 30), free / (1 << 30))
    return slots, pages


def share_budget(total: int, held: int, share: float) -> int:
    """The GPU bytes an engine process with `share` of a GPU of `total` bytes may still take, `held` (its weights,
    its allocator's pool) taken already. Not from free memory: the engine processes of one GPU load at the same
    time, so what is free when one sizes its slots depends on how far the others have got."""
    return int(total * share) - held


def default_max_batch(budget: int) -> int:
    """The rows a step takes at most when neither they nor the slots are given, for an engine process with `budget`
    bytes of GPU memory (the GPU's total, or its share of it): known before the weights load, so that the compile
    helpers beside the load compile the step at its largest batch."""
    return LARGE_MAX_BATCH if budget >= LARGE_BUDGET else DEFAULT_MAX_BATCH


def size_within(budget: int, per_context: int, per_page: int, slot_pages: int, cap: int = DEFAULT_MAX_SLOTS,
                max_batch: int = DEFAULT_MAX_BATCH, per_row: int = WARMUP_BYTES_PER_ROW) -> tuple[int, int]:
    """(slots, KV pages) in `budget` bytes after a reserve for activations, graphs, the CUDA context and warm-up (4 GiB
    + 10% of the budget + `per_row` bytes per row of the largest step, min(slots, max_batch)): slots of `per_context`
    bytes each with MIN_CONTEXT_PAGES pages of `per_page` bytes, at most `cap` and at least 1; then every byte left in
    pages, at most every slot's `slot_pages` (and the scratch page), at least one whole context's and the scratch."""
    usable = budget - (4 << 30) - budget // 10
    per_slot = per_context + MIN_CONTEXT_PAGES * per_page
    slots = usable // (per_slot + per_row)          # every slot a row of the largest step
    if slots > max_batch:
        slots = (usable - max_batch * per_row) // per_slot
    slots = max(1, min(cap, slots))
    pages = (usable - min(slots, max_batch) * per_row - slots * per_context) // per_page
    return slots, max(slot_pages + 2, min(pages, 1 + (slots + 1) * slot_pages))


def load_runner(path_or_id, **kw):
    """begin_runner and its second part in one call (begin_runner's arguments)."""
    return begin_runner(path_or_id, **kw)()


def begin_runner(path_or_id, device=None, dtype=None, max_contexts=None, max_frames_per_context=750, max_batch=None,
                 cuda_graphs=True, max_prompt=None, decoder_dtype=None, torch_compile=True, untrained_length="text-rule",
                 memory_share=None, lane=None, kv_pages=None):
    """The checkpoint loaded, the slots sized, a fresh cache's compile helpers started; -> the second part, which
    waits for them and returns (Runner, tokenizer factory, Prompts, ModelInfo) for synth.engine.Engine. An engine
    process of several models (`serve --colocate`) begins every model's before it finishes any, so that their helpers
    compile side by side (one model's after another's were most of the fresh start, docs/benchmarks.md). lane None: a
    first-frame lane (synth/lane.py) where the step runs CUDA graphs. kv_pages: the Talker's KV pages (synth/pages.py);
    None: sized from memory with the slots, or where the slots are given (max_contexts, the CPU) every slot's whole
    length."""
    t0 = time.perf_counter()
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":       # the blocks cached for engines loaded before this one in this process go back
        torch.cuda.empty_cache()    # so that this one's reservation beyond reserved_before is its own
    reserved_before = torch.cuda.memory_reserved(device) if device.type == "cuda" else 0
    dtype = _dtype(dtype) or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    root = resolve_path(path_or_id)
    # the compile cache's folder and its helpers are the decoder dtype's: float16 is planned where a probe of the
    # loaded decoder may allow it, the probe after the load (synth/decoder_precision.py)
    given = _dtype(decoder_dtype)
    decoder_dtype = decoder_precision.planned_dtype(device, dtype, given)
    probe = decoder_precision.probes(device, dtype, given)
    config = read_config(root)
    if max_prompt is None:
        max_prompt = CLONE_MAX_PROMPT if config.model_type == "base" else DEFAULT_MAX_PROMPT
    if max_batch is None and max_contexts is not None:
        max_batch = max_contexts                            # slots given: every context a row
    elif max_batch is None:                                 # both sized from memory (engine.md "Memory budget")
        total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0
        max_batch = default_max_batch(int(total * memory_share) if memory_share is not None else total)
    functions = helpers = None
    # slots sized from a share of the GPU are known once the weights are loaded (the share decides them, not what
    # is free): the compile helpers of a fresh cache start then, at the step's own largest batch, which warm-up
    # would otherwise compile again (23-34 s of three 1.7B models' fresh start, docs/benchmarks.md); else they
    # start beside the load, at the largest batch there may be
    share_sized = device.type == "cuda" and max_contexts is None and memory_share is not None

    def start_helpers(batch: int):
        return parallel_compile.start(root, device, dtype, decoder_dtype, max_prompt, max_frames_per_context,
                                      max(batch, 2), warmed_marker(functions, max_prompt))

    if device.type == "cuda":                  # before anything compiles: the caches' folder for this model here
        functions = compile_folder(config, root, device, dtype, decoder_dtype)
        if torch_compile and not share_sized:
            helpers = start_helpers(min(max_batch, max_contexts or max_batch))
    # the voice-cloning encoder (once a clone, not on the step) stays float32 unless the decoder's dtype was given
    tts = load_tts(path_or_id, device=device, dtype=dtype, decoder_dtype=torch.float32 if probe else decoder_dtype,
                   codec_encoder_dtype=given or torch.float32,
                   untrained_length=untrained_length)
    t_loaded = time.perf_counter()
    if probe and decoder_precision.settle(tts)[0] != decoder_dtype:
        decoder_dtype = torch.float32       # warm-up compiles its kernels; the helpers compiled float16's in vain
        functions = compile_folder(config, root, device, dtype, decoder_dtype)     # a probe runs on CUDA only
    if helpers is not None:
        helpers.wait()                         # their memory back before the slots are sized from what is free
    max_len = max_prompt + max_frames_per_context
    if max_contexts is None and device.type == "cuda":
        max_contexts, sized_pages = size_from_memory(tts, max_len, dtype, device, max_batch=max_batch,
                                                     memory_share=memory_share,
                                                     per_row=warmup_bytes_per_row(decoder_dtype),
                                                     reserved_before=reserved_before)
        kv_pages = kv_pages or sized_pages
    elif max_contexts is None:
        max_contexts = 16
    max_batch = min(max_batch, max_contexts)
    if share_sized and torch_compile:
        helpers = start_helpers(max_batch)

    def finish():
        if share_sized and helpers is not None:
            helpers.wait()
        runner = Runner(tts, num_slots=max_contexts, max_frames=max_frames_per_context, max_prompt=max_prompt,
                        max_batch=max_batch, device=device, dtype=dtype, cuda_graphs=cuda_graphs,
                        torch_compile=torch_compile, compile_folder=functions,
                        lane=device.type == "cuda" and cuda_graphs if lane is None else lane, pages=kv_pages)
        if helpers is not None and helpers.late_done() is None:
            runner.compiling_later(helpers)
        peaks = gpu_peaks(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
        if peaks is not None:
            runner.roof = StepRoof(config, tts.codec_decoder.config, dtype, decoder_dtype, peaks)
        # the cold start's first part (docs/benchmarks.md): what came before the load is the interpreter and imports
        age = process_age_s()
        log.info("loaded: checkpoint %.2f s, runner (slots, compiled functions bound) %.2f s; process start -> here "
                 "%s", t_loaded - t0, time.perf_counter() - t_loaded, "?" if age is None else f"{age:.2f} s")
        return runner, (lambda: StreamingTokenizer(tts.tokenizer)), tts.prompts, tts.info
    return finish


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc; None elsewhere)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
