"""Voice cloning as a client meets it (issue 24; run on a GPU by bench/gpu_clone.sh), against a running server
of a Base checkpoint:

    python -m bench.clone --url http://127.0.0.1:8080 --out /tmp/res/clone.json

1. Upload -> voice ready: POST /v1/audio/voices of a 10 s clip (WAV, 24 kHz, 16-bit), x-vector only and with
   its words (ICL), --uploads of each; the time from sending the request to its answer, when the voice is
   stored durably and every process of the server (and every server on the store) speaks it; with the
   server's split (decode, engine, store). Each is deleted again.
2. Batch-1 TTFA on one native WebSocket, one context at a time, the whole text sent at once and flushed:
   the model's default voice (a Base checkpoint has no named voices: no speaker), a stored x-vector voice,
   a stored ICL voice of a 10 s reference, in rounds of the three in a shuffled order (drift and warm-up
   land on all of them alike). TTFA = the `text` message sent -> the first binary audio frame received
   (client) and the server's own timing.ttfa_ms. Each voice's first context is reported apart (its prompt
   embeddings are not cached yet). Then the ICL voice with the text streamed as an LLM does (a word every
   --word-ms): an ICL context cannot start before it has (reference frames + 1 - reference text tokens)
   text tokens or the end of its text (the model's prompt layout, docs/engine.md), so its first audio
   waits for the text, not for the engine.
Targets (H100, 1.7B): ready <= 200 ms for a 10 s clip; x-vector TTFA within 2 ms of the default voice, ICL
within 15 ms (p50 against p50). Writes one JSON with every sample and the summary, prints the summary.
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import random
import struct
import time
import wave
from pathlib import Path

import aiohttp
import numpy as np

from talkgate.loadgen.measure import stats

HEADER = struct.Struct("<BBHIII")
TEXT = "Thanks for calling. Your table for two is booked for seven tonight, and we will text you a reminder."
STREAMED = ("Of course, let me look that up for you. I can see your order left the warehouse this morning, and "
            "it should arrive by Friday afternoon at the latest.")
# about what a person says in 10 s: the reference clip's words (an ICL voice)
REF_TEXT = ("Hello, my name is Alex and I am recording this short sample so that the assistant can speak with my "
            "voice. It takes about ten seconds to read these words aloud at an easy pace.")
TARGETS = {"ready_ms": 200.0, "xvector_ttfa_delta_ms": 2.0, "icl_ttfa_delta_ms": 15.0}


def clip_wav(seconds: float, seed: int = 7, rate: int = 24000) -> bytes:
    """A deterministic voiced signal as a 16-bit mono WAV (harmonics of a wandering pitch, syllable rhythm)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 120 + 60 * rng.random() + 15 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = sum(rng.random() / k * np.sin(k * phase + rng.random() * 6) for k in range(1, 9))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2
    pcm = np.clip(0.25 * x * envelope + 0.01 * rng.standard_normal(len(t)), -1, 1)
    b = io.BytesIO()
    with wave.open(b, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((pcm * 32767).astype("<i2").tobytes())
    return b.getvalue()


class Bench:
    def __init__(self, args):
        self.url, self.args = args.url.rstrip("/"), args
        self.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        self.http: aiohttp.ClientSession | None = None

    async def upload(self, name: str, wav: bytes, ref_text: str | None) -> tuple[float, dict]:
        form = aiohttp.FormData()
        form.add_field("name", name)
        form.add_field("consent", "benchmark clip (synthetic)")
        if ref_text:
            form.add_field("ref_text", ref_text)
        form.add_field("audio_sample", wav, filename="ref.wav", content_type="audio/wav")
        t = time.perf_counter()
        async with self.http.post(f"{self.url}/v1/audio/voices", data=form, headers=self.headers) as r:
            body = await r.json()
            ms = (time.perf_counter() - t) * 1000
        if r.status != 200:
            raise RuntimeError(f"upload {name!r}: {r.status} {body}")
        return ms, body

    async def delete(self, voice_id: str) -> None:
        async with self.http.delete(f"{self.url}/v1/audio/voices/{voice_id}", headers=self.headers) as r:
            if r.status != 200:
                raise RuntimeError(f"delete {voice_id}: {r.status} {await r.text()}")

    async def ready(self, wav: bytes, tag: str) -> dict:
        """Upload -> ready of --uploads voices of each kind, each deleted again."""
        out = {}
        for mode, ref_text in (("xvector", None), ("icl", REF_TEXT)):
            samples = []
            for i in range(self.args.uploads):
                ms, body = await self.upload(f"bench {tag} {mode} {i} {time.time_ns()}", wav, ref_text)
                samples.append({"ms": round(ms, 2), **body["timing"]})
                await self.delete(body["id"])
            out[mode] = {"samples": samples, "ms": stats([s["ms"] for s in samples]),
                         "engine_ms": stats([s["engine_ms"] for s in samples]),
                         "decode_ms": stats([s["decode_ms"] for s in samples]),
                         "store_ms": stats([s["store_ms"] for s in samples])}
        return out

    async def context(self, ws, n: int, voice: str | None, text: str, word_ms: float = 0.0) -> dict:
        """One context: -> client TTFA (ms), the server's ttfa_ms, frames. Text streamed word by word (word_ms)
        is cancelled at its first audio: only its TTFA is wanted."""
        cid = f"b{n}"
        start = {"type": "context.start", "context_id": cid, "fixed_frames": self.args.frames,
                 "format": {"encoding": "pcm_s16le", "sample_rate": 24000}}
        if voice:
            start["voice"] = voice
        await ws.send_json(start)
        started = json.loads((await ws.receive(timeout=60)).data)
        if started.get("type") != "context.started":
            raise RuntimeError(f"context refused: {started}")
        pieces = [text] if not word_ms else [w + " " for w in text.split(" ")]
        stop = asyncio.Event()
        t0 = time.perf_counter()
        first = server_ttfa = None
        sender = asyncio.create_task(self._send(ws, cid, pieces, word_ms, stop))
        while True:
            msg = await ws.receive(timeout=120)
            if msg.type == aiohttp.WSMsgType.BINARY:
                if first is None:
                    first = (time.perf_counter() - t0) * 1000
                    if word_ms:
                        stop.set()
                        await sender
                        await ws.send_json({"type": "cancel", "context_id": cid})
                continue
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"socket closed: {msg}")
            ev = json.loads(msg.data)
            if ev["type"] == "timing":
                server_ttfa = ev["ttfa_ms"]
            elif ev["type"] in ("context.done", "context.cancelled", "error"):
                stop.set()
                await sender
                if ev["type"] == "error":
                    raise RuntimeError(f"context failed: {ev}")
                return {"ttfa_ms": round(first, 3), "server_ttfa_ms": server_ttfa, "frames": ev.get("frames")}

    @staticmethod
    async def _send(ws, cid: str, pieces: list[str], word_ms: float, stop: asyncio.Event) -> None:
        for i, piece in enumerate(pieces):
            if i and word_ms:
                await asyncio.sleep(word_ms / 1000)
            if stop.is_set():
                return
            await ws.send_json({"type": "text", "context_id": cid, "text": piece})
        await ws.send_json({"type": "flush", "context_id": cid})

    async def ttfa(self, voices: dict[str, str | None]) -> dict:
        samples: dict[str, list] = {k: [] for k in voices}
        first: dict[str, dict] = {}
        n = 0
        rng = random.Random(1)
        async with self.http.ws_connect(self.url.replace("http", "ws", 1) + "/v1/ws", headers=self.headers) as ws:
            assert json.loads((await ws.receive(timeout=30)).data)["type"] == "session.ready"
            for k, voice in voices.items():          # each voice's first context: its prompt is new
                n += 1
                first[k] = await self.context(ws, n, voice, TEXT)
            for _ in range(self.args.warmup):
                for k, voice in voices.items():
                    n += 1
                    await self.context(ws, n, voice, TEXT)
            for _ in range(self.args.rounds):
                order = list(voices)
                rng.shuffle(order)
                for k in order:
                    n += 1
                    samples[k].append(await self.context(ws, n, voices[k], TEXT))
            streamed = {}
            for k in ("default", "icl"):
                runs = []
                for _ in range(self.args.streamed):
                    n += 1
                    runs.append(await self.context(ws, n, voices[k], STREAMED, self.args.word_ms))
                streamed[k] = {"samples": runs, "ttfa_ms": stats([r["ttfa_ms"] for r in runs])}
        out = {k: {"samples": v, "ttfa_ms": stats([s["ttfa_ms"] for s in v]),
                   "server_ttfa_ms": stats([s["server_ttfa_ms"] for s in v]), "first": first[k]}
               for k, v in samples.items()}
        out["streamed"] = streamed
        return out

    async def run(self) -> dict:
        async with aiohttp.ClientSession() as self.http:
            async with self.http.get(f"{self.url}/health") as r:
                model = (await r.json())["model"]
            if model["model_type"] != "base":
                raise SystemExit(f"the server's model is {model['model_type']}: cloning needs a Base checkpoint")
            wav = clip_wav(self.args.ref_seconds)
            tag = str(time.time_ns())
            ready = await self.ready(wav, tag)
            _, xvec = await self.upload(f"bench {tag} x-vector", wav, None)
            _, icl = await self.upload(f"bench {tag} icl", wav, REF_TEXT)
            try:
                ttfa = await self.ttfa({"default": None, "xvector": xvec["id"], "icl": icl["id"]})
            finally:
                for v in (xvec, icl):
                    await self.delete(v["id"])
        return {"model": model, "args": vars(self.args), "ref_seconds": self.args.ref_seconds, "ready": ready,
                "voices": {"xvector": xvec, "icl": icl}, "ttfa": ttfa, "summary": summary(ready, ttfa)}


def summary(ready: dict, ttfa: dict) -> dict:
    def p50(d):
        return round(d["p50"], 2) if d else None
    base = ttfa["default"]["ttfa_ms"]["p50"]
    out = {"ready_p50_ms": {m: p50(ready[m]["ms"]) for m in ready}, "ready_max_ms": {m: round(ready[m]["ms"]["max"], 2)
                                                                                      for m in ready},
           "engine_p50_ms": {m: p50(ready[m]["engine_ms"]) for m in ready},
           "ttfa_p50_ms": {k: p50(ttfa[k]["ttfa_ms"]) for k in ("default", "xvector", "icl")},
           "ttfa_p95_ms": {k: round(ttfa[k]["ttfa_ms"]["p95"], 2) for k in ("default", "xvector", "icl")},
           "server_ttfa_p50_ms": {k: p50(ttfa[k]["server_ttfa_ms"]) for k in ("default", "xvector", "icl")},
           "first_context_ttfa_ms": {k: ttfa[k]["first"]["ttfa_ms"] for k in ("default", "xvector", "icl")},
           "xvector_ttfa_delta_ms": round(ttfa["xvector"]["ttfa_ms"]["p50"] - base, 2),
           "icl_ttfa_delta_ms": round(ttfa["icl"]["ttfa_ms"]["p50"] - base, 2),
           "streamed_ttfa_p50_ms": {k: p50(v["ttfa_ms"]) for k, v in ttfa["streamed"].items()}}
    worst_ready = max(out["ready_max_ms"].values())
    out["targets"] = {"ready_ms": (worst_ready, worst_ready <= TARGETS["ready_ms"]),
                      "xvector_ttfa_delta_ms": (out["xvector_ttfa_delta_ms"],
                                                out["xvector_ttfa_delta_ms"] <= TARGETS["xvector_ttfa_delta_ms"]),
                      "icl_ttfa_delta_ms": (out["icl_ttfa_delta_ms"],
                                            out["icl_ttfa_delta_ms"] <= TARGETS["icl_ttfa_delta_ms"])}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--api-key")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ref-seconds", type=float, default=10.0, help="reference clip length")
    p.add_argument("--uploads", type=int, default=10, help="uploads timed per kind (x-vector, ICL)")
    p.add_argument("--rounds", type=int, default=40, help="TTFA rounds (one context of each voice a round)")
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    p.add_argument("--streamed", type=int, default=5, help="contexts with the text streamed, per voice")
    p.add_argument("--word-ms", type=float, default=60.0, help="streamed text: one word every this many ms")
    p.add_argument("--frames", type=int, default=8, help="fixed_frames of each context (TTFA needs the first)")
    args = p.parse_args(argv)
    result = asyncio.run(Bench(args).run())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
