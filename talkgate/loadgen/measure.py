"""The pure parts of the load generator: wire-format parsing, arrival schedules, text deltas, the
simulated player, percentiles and Prometheus scrapes. No I/O but reading the tokenizer files once, so
tests/unit/test_loadgen.py and tests/unit/test_bench_pacing.py check them exactly."""
from __future__ import annotations

import functools
import itertools
import math
import random
import re
import struct

from talkgate.synth.api import FRAME_MS
from talkgate.synth.request import frames_for_text
from talkgate.synth.tokenizer import QwenTokenizer, StreamingTokenizer, qwen_tokenizer_dir

HEADER = struct.Struct("<BBHIII")      # version, encoding, reserved, stream, seq, start_ms (docs/protocol.md)


# ----- wire formats
def parse_audio_header(frame: bytes) -> tuple[int, int, int, int]:
    """A native binary audio frame's header -> (encoding code, stream, seq, start_ms)."""
    if len(frame) < HEADER.size:
        raise ValueError(f"binary frame of {len(frame)} bytes is shorter than the {HEADER.size}-byte header")
    version, encoding, _, stream, seq, start_ms = HEADER.unpack_from(frame)
    if version != 1:
        raise ValueError(f"unknown audio header version {version}")
    return encoding, stream, seq, start_ms


def opus_packet_ms(packet: bytes) -> float:
    """Duration of one Opus packet from its TOC byte (RFC 6716 section 3.1)."""
    if not packet:
        raise ValueError("empty Opus packet")
    config, code = packet[0] >> 3, packet[0] & 3
    if config < 12:
        frame_ms = (10, 20, 40, 60)[config % 4]      # SILK
    elif config < 16:
        frame_ms = (10, 20)[config % 2]              # hybrid
    else:
        frame_ms = (2.5, 5, 10, 20)[config % 4]      # CELT
    if code == 0:
        count = 1
    elif code in (1, 2):
        count = 2
    else:
        if len(packet) < 2:
            raise ValueError("Opus code-3 packet without a frame-count byte")
        count = packet[1] & 0x3F
    return frame_ms * count


def parse_prometheus(text: str) -> dict[tuple[str, tuple], float]:
    """Prometheus text exposition -> {(name, sorted label pairs): value}; comments are skipped."""
    out = {}
    line_re = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        m = line_re.match(line)
        if not m or line.startswith("#"):
            continue
        labels = tuple(sorted(label_re.findall(m.group(2) or "")))
        try:
            out[(m.group(1), labels)] = float(m.group(3))
        except ValueError:
            continue
    return out


# ----- measurements
def poisson_arrivals(rps: float, duration_s: float, rng: random.Random, limit: int | None = None) -> list[float]:
    """Arrival offsets (s) of a Poisson process of rate `rps` within [0, duration_s), at most `limit`."""
    if rps <= 0:
        raise ValueError("rps must be positive")
    out, t = [], rng.expovariate(rps)
    while t < duration_s and (limit is None or len(out) < limit):
        out.append(t)
        t += rng.expovariate(rps)
    return out


@functools.cache
def qwen_tokenizer() -> QwenTokenizer:
    """The model's text tokenizer, read once per process (about half a second)."""
    return QwenTokenizer.from_dir(qwen_tokenizer_dir())


def token_deltas(text: str) -> list[str]:
    """Split text the way an LLM streams it: one Qwen token a delta, so that a rate in deltas per second
    is a rate in the text tokens the TTS model consumes (one per audio frame) whatever the language.
    A delta is the text between consecutive token boundaries; a boundary is a token end where the next
    token starts, so the bytes of one character split by byte-level BPE (tokens that all carry that
    character's offsets) stay in one delta. The deltas concatenate to the text exactly."""
    offsets = qwen_tokenizer().text_tok.encode(text, add_special_tokens=False).offsets
    cuts = [end for (_, end), (start, _) in itertools.pairwise(offsets) if end == start]
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def token_messages(text: str, ids: bool = False) -> list[dict]:
    """The native `text` messages of `text` streamed a token a message: each token's text (token_deltas), or with
    `ids` each token id (a client whose LLM speaks Qwen's tokenizer)."""
    if ids:
        return [{"ids": [i]} for i in qwen_tokenizer().encode(text)]
    return [{"text": delta} for delta in token_deltas(text)]


def commit_times(deltas: list[str], rate: float) -> tuple[list[float], float]:
    """Delta i sent at i / rate s, as the native load paces it, into the server's StreamingTokenizer -> (ms at which
    each token is committed, ms at which the text ends: the flush after the last delta)."""
    stream = StreamingTokenizer(qwen_tokenizer())
    times = []
    for i, delta in enumerate(deltas):
        times += [1000 * i / rate] * len(stream.feed(delta))
    end = 1000 * (len(deltas) - 1) / rate
    return times + [end] * len(stream.finish()), end


def frame_ready_ms(text: str, deltas: list[str], rate: float) -> list[float]:
    """When each frame of `text`, sent as `deltas` at `rate` a second, can be made at the earliest: frame k once token
    k is committed (the server's StreamingTokenizer proves a token complete only when the text after it does), the
    frames past the last token at the text's end."""
    times, end = commit_times(deltas, rate)
    return [times[k] if k < len(times) else end for k in range(frames_for_text(text))]


def least_slack(ready: list[float]) -> tuple[float, int]:
    """(ms, frame) of frames made at `ready` (frame_ready_ms): a player that starts at frame 0 plays frame k 80 k ms
    later, so what frame k has to spare is ready(0) + 80 k - ready(k); the least over frames 1.."""
    spare = [ready[0] + FRAME_MS * k - ready[k] for k in range(1, len(ready))]
    least = min(spare, default=float("inf"))
    return least, (spare.index(least) + 1 if spare else 0)


def text_slack(text: str, rate: float) -> tuple[float, int]:
    """(ms, frame): the least time a server has to spare, over frames 1.., when `text` is streamed a token a delta at
    `rate` deltas a second, its frames made the moment they can be (frame_ready_ms) as an infinitely fast server
    would. 0: any real server's player runs dry there unless its first audio waits (bench/text_slack.py prints every
    prompt's)."""
    return least_slack(frame_ready_ms(text, token_deltas(text), rate))


def simulate_player(chunks: list[tuple[float, float]], tolerance_ms: float = 1.0) -> tuple[int, float, float | None]:
    """Underruns of a real-time player that starts playing the first chunk the moment it arrives.
    chunks: (arrival_ms, duration_ms) in arrival order. When the player has played everything it has,
    it stalls until the next chunk arrives; a stall longer than `tolerance_ms` is an underrun.
    -> (underrun count, total stalled ms, ms of audio played when it first ran dry: None without any)."""
    count, stalled, play_end, played, first = 0, 0.0, None, 0.0, None
    for arrival, duration in chunks:
        if play_end is None:
            play_end = arrival
        elif arrival > play_end:
            gap = arrival - play_end
            if gap > tolerance_ms:
                if first is None:
                    first = played
                count += 1
                stalled += gap
            play_end = arrival
        play_end += duration
        played += duration
    return count, stalled, first


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); q in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stats(values: list[float]) -> dict | None:
    """n, p50, p95, p99, mean, max of the values, or None when there are none."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"n": len(values), "p50": percentile(values, 50), "p95": percentile(values, 95),
            "p99": percentile(values, 99), "mean": sum(values) / len(values), "max": max(values)}


def histogram_delta(before: dict, after: dict, name: str, **only: str) -> dict | None:
    """A Prometheus histogram's observations between two scrapes: count, mean and bucket-bound quantiles (the upper
    bound of the bucket holding the quantile; max_le: the largest observation's), summed over its label sets (those
    with the labels `only`, e.g. worker="0"); a gauge of that name gives its value."""
    def picked(labels) -> bool:
        d = dict(labels)
        return all(d.get(k) == v for k, v in only.items())

    def buckets(scrape):
        out = {}
        for (n, labels), v in scrape.items():
            if n == name + "_bucket" and "le" in dict(labels) and picked(labels):
                le = float(dict(labels)["le"])
                out[le] = out.get(le, 0.0) + v
        return out

    def total_of(scrape, suffix):
        return sum(v for (n, labels), v in scrape.items() if n == name + suffix and picked(labels))

    b1, b0 = buckets(after), buckets(before)
    if not b1:
        gauge = after.get((name, ()))
        return None if gauge is None else {"value": gauge}
    count = total_of(after, "_count") - total_of(before, "_count")
    total = total_of(after, "_sum") - total_of(before, "_sum")
    out = {"count": count, "mean": total / count if count else None}
    cum = sorted((le, v - b0.get(le, 0.0)) for le, v in b1.items())
    def bucket_of(share: float):        # the first bucket holding that share of the observations
        return next((le for le, c in cum if c >= count * share), None) if count else None

    out.update({f"p{q}_le": bucket_of(q / 100) for q in (50, 95, 99)}, max_le=bucket_of(1.0))
    return out
