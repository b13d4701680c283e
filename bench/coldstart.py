"""Cold start of `talkgate serve`, as a deployment meets it (issue 22; run by bench/gpu_coldstart.sh):

    python -m bench.coldstart --model /tmp/ck --label fresh --out /tmp/res/fresh.json

Starts the server process and records, from the moment it is started: its "ready" line (the engine has
compiled everything and captured the first-audio graphs), the first audio of a request sent at that moment,
the log line saying the remaining graphs are captured. Then the first N requests after ready (the first
one included) at a steady rate, over the streaming OpenAI endpoint (whole text up front, PCM), and once
the server has captured everything and run for a while ("long-warm"), the same N requests again: TTFA =
request sent -> first audio byte. Stops the server; writes one JSON with every figure and the server's
warm-up profile lines.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp

TEXTS = ["Hello, how can I help you today?", "Sure, I can book that table for two at seven.",
         "The weather tomorrow looks sunny with a light breeze.", "Your order has shipped and arrives on Friday.",
         "Let me check that for you, one moment please."]


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (p95 of 20 values: the second largest)."""
    s = sorted(values)
    return round(s[max(0, math.ceil(q / 100 * len(s)) - 1)], 2) if s else float("nan")


class Server:
    """The server process; a thread reads its output into a log file and notes when lines appear."""

    def __init__(self, args, log_path: Path):
        self.t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "talkgate", "serve", "--model", args.model, "--device", args.device,
               "--port", str(args.port)] + (["--max-contexts", str(args.max_contexts)] if args.max_contexts else [])
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.seen: dict[str, float] = {}
        self.lines: list[str] = []
        self.log = open(log_path, "w")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            t = time.perf_counter() - self.t0
            self.log.write(f"[{t:8.2f}] {line}")
            self.log.flush()
            self.lines.append(line.rstrip())
            for key, pattern in (("ready", "talkgate: ready"), ("all_captured", "graphs captured"),
                                 ("listening", "talkgate: listening")):
                if pattern in line and key not in self.seen:
                    self.seen[key] = t

    def wait_for(self, key: str, timeout: float) -> float:
        deadline = time.perf_counter() + timeout
        while key not in self.seen:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited ({self.proc.returncode}) before '{key}'")
            if time.perf_counter() > deadline:
                raise SystemExit(f"no '{key}' within {timeout:.0f} s")
            time.sleep(0.02)
        return self.seen[key]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def one(http, url: str, text: str, t_base: float) -> dict:
    body = {"model": "talkgate", "input": text, "response_format": "pcm", "stream": True, "stream_format": "audio"}
    t_sent = time.perf_counter()
    first = None
    n = 0
    async with http.post(url + "/v1/audio/speech", json=body) as resp:
        if resp.status != 200:
            return {"error": f"http {resp.status}: {(await resp.text())[:200]}"}
        async for chunk in resp.content.iter_any():
            if chunk and first is None:
                first = time.perf_counter()
            n += len(chunk)
    return {"sent_s": round(t_sent - t_base, 3), "ttfa_ms": round((first - t_sent) * 1000, 2) if first else None,
            "audio_s": round(n / 2 / 24000, 2)}


async def batch(url: str, n: int, rps: float, t_base: float) -> list[dict]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        tasks = []
        for i in range(n):
            tasks.append(asyncio.create_task(one(http, url, TEXTS[i % len(TEXTS)], t_base)))
            await asyncio.sleep(1 / rps)
        return await asyncio.gather(*tasks)


def summary(results: list[dict]) -> dict:
    ttfa = [r["ttfa_ms"] for r in results if r.get("ttfa_ms") is not None]
    return {"n": len(results), "errors": sum(1 for r in results if "error" in r), "ttfa_p50_ms": pct(ttfa, 50),
            "ttfa_p95_ms": pct(ttfa, 95), "ttfa_max_ms": round(max(ttfa), 2) if ttfa else None}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-contexts", type=int)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--rps", type=float, default=4.0)
    ap.add_argument("--settle", type=float, default=10.0, help="seconds after all graphs are captured before "
                    "the long-warm requests")
    ap.add_argument("--ready-timeout", type=float, default=480.0)
    a = ap.parse_args()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{a.port}"
    srv = Server(a, a.out.with_suffix(".log"))
    res: dict = {"label": a.label, "model": a.model, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "cache": os.environ.get("TALKGATE_CACHE")}
    try:
        res["ready_s"] = round(srv.wait_for("ready", a.ready_timeout), 2)
        print(f"{a.label}: ready after {res['ready_s']} s", flush=True)
        first = asyncio.run(batch(url, a.requests, a.rps, srv.t0))
        res["first_audio_s"] = round(first[0]["sent_s"] + (first[0]["ttfa_ms"] or 0) / 1000, 2)
        res["after_ready"] = {"summary": summary(first), "requests": first}
        print(f"{a.label}: first audio {res['first_audio_s']} s; first {a.requests} after ready "
              f"{summary(first)}", flush=True)
        res["all_captured_s"] = round(srv.wait_for("all_captured", 300), 2)
        time.sleep(a.settle)
        asyncio.run(batch(url, 10, a.rps, srv.t0))                  # more traffic before the long-warm set
        warm = asyncio.run(batch(url, a.requests, a.rps, srv.t0))
        res["long_warm"] = {"summary": summary(warm), "requests": warm}
        print(f"{a.label}: all graphs captured at {res['all_captured_s']} s; long-warm {summary(warm)}", flush=True)
        async def stats():
            async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as r:
                return await r.text()
        res["metrics_engine"] = [l for l in asyncio.run(stats()).splitlines() if l.startswith("talkgate_engine")]
    finally:
        srv.stop()
        res["profile"] = [l for l in srv.lines if re.search(r"warm-up|graphs captured|compile cache|compiled", l)]
        a.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
