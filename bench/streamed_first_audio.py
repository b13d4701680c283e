"""First audio of streamed text, from the first delta, per language: Chinese and Japanese without punctuation
against English, against a running `talkgate serve` (native WebSocket, one context at a time).

    talkgate checkpoint create /tmp/tiny --preset tiny      # or any checkpoint
    talkgate serve --model /tmp/tiny --device cpu --port 8123 &
    python -m bench.streamed_first_audio --url ws://127.0.0.1:8123 [--url ws://127.0.0.1:8124] [--runs 3]

Three pacings: one character every 50 ms (tests/system/test_cjk_streaming.py's), one Qwen token every 40 ms
(25 tokens a second, as `talkgate bench` streams text: loadgen's token_deltas), and one token id every 40 ms (the
`text` message's `ids`: a client whose LLM speaks Qwen's tokenizer). Each text is sent as `text` messages at that
pace (then `flush`); first audio is the first binary frame, timed from the first `text` sent,
and the socket is closed there. Two servers (two --url, say the code before and after a change) take each text
in turn, so that both see the same load on the machine. Texts: the bench prompts (zh with
its punctuation removed, en) and bench.tokenizer's Japanese, 10 each (5 of ja) of up to 40 characters.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import aiohttp

PACINGS = {"character / 50 ms": 0.05, "token / 40 ms": 0.04, "ids / 40 ms": 0.04}


def texts() -> dict[str, list[str]]:
    from bench.tokenizer import JAPANESE, without_punctuation
    from talkgate.loadgen.prompts import PROMPTS
    zh = [without_punctuation(t) for bucket in PROMPTS["zh"].values() for t in bucket]
    en = [t for bucket in PROMPTS["en"].values() for t in bucket]
    return {"zh, no punctuation": [t[:40] for t in zh[:10]], "ja, no punctuation": [t[:40] for t in JAPANESE],
            "en": [t[:40] for t in en[:10]]}


def deltas_of(text: str, pacing: str) -> list[dict]:
    """The `text` messages' contents: a character, a token's text or a token id each."""
    if pacing.startswith("character"):
        return [{"text": ch} for ch in text]
    from talkgate.loadgen.measure import token_messages
    return token_messages(text, ids=pacing.startswith("ids"))


async def one(session: aiohttp.ClientSession, url: str, deltas: list[dict], interval: float, language: str,
              start_gap: float = 0.0):
    """-> ms from the first delta sent to the first audio frame. The socket is closed at the first audio (the
    server cancels the context), so that a run takes well under a second."""
    ws = await session.ws_connect(url + "/v1/ws")
    assert json.loads((await ws.receive(timeout=30)).data)["type"] == "session.ready"
    await ws.send_str(json.dumps({"type": "context.start", "context_id": "c", "language": language,
                                  "sampling": {"greedy": True}, "fixed_frames": 40}))

    async def first_audio():
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                return time.monotonic()
            if msg.type == aiohttp.WSMsgType.TEXT:
                ev = json.loads(msg.data)
                assert ev["type"] != "error", ev
        raise RuntimeError("the socket closed before any audio")

    await asyncio.sleep(start_gap)         # an LLM's time to its first token: the context's open is done by then
    reader = asyncio.create_task(first_audio())
    t0 = time.monotonic()
    for i, delta in enumerate(deltas):
        await asyncio.wait([reader], timeout=max(0.0, t0 + i * interval - time.monotonic()))
        if reader.done():
            break
        await ws.send_str(json.dumps({"type": "text", "context_id": "c", **delta}))
    else:
        await ws.send_str(json.dumps({"type": "flush", "context_id": "c"}))
    t_audio = await asyncio.wait_for(reader, 60)
    await ws.close()
    return (t_audio - t0) * 1e3


async def run(urls: list[str], runs: int, only_texts: str | None, only_pacing: str | None,
              start_gap: float = 0.0) -> None:
    """Each text is streamed to every server in turn (runs times), so that they share the machine's load."""
    languages = {"zh, no punctuation": "chinese", "ja, no punctuation": "japanese", "en": "english"}
    print("| texts | pacing | server | runs | first audio from the first delta: mean / median / p90 / min / max (ms) |")
    print("| --- | --- | --- | --- | --- |")
    async with aiohttp.ClientSession() as session:
        for url in urls:
            await one(session, url, [{"text": "Warm up."}], 0.0, "english")
        for pacing, interval in PACINGS.items():
            for name, group in texts().items():
                if only_texts not in (None, name[:2]) or only_pacing not in (None, pacing.split()[0]):
                    continue
                firsts = {url: [] for url in urls}
                for _ in range(runs):
                    for text in group:
                        for url in urls:
                            firsts[url].append(await one(session, url, deltas_of(text, pacing), interval,
                                                         languages[name], start_gap))
                if len(urls) == 2:              # paired by text and run: the second server less the first
                    diff = [b - a for a, b in zip(*firsts.values())]
                    half = 1.96 * statistics.stdev(diff) / len(diff) ** 0.5
                    print(f"| {name} | {pacing} | second - first | {len(diff)} | {statistics.fmean(diff):+.0f} "
                          f"(95% CI +-{half:.0f}) |", flush=True)
                for url, got in firsts.items():
                    got.sort()
                    p90 = got[min(len(got) - 1, int(0.9 * len(got)))]
                    print(f"| {name} | {pacing} | {url} | {len(got)} | {statistics.fmean(got):.0f} / "
                          f"{statistics.median(got):.0f} / {p90:.0f} / {got[0]:.0f} / {got[-1]:.0f} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True, action="append",
                    help="ws://HOST:PORT of a running talkgate serve; several: each text goes to each in turn")
    ap.add_argument("--runs", type=int, default=3, help="times each text is streamed to each server")
    ap.add_argument("--texts", choices=("zh", "ja", "en"), help="only these texts")
    ap.add_argument("--pacing", choices=("character", "token", "ids"), help="only this pacing")
    ap.add_argument("--start-gap-ms", type=float, default=0.0,
                    help="between context.start and the first delta (an LLM's time to its first token; on a CPU "
                         "engine the context's open takes tens of ms, which a first delta sent at once waits for)")
    args = ap.parse_args()
    asyncio.run(run(args.url, args.runs, args.texts, args.pacing, args.start_gap_ms / 1e3))


if __name__ == "__main__":
    main()
