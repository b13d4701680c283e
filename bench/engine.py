"""Engine benchmark: frame-step time per batch size, RTF, text-ready -> first PCM, peak memory.

    talkgate checkpoint create /tmp/ck06 --preset 0.6b
    python -m bench.engine /tmp/ck06 --batches 1,8,32,128,256 --json /tmp/engine.json

Step time: B contexts with all their text given (fixed_frames, so random weights run to length) are
prefilled, then the engine's own loop body (`Engine.run_once`: commands, schedule, runner launch, the
last step's audio, this step's codes, events; the host's work overlaps the GPU's decode) is timed per
step; median of `--steps` steps. RTF = step ms / 80 ms (one frame is 80 ms of audio for every context in
the step). First PCM: on the started engine (its own thread), from the AppendText + EndText of a new
context (its text tokenized beforehand, as a session does) to the engine handing over its first
AudioChunk (t_emitted), median of `--latency-runs`, with nothing else running; `--idle-gaps` repeats that with the
engine (and its GPU) idle that many seconds before each context's text: at 1 req/s a request finds both idle for
about a second, where clocks and caches may have gone cold.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import threading
import time

import torch

from talkgate.synth.api import FRAME_MS, AppendText, AudioChunk, ContextParams, EndText, OpenContext, SamplingParams
from talkgate.synth.engine import Engine
from talkgate.synth.request import text_seconds

TEXT = "The quick brown fox jumps over the lazy dog, then naps in the afternoon sun. " * 6


def batch_runner(checkpoint: str, batch: int = 1):
    """The engine's runner for graph-level experiments (bench/decoder_kernels.py): loaded, warmed and captured (the
    buckets up to 16 and `batch`, as an engine of `batch` slots captures them before it is ready), its rows [:batch]
    contexts in slots 0.. at position 40, frame 20."""
    from talkgate.synth.runner_build import load_runner
    t0 = time.time()
    r, *_ = load_runner(checkpoint, max_contexts=max(batch, 4), max_batch=max(batch, 2))
    r.warmup(first_audio_only=True)
    print(f"warm-up {time.time() - t0:.0f} s", flush=True)
    with torch.inference_mode():
        r.main.inputs[0, :batch] = torch.arange(batch)
        r.main.inputs[1, :batch] = 40
        r.main.inputs[2, :batch] = r.text_pad
        r.main.inputs[3, :batch] = 20
        r.main.inputs[4, :batch] = r.talker.page_table[:batch, 40 // r.page_len]     # each slot's own page
    return r


def graph_ms(g: torch.cuda.CUDAGraph, reps: int) -> float:
    """Mean ms of one replay of a captured graph, timed with CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    end.synchronize()
    return round(start.elapsed_time(end) / reps, 3)


def speaking_client(engine: Engine, batch: int, sampling: SamplingParams) -> int:
    """A client of the engine with `batch` contexts given all of TEXT (their length fixed far out)."""
    client = engine.connect(lambda events: None)
    ids = tuple(engine.new_tokenizer().tokenizer.encode(TEXT))
    commands = []
    for ctx in range(1, batch + 1):
        commands += [OpenContext(ctx, ContextParams(sampling=sampling, fixed_frames=100_000)),
                     EndText(ctx, ids, text_seconds(TEXT))]
    engine.submit(client, commands)
    return client


def step_times(engine: Engine, batch: int, steps: int, sampling: SamplingParams, skip: int = 3) -> dict:
    client = speaking_client(engine, batch, sampling)
    while engine.scheduler.waiting or engine._commands:      # prefill everyone first
        engine.run_once()
    for _ in range(skip):                                     # skip: how far into the utterance timing starts
        engine.run_once()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.run_once()
        times.append((time.perf_counter() - t0) * 1000)
    running = len(engine.scheduler.running)
    parts = {}
    for part in ("talker", "codes", "decode"):                # the three graphs alone, replayed in turn
        g = engine.runner.graphs.get((part, engine.runner._bucket(batch)))
        if g is not None:
            parts[f"{part}_graph_ms"] = graph_ms(g, steps)
    engine.disconnect(client)
    engine.run_once()
    med = statistics.median(times)
    return {"batch": batch, "from_frame": skip, "running": running, "step_ms_median": round(med, 3),
            "step_ms_min": round(min(times), 3), "step_ms_max": round(max(times), 3),
            "rtf": round(med / FRAME_MS, 4), "frames_per_s": round(batch * 1000 / med, 1), **parts}


def first_pcm_ms(engine: Engine, runs: int, sampling: SamplingParams,
                 idle_s: float = 0.02) -> tuple[list[float], list[float]]:
    """-> (text ready -> first PCM, the engine step that made its codes: prefill + Talker + codes + copies) in ms;
    the engine idle `idle_s` before each context's text."""
    out, steps = [], []
    step_ms: list[float] = []
    engine.on_step = lambda dt, rows: step_ms.append(dt)
    text = "Hello there, how can I help you today?"
    ids = tuple(engine.new_tokenizer().tokenizer.encode(text))
    for _ in range(runs):
        step_ms.clear()
        got = threading.Event()
        first: list[float] = []

        def deliver(events):
            if not first and any(isinstance(ev, AudioChunk) for ev in events):
                first.append(next(ev for ev in events if isinstance(ev, AudioChunk)).t_emitted)
                got.set()

        client = engine.connect(deliver)
        engine.submit(client, [OpenContext(1, ContextParams(sampling=sampling, fixed_frames=20))])
        time.sleep(idle_s)                                    # the open is applied; the engine idles
        t0 = time.perf_counter()
        engine.submit(client, [AppendText(1, ids, text_seconds(text)), EndText(1)])
        got.wait(10)
        engine.disconnect(client)
        out.append((first[0] - t0) * 1000 if first else float("nan"))
        steps.append(step_ms[0] if step_ms else float("nan"))
        time.sleep(0.02)
    engine.on_step = None
    return out, steps


def prefill_parts(engine: Engine, reps: int = 20) -> dict:
    """A new context's own work in its first step, apart from the head: building its prompt embeddings
    (eager, prompt prefix cached) and the prefill graph (smallest bucket), each timed alone."""
    r = engine.runner
    prompt = r.tts.prompts.resolve(ContextParams())
    out = {}
    with torch.inference_mode():
        r.tts.prompts.prefill(prompt, [100])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            r.tts.prompts.prefill(prompt, [100])
        torch.cuda.synchronize()
        out["prompt_embed_ms"] = round((time.perf_counter() - t0) * 1000 / reps, 3)
        g = r.graphs.get(("prefill", r.prefill_rows[0], r.prefill_lens[0]))
        if g is not None:
            out[f"prefill_graph_ms_{r.prefill_rows[0]}x{r.prefill_lens[0]}"] = graph_ms(g, reps)
    return out


def profile_steps(engine: Engine, batch: int, sampling: SamplingParams, steps: int = 5) -> str:
    from torch.profiler import ProfilerActivity, profile
    client = speaking_client(engine, batch, sampling)
    while engine.scheduler.waiting or engine._commands:
        engine.run_once()
    engine.run_once()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.run_once()
    engine.disconnect(client)
    engine.run_once()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)


# ----- decode attention probe: the Talker's per-slot attention, gathered SDPA vs synth.attention -----
def attention_probe(batches, L=878, slots=257, layers=28) -> list[dict]:
    """One layer's one-token attention, bf16, 0.6B shapes, ms for `layers` layers: gathering the rows'
    whole caches + masked SDPA (attention alone) vs synth.attention's kernel (q/k norm, RoPE, cache
    write and attention over the row's live positions only)."""
    import torch.nn.functional as F
    from triton.testing import do_bench

    from talkgate.synth.attention import one_token_attention
    dev, bf16 = "cuda", torch.bfloat16
    kc = torch.randn(slots, 8, L, 128, device=dev, dtype=bf16)
    vc = torch.randn_like(kc)
    w = torch.ones(128, device=dev, dtype=bf16)
    out = []
    for B in batches:
        sl = torch.randperm(slots - 1, device=dev)[:B]
        pos = torch.randint(10, L, (B,), device=dev)
        qkv = torch.randn(B, 32 * 128, device=dev, dtype=bf16)
        cos, sin = torch.rand(B, 128, device=dev), torch.rand(B, 128, device=dev)
        q = qkv[:, :16 * 128].view(B, 16, 128)
        mask = (torch.arange(L, device=dev)[None, :] <= pos[:, None])[:, None, None]

        def gathered():
            return F.scaled_dot_product_attention(q[:, :, None], kc[sl], vc[sl], attn_mask=mask, enable_gqa=True)

        def fused():
            return one_token_attention(qkv, w, w, 1e-6, cos, sin, kc, vc, sl, pos, 16)
        t_ref = do_bench(gathered, warmup=25, rep=100, return_mode="median")
        t_tri = do_bench(fused, warmup=25, rep=100, return_mode="median")
        kv_bytes = 2 * int(pos.sum() + B) * 8 * 128 * 2
        out.append({"batch": B, "gather_sdpa_ms_28_layers": round(t_ref * layers, 3),
                    "triton_ms_28_layers": round(t_tri * layers, 3), "triton_GBps": round(kv_bytes / t_tri / 1e6, 1)})
        print(f"attention B={B}: gather+SDPA {t_ref * layers:.3f} ms, one-token kernel {t_tri * layers:.3f} ms "
              "(28 layers)", flush=True)
    return out


def _max_rows() -> int:
    from talkgate.synth import persistent
    return persistent.MAX_ROWS


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("--device")
    p.add_argument("--dtype")
    p.add_argument("--batches", default="1,8,32,128,256")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--latency-runs", type=int, default=10)
    p.add_argument("--idle-gaps", default="", help="first PCM again after this long idle (seconds), e.g. 0.02,0.2,1")
    p.add_argument("--greedy", action="store_true", help="greedy instead of the checkpoint's sampling")
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--profile", default="", help="batch sizes to profile (torch.profiler top kernels), e.g. 1,256")
    p.add_argument("--max-prefills", type=int, default=16)
    p.add_argument("--decoder-dtype", help="codec decoder dtype (default: as the engine chooses, synth/decoder_precision.py)")
    p.add_argument("--attention-probe", action="store_true", help="time the Talker's decode attention alone")
    p.add_argument("--no-persistent", action="store_true",
                   help="no persistent kernels (synth/persistent.py): the per-layer paths at every batch size")
    p.add_argument("--late", type=int, default=0,
                   help="also time batch 1 this many frames into an utterance (attention reads more positions)")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    if a.no_persistent:
        from talkgate.synth import persistent
        persistent.MAX_ROWS = 0
    batches = [int(b) for b in a.batches.split(",")]
    sampling = SamplingParams(greedy=a.greedy)
    probe = attention_probe(batches) if a.attention_probe else None
    t0 = time.perf_counter()
    engine = Engine.from_pretrained(a.checkpoint, device=a.device, dtype=a.dtype, max_contexts=max(batches),
                                    max_batch=max(batches), cuda_graphs=not a.no_graphs, max_prefills=a.max_prefills,
                                    torch_compile=not a.no_compile,
                                    decoder_dtype=a.decoder_dtype)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine.runner.warmup()
    warm_s = time.perf_counter() - t0
    cuda = engine.runner.device.type == "cuda"
    res = {"checkpoint": a.checkpoint, "info": engine.info.as_dict(), "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name() if cuda else platform.processor(), "graphs": engine.runner.use_graphs,
           "slots": engine.runner.num_slots, "greedy": a.greedy,            "compiled": engine.runner.compiled,
           "decoder_dtype": str(engine.runner.decoder.pre_conv.conv.weight.dtype),
           "persistent_max_rows": _max_rows(), "attention_probe": probe, "load_s": round(load_s, 2),
           "warmup_s": round(warm_s, 2), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "steps": []}
    for b in batches:
        r = step_times(engine, b, a.steps, sampling)
        res["steps"].append(r)
        print(f"batch {b:4d}: {r['step_ms_median']:8.3f} ms/step  RTF {r['rtf']:.4f}  {r['frames_per_s']:9.1f} frames/s"
              f"  graphs alone: talker {r.get('talker_graph_ms')} ms, codes {r.get('codes_graph_ms')} ms,"
              f" decode {r.get('decode_graph_ms')} ms", flush=True)
    if a.late:
        res["late"] = r = step_times(engine, 1, a.steps, sampling, skip=a.late)
        print(f"batch 1 from frame {a.late}: {r['step_ms_median']:.3f} ms/step, talker graph {r.get('talker_graph_ms')} ms",
              flush=True)
    res["profiles"] = {}
    for b in [int(x) for x in a.profile.split(",") if x]:
        res["profiles"][str(b)] = table = profile_steps(engine, b, sampling)
        print(f"--- profile batch {b}: top rows\n" + "\n".join(table.splitlines()[:8]), flush=True)
    if cuda:
        res["prefill_parts"] = prefill_parts(engine)
        print("new context's prefill:", res["prefill_parts"], flush=True)
    engine.start()                 # the engine thread; warm-up already done (it runs once)
    lat, first_steps = first_pcm_ms(engine, a.latency_runs, sampling)
    res["idle_gaps"] = {}
    for gap in [float(x) for x in a.idle_gaps.split(",") if x]:
        ms, its_steps = first_pcm_ms(engine, a.latency_runs, sampling, idle_s=gap)
        res["idle_gaps"][gap] = r = {"median": round(statistics.median(ms), 3), "max": round(max(ms), 3),
                                     "its_step_median": round(statistics.median(its_steps), 3)}
        print(f"idle {gap:g} s before the text: first PCM median {r['median']:.2f} ms, max {r['max']:.2f} ms "
              f"(its engine step: {r['its_step_median']:.2f} ms)", flush=True)
    engine.stop()
    res["first_pcm_ms"] = {"median": round(statistics.median(lat), 3), "all": [round(x, 3) for x in lat],
                           "its_step_median": round(statistics.median(first_steps), 3)}
    if cuda:
        res["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print("\n| batch | ms / frame step | RTF | frames/s | graphs alone ms: talker / codes / decode |\n"
          "| --- | --- | --- | --- | --- |")
    for r in res["steps"]:
        print(f"| {r['batch']} | {r['step_ms_median']:.3f} | {r['rtf']:.4f} | {r['frames_per_s']:.0f} | "
              f"{r.get('talker_graph_ms')} / {r.get('codes_graph_ms')} / {r.get('decode_graph_ms')} |")
    print(f"text ready -> first PCM (batch 1, median of {len(lat)}): {res['first_pcm_ms']['median']:.2f} ms "
          f"(its engine step: {res['first_pcm_ms']['its_step_median']:.2f} ms)")
    if cuda:
        print(f"peak GPU memory: {res['peak_memory_gib']} GiB; slots {res['slots']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
