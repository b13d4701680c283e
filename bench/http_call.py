"""The worker's part of an OpenAI HTTP speech request before the engine, on the CPU: the JSON body parsed into a
request, its session, and the protocol's call that opens the context and tokenizes its text (the trace's `parsed`
-> `tokenized`, docs/design.md's budget), for English medium texts of the load generator, the real Qwen vocabulary.

    python -m bench.http_call [--runs 2000] [--tokenizer DIR]
    python -m bench.http_call --runs 25 --pause-ms 80,1000 [--spin] [--touch-ms 20]

Prints the median and p95 microseconds a request, and the same for the text's tokenization alone (streaming:
feed + finish; whole: StreamingTokenizer.whole where the tree has it) and for text_seconds. Run it with PYTHONPATH
at two trees for a before / after (alternated, the same machine). With --pause-ms, each call comes after a pause of
that long (slept, or with --spin a busy loop; with --touch-ms a canned request every that many ms of it), as a
worker's first audio comes after an idle second at 1 req/s; the back-to-back figure is printed beside it.
"""
from __future__ import annotations

import argparse
import statistics
import time

from bench.tokenizer import load_tokenizer
from talkgate.loadgen.prompts import select
from talkgate.sessions.limits import Limits
from talkgate.sessions.models import Model, Models
from talkgate.sessions.openai import OpenAISpeech, parse_request
from talkgate.sessions.session import Session
from talkgate.sessions.voices import VoiceMap, Voices
from talkgate.synth.api import ModelInfo
from talkgate.synth.checkpoint import SPEAKERS
from talkgate.synth.request import text_seconds
from talkgate.synth.tokenizer import StreamingTokenizer

INFO = ModelInfo(name="bench", model_type="custom_voice", size="1b7", untrained=True, voices=tuple(SPEAKERS),
                 languages=("auto", "english"))


def pause(seconds: float, spin: bool, touch_s: float, touch) -> None:
    """Wait `seconds`: asleep, or in a busy loop (spin); with touch_s, calling touch() every touch_s of it."""
    end = time.perf_counter() + seconds
    while (left := end - time.perf_counter()) > 0:
        step = min(left, touch_s) if touch_s else left
        if spin:
            stop = time.perf_counter() + step
            while time.perf_counter() < stop:
                pass
        else:
            time.sleep(step)
        if touch_s and end - time.perf_counter() > touch_s / 2:
            touch()


def timed(fn, texts: list[str], runs: int, wait=None) -> tuple[float, float]:
    """Median and p95 microseconds of fn(text) over `runs` calls, cycling through the texts (after a warm-up), each
    after wait() where given."""
    for text in texts:
        fn(text)
    times = []
    for i in range(runs):
        text = texts[i % len(texts)]
        if wait is not None:
            wait()
        t0 = time.perf_counter()
        fn(text)
        times.append(time.perf_counter() - t0)
    times.sort()
    return 1e6 * statistics.median(times), 1e6 * times[int(0.95 * len(times))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--tokenizer", help="a checkpoint or tokenizer directory (default: the real Qwen vocabulary)")
    ap.add_argument("--pause-ms", help="pauses before each call, comma-separated (default: none, back to back)")
    ap.add_argument("--spin", action="store_true", help="pause in a busy loop instead of asleep")
    ap.add_argument("--touch-ms", type=float, default=0.0, help="a canned request every this many ms of a pause")
    args = ap.parse_args()
    tok = load_tokenizer(args.tokenizer)
    models, voices = Models([Model("bench", INFO)]), VoiceMap()       # what a server makes once
    session_voices, limits = Voices(INFO), Limits()

    def new_tokenizer():
        return StreamingTokenizer(tok)
    texts = [p["text"] for p in select("en", "medium")]

    def request(text: str) -> None:
        req = parse_request({"input": text, "model": "tts-1", "voice": "alloy", "response_format": "pcm"}, 4096,
                            models, voices)
        session = Session(INFO, limits, new_tokenizer, voices=session_voices, models=models)   # as gateway.py
        session.configure(**{k: getattr(req.config, k) for k in ("voice", "format", "language")})
        speech = OpenAISpeech(session, req)
        speech.start()
        speech.engine_commands()

    def streaming(text: str) -> None:
        s = StreamingTokenizer(tok)
        s.feed(text)
        s.finish()

    rows = [("request: parse, session, start, commands", request), ("feed + finish", streaming),
            ("text_seconds", text_seconds)]
    if hasattr(StreamingTokenizer, "whole"):
        rows.insert(2, ("whole", lambda text: StreamingTokenizer(tok).whole(text)))
    print(f"{len(texts)} English medium texts, {sum(map(len, texts)) / len(texts):.0f} characters on average, "
          f"{args.runs} runs each")
    pauses = [float(ms) for ms in args.pause_ms.split(",")] if args.pause_ms else []
    how = ("spinning" if args.spin else "asleep") + (f", a canned request every {args.touch_ms:g} ms"
                                                     if args.touch_ms else "")
    for name, fn in rows:
        p50, p95 = timed(fn, texts, args.runs)
        print(f"{name}: p50 {p50:.1f} us, p95 {p95:.1f} us")
        for ms in pauses:
            p50, p95 = timed(fn, texts, args.runs, lambda: pause(ms / 1000, args.spin, args.touch_ms / 1000,
                                                                  lambda: request("Warming up, one moment.")))
            print(f"  after {ms:g} ms {how}: p50 {p50:.1f} us, p95 {p95:.1f} us")


if __name__ == "__main__":
    main()
