"""`talkgate bench`: the load generator's command line (talkgate/loadgen/ is the generator; docs/bench-load.md)."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from talkgate.cli.args import Parser
from talkgate.loadgen import load, report
from talkgate.loadgen import prompts as prompt_set
from talkgate.loadgen.load import CANCEL_POINT, DEFAULT_RATE, ENCODING_CODES, Config
from talkgate.synth.request import frames_for_text   # the engine's documented text-length rule


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="talkgate bench", description=load.__doc__.split("\n\n")[0] + " (docs/bench-load.md)")
    d = Config()
    p.add_argument("--url", default=d.url, help="the server's base URL")
    p.add_argument("--protocol", choices=["native", "openai"], default=d.protocol,
                   help="native WebSocket (/v1/ws) or OpenAI HTTP (/v1/audio/speech)")
    level = p.add_mutually_exclusive_group()
    level.add_argument("--rps", type=float, help="open loop: Poisson arrivals at this many requests/s (default: 1, when "
                      "--concurrency is not given)")
    level.add_argument("--concurrency", type=int, help="closed loop: this many clients back to back")
    p.add_argument("--sweep", help="comma-separated load levels (req/s, or clients with --concurrency), raised "
                   "until a level has underruns, errors or p95 TTFA over --ttfa-limit-ms")
    p.add_argument("--ramp", type=float, default=d.ramp_s, help="closed loop: seconds over which the clients "
                   "start, evenly (default 0: all at once)")
    p.add_argument("--duration", type=float, default=d.duration_s, help="seconds during which requests start")
    p.add_argument("--requests", type=int, help="start at most this many requests")
    p.add_argument("--lang", choices=[*prompt_set.LANGS, "all"], default=d.lang,
                   help="language of the prompts (mixed: Chinese and English in one text)")
    p.add_argument("--bucket", choices=[*prompt_set.BUCKETS, "all"], default=d.bucket, help="prompt length: "
                   + ", ".join(f"{b} {lo}-{hi}" for b, (lo, hi) in prompt_set.BUCKET_CHARS.items()) + " characters")
    p.add_argument("--length", choices=["text", "model"], default=d.length, help="text: send fixed_frames = "
                   "frames_for_text(text) (random weights never stop by themselves); model: the server decides (the model's "
                   "eos; for an untrained checkpoint, the same text rule unless served with --untrained-length runaway)")
    p.add_argument("--cancel-share", type=float, default=d.cancel_share, help="share of requests cancelled after "
                   f"{CANCEL_POINT[0] * 100:.0f}-{CANCEL_POINT[1] * 100:.0f} %% of their audio")
    p.add_argument("--encoding", choices=list(ENCODING_CODES), default=d.encoding, help="native protocol only")
    p.add_argument("--sample-rate", type=int, help="native protocol (default: 24000 PCM, 48000 Opus)")
    p.add_argument("--tokens-per-second", type=float, default=d.tokens_per_second,
                   help="native: rate of text deltas, one Qwen token each, as an LLM streams (0: the whole text in "
                   "one message)")
    p.add_argument("--token-ids", action="store_true",
                   help="native, streamed: send each token as its id (the text message's ids), as a client whose "
                   "LLM speaks Qwen's tokenizer")
    p.add_argument("--first-token-delay-ms", type=float, default=d.first_token_delay_ms,
                   help="native: pause between context.start and the first text delta (not part of TTFA)")
    p.add_argument("--voice", help="speaker (default: the server's)")
    p.add_argument("--instructions", help="sent with every request: a VoiceDesign model's voice description, or "
                   "the style a model that takes instructions speaks in")
    p.add_argument("--model", default=d.model, help="OpenAI `model` field")
    p.add_argument("--api-key", help="the server's API key, if it requires one")
    p.add_argument("--max-in-flight", type=int,
                   help=f"client cap; an arrival over it is an error (the server is not keeping up); default "
                   f"{d.max_in_flight}, or --concurrency where that is more")
    p.add_argument("--request-timeout", type=float, default=d.request_timeout_s, help="seconds per request")
    p.add_argument("--underrun-tolerance-ms", type=float, default=d.underrun_tolerance_ms,
                   help="a player stall up to this long is not counted")
    p.add_argument("--ttfa-limit-ms", type=float, default=d.ttfa_limit_ms, help="p95 TTFA bound of a clean level")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the prompt choice, arrivals and cancels "
                   "(the same seed replays the same run)")
    p.add_argument("--processes", type=int, default=d.processes, help="client processes to split the load over "
                   "(one Python process saturates near a few hundred Opus streams)")
    p.add_argument("--warmup", type=int, default=2, help="short requests sent one by one before measuring")
    p.add_argument("--wait-ready", type=float, default=120.0, help="seconds to wait for the server's /ready "
                   "before starting")
    p.add_argument("--out", type=Path, help="results folder (requests.json, summary.json/.md, plots)")
    p.add_argument("--dump-prompts", action="store_true", help="print the selected prompts as JSON and exit")
    return p


def config_from(args: argparse.Namespace, p: argparse.ArgumentParser) -> Config:
    if args.protocol == "openai" and args.encoding != "pcm_s16le":
        p.error("--encoding opus is for the native protocol; the OpenAI endpoint streams PCM")
    if not 0 <= args.cancel_share <= 1:
        p.error("--cancel-share must be between 0 and 1")
    if args.max_in_flight is None:
        args.max_in_flight = max(Config.max_in_flight, args.concurrency or 0)
    if args.concurrency is not None and not 1 <= args.concurrency <= args.max_in_flight:
        p.error("--concurrency must be between 1 and --max-in-flight")
    if args.rps is not None and args.rps <= 0:
        p.error("--rps must be positive")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    if args.requests is not None and args.requests < 1:
        p.error("--requests must be at least 1")
    if args.processes < 1 or (args.concurrency is not None and args.processes > args.concurrency):
        p.error("--processes must be at least 1 and at most --concurrency")
    if args.duration <= 0 or args.duration > 3600:
        p.error("--duration must be in (0, 3600] seconds")
    if not 0 <= args.ramp < args.duration:
        p.error("--ramp must be >= 0 and shorter than --duration")
    if args.tokens_per_second < 0 or args.request_timeout <= 0:
        p.error("--tokens-per-second must be >= 0 and --request-timeout > 0")
    if args.token_ids and (args.protocol != "native" or args.tokens_per_second == 0):
        p.error("--token-ids streams a native request's text as token ids: --protocol native, --tokens-per-second > 0")
    return Config(url=args.url.rstrip("/"), protocol=args.protocol,
                  rps=args.rps if args.rps or args.concurrency else 1.0, concurrency=args.concurrency,
                  duration_s=args.duration, requests=args.requests, lang=args.lang, bucket=args.bucket,
                  length=args.length, cancel_share=args.cancel_share, encoding=args.encoding,
                  sample_rate=args.sample_rate or DEFAULT_RATE[args.encoding],
                  tokens_per_second=args.tokens_per_second, token_ids=args.token_ids,
                  first_token_delay_ms=args.first_token_delay_ms,
                  voice=args.voice, instructions=args.instructions, model=args.model, api_key=args.api_key,
                  max_in_flight=args.max_in_flight,
                  request_timeout_s=args.request_timeout, underrun_tolerance_ms=args.underrun_tolerance_ms,
                  ttfa_limit_ms=args.ttfa_limit_ms, seed=args.seed, processes=args.processes,
                  ramp_s=args.ramp)


def main(argv: list[str] | None = None) -> int:
    """The CLI (`talkgate bench` calls this); -> exit status: 0 clean of errors, 1 any error."""
    p = parser()
    args = p.parse_args(argv)
    if args.dump_prompts:
        chosen = prompt_set.select(args.lang, args.bucket)
        print(json.dumps([{**q, "frames": frames_for_text(q["text"])} for q in chosen], ensure_ascii=False, indent=1))
        return 0
    cfg = config_from(args, p)
    levels = None
    if args.sweep:
        try:
            levels = [float(x) for x in args.sweep.split(",") if x.strip()]
        except ValueError:
            p.error("--sweep takes numbers separated by commas, e.g. 1,2,5,10")
        if not levels or any(v <= 0 for v in levels) or levels != sorted(levels):
            p.error("--sweep levels must be positive and increasing")
    return asyncio.run(_main(cfg, levels, args.out, args.wait_ready, args.warmup))


async def _main(cfg: Config, levels: list[float] | None, out: Path | None, wait_s: float, warmup: int) -> int:
    await load.wait_ready(cfg, wait_s)
    failed = [r for r in await load.warm_up(cfg, warmup) if r.error]
    if failed:
        print(f"warm-up failed: {failed[0].error['code']}: {failed[0].error['message']}", file=sys.stderr)
        return 1
    if levels:
        best, best_held, errors = await load.sweep(cfg, levels, out)
        mode = "concurrency" if cfg.concurrency else "rps"
        print(f"highest clean {mode}: {report.fmt(best)}" + report.held_line(mode, best_held)
              + (f" (results in {out})" if out else ""))
        return 1 if errors else 0
    run = await load.run_load(cfg)
    s = run["summary"]
    if out:
        report.write_run(out, run)
    else:
        print(report.markdown(run["config"], s))
    print(report.one_line(s) + (f" (results in {out})" if out else ""))
    failed = [r for r in run["requests"] if r["error"]]
    for r in failed[:20]:
        print(f"request {r['idx']} ({r['prompt_id']}): {r['error']['code']}: {r['error']['message']}",
              file=sys.stderr)
    return 1 if failed else 0
