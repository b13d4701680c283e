"""A gateway worker's CPU for one 80-ms frame of a native stream, on the CPU (issue 44): at 512 Opus streams on an
H200 the 14 workers took 0.63-0.88 cores each, about 7.7 ms of a worker's CPU a second of audio (docs/benchmarks.md
"The channels-last codec decoder"), so at 1,024 streams they would want more cores than the machine has. Sans-I/O,
as a worker's Link calls it: one context of a NativeProtocol session open with the given format, its text ended,
then one AudioChunk after another through `engine_event` (the session's encode and the wire frame), the Sends
taken as the Link takes them; and the worker's read of one step's message for the 37 streams a worker carries at
512 (ipc/wire.py read_step: its share of the step). Prints the median and p95 microseconds a frame of each, and of
the format's encode alone; --profile adds cProfile's functions by their own time over the frames.

    python -m bench.worker_frame [--frames 4000] [--encoding opus] [--rate 48000] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

import numpy as np

from bench.tokenizer import load_tokenizer
from talkgate.codecs.encoder import make_stream_encoder
from talkgate.ipc import wire
from talkgate.loadgen.measure import percentile
from talkgate.sessions.actions import Send
from talkgate.sessions.limits import Limits
from talkgate.sessions.native import NativeProtocol
from talkgate.sessions.session import Session
from talkgate.synth.api import FRAME_SAMPLES, AudioChunk, ModelInfo, OpenContext
from talkgate.synth.checkpoint import SPEAKERS
from talkgate.synth.tokenizer import StreamingTokenizer

INFO = ModelInfo(name="bench", model_type="custom_voice", size="0b6", untrained=True, voices=tuple(SPEAKERS),
                 languages=("auto", "english"))
TEXT = "Thanks for calling. Your order shipped this morning and should arrive on Thursday afternoon."
ROWS_PER_WORKER = 37        # 512 streams over 14 workers


def speech(n: int) -> np.ndarray:
    """n frames of a voice-like signal (a gliding tone with a little noise), float32 at 24 kHz."""
    t = np.arange(n * FRAME_SAMPLES) / 24000
    rng = np.random.default_rng(0)
    return (0.3 * np.sin(2 * np.pi * 180 * t * (1 + 0.1 * np.sin(3 * t))) + 0.01 * rng.standard_normal(t.size)
            ).astype(np.float32)


def quantiles(times: list[float]) -> tuple[float, float]:
    """Median and p95 microseconds of times in seconds."""
    return 1e6 * percentile(times, 50), 1e6 * percentile(times, 95)


def open_stream(tok, encoding: str, rate: int) -> tuple[NativeProtocol, int]:
    """A native session with one context open in `encoding` at `rate`, its text ended; its engine context."""
    limits = Limits(max_backlog_ms=10 ** 9)
    session = Session(INFO, limits, lambda: StreamingTokenizer(tok))
    proto = NativeProtocol(session, limits, "bench", None)
    proto.ready()
    for msg in ({"type": "context.start", "context_id": "a", "format": {"encoding": encoding, "sample_rate": rate}},
                {"type": "text", "context_id": "a", "text": TEXT}, {"type": "flush", "context_id": "a"}):
        proto.receive_text(json.dumps(msg))
    (context,) = [c.context for c in proto.engine_commands() if isinstance(c, OpenContext)]
    return proto, context


def frames_through(proto: NativeProtocol, context: int, pcm: np.ndarray, frames: int) -> list[float]:
    """Seconds of each frame's engine_event call, its Sends taken (the stream's outbox never fills: the bench
    drops them, as a socket that keeps up would). Raises unless every frame sent audio (else nothing was timed)."""
    times, silent = [], 0
    for i in range(frames):
        chunk = AudioChunk(context, pcm[i % 1000 * FRAME_SAMPLES:(i % 1000 + 1) * FRAME_SAMPLES], i, 1, 0.0)
        t0 = time.perf_counter()
        actions = proto.engine_event(chunk)
        proto.engine_commands()
        times.append(time.perf_counter() - t0)
        audio = [a for a in actions if isinstance(a, Send) and a.stream is not None]
        silent += not audio
        for a in audio:
            proto.note_sent(a.stream, 80.0 / len(audio))
    if silent:
        raise RuntimeError(f"{silent} of {frames} frames sent no audio: the stream is not open as the bench thinks")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=4000)
    ap.add_argument("--encoding", default="opus")
    ap.add_argument("--rate", type=int, default=48000)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    tok = load_tokenizer(None)
    pcm = speech(1000)
    proto, context = open_stream(tok, args.encoding, args.rate)
    frames_through(proto, context, pcm, 50)                                     # warm
    per_frame = quantiles(frames_through(proto, context, pcm, args.frames))

    encoder = make_stream_encoder(args.encoding, args.rate)
    enc_times = []
    for i in range(args.frames):
        t0 = time.perf_counter()
        encoder.encode(pcm[i % 1000 * FRAME_SAMPLES:(i % 1000 + 1) * FRAME_SAMPLES])
        enc_times.append(time.perf_counter() - t0)
    encode = quantiles(enc_times)

    step = wire.step_message(1, 100, [AudioChunk(c, pcm[:FRAME_SAMPLES], 5, 1, 0.0) for c in range(ROWS_PER_WORKER)])
    header, body = step[1], step[2].tobytes()
    read_times = []
    for _ in range(max(1, args.frames // 10)):
        t0 = time.perf_counter()
        wire.read_step(header, body)
        read_times.append((time.perf_counter() - t0) / ROWS_PER_WORKER)
    read = quantiles(read_times)

    print(f"{args.encoding} at {args.rate} Hz, {args.frames} frames of 80 ms; microseconds a frame, median / p95")
    print(f"| engine_event: the session's encode and the wire frame | {per_frame[0]:.1f} / {per_frame[1]:.1f} |")
    print(f"| of it, the format's encode alone (codecs, a fresh encoder) | {encode[0]:.1f} / {encode[1]:.1f} |")
    print(f"| a step message's read, a row's share of {ROWS_PER_WORKER} | {read[0]:.2f} / {read[1]:.2f} |")
    second_ms = 12.5 * (per_frame[0] + read[0]) / 1e3
    print(f"| a worker's CPU a second of audio at the median (12.5 frames) | {second_ms:.2f} ms |")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        frames_through(proto, context, pcm, args.frames)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
