"""What a lower Opus complexity costs in quality, on speech (issue 44: libopus is a third to 60% of a gateway worker's
CPU at 512 Opus streams; complexity 4 took 30-36% less time a packet than talkgate's 5 on the H200 host,
bench/opus_cost.py, but its quality was not measured: random weights make no speech).

Speech from the rule-based synthesizers Debian packages (flite's voices: kal16, a diphone voice of recorded speech,
slt and rms, statistical voices; espeak-ng, formants), the load generator's English medium prompts, resampled to the
engine's 24 kHz; each encoded as a stream is (talkgate.codecs.opus.OpusEncoder fed 80-ms frames, the rate and
application talkgate uses) at each complexity and bitrate, decoded, aligned by the encoder's lookahead; then PESQ
(ITU-T P.862.2 wideband, the `pesq` package, at 16 kHz) and the waveform SNR against the input. Printed: the mean over
the utterances, and each complexity's paired difference from 5 (mean and its 95% interval; PESQ's also by voice).

    apt-get install flite espeak-ng; pip install pesq          # the tool's own needs, not talkgate's
    python -m bench.opus_quality [--complexities 3,4,5,6,10] [--bitrates 24000,32000,48000] [--voices kal16,slt,...]
"""
from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soundfile
import soxr
import torch

from talkgate.codecs.opus import OpusDecoder, OpusEncoder
from talkgate.loadgen.prompts import EN_MEDIUM
from talkgate.synth.decoder_precision import snr_db

RATE = 24000
FRAME = RATE * 80 // 1000           # the engine's 80-ms frame: what a stream's encoder is fed at a time
SYNTHS = {"kal16": ["flite", "-voice", "kal16"], "slt": ["flite", "-voice", "slt"], "rms": ["flite", "-voice", "rms"],
          "espeak": ["espeak-ng", "-v", "en-us"]}


def speech(voice: str, text: str, folder: Path) -> np.ndarray:
    """The text spoken by `voice`, float32 at 24 kHz, scaled to a peak of 0.5."""
    wav = folder / "s.wav"
    cmd = SYNTHS[voice] + (["-t", text, "-o", str(wav)] if voice != "espeak" else ["-w", str(wav), text])
    subprocess.run(cmd, check=True, capture_output=True)
    x, rate = soundfile.read(wav, dtype="float32")
    x = soxr.resample(x, rate, RATE).astype(np.float32)
    return 0.5 * x / max(1e-6, float(np.abs(x).max()))


def through_opus(x: np.ndarray, complexity: int, bitrate: int) -> np.ndarray:
    enc, dec = OpusEncoder(RATE, bitrate, complexity=complexity), OpusDecoder(RATE)
    packets = [p for i in range(0, len(x), FRAME) for p in enc.encode(x[i:i + FRAME])] + enc.flush()
    y = np.concatenate([dec.decode(p) for p in packets])
    return y[enc.lookahead:enc.lookahead + len(x)]


def scores(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(PESQ wideband MOS-LQO, SNR dB) of the decoded y against the input x."""
    from pesq import pesq
    mos = pesq(16000, soxr.resample(x, RATE, 16000), soxr.resample(y, RATE, 16000), "wb")
    return mos, snr_db(torch.from_numpy(x), torch.from_numpy(y))


def interval(d: list[float]) -> str:
    m = statistics.fmean(d)
    half = 1.96 * statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
    return f"{m:+.3f} +- {half:.3f}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--complexities", default="3,4,5,6,10")
    p.add_argument("--bitrates", default="24000,32000,48000")
    p.add_argument("--voices", default=",".join(SYNTHS))
    p.add_argument("--texts", type=int, default=len(EN_MEDIUM), help="the first N English medium prompts")
    args = p.parse_args()
    complexities = [int(c) for c in args.complexities.split(",")]
    bitrates = [int(b) for b in args.bitrates.split(",")]
    texts = EN_MEDIUM[:args.texts]
    with tempfile.TemporaryDirectory() as tmp:
        clips = [(v, speech(v, t, Path(tmp))) for v in args.voices.split(",") for t in texts]
    print(f"{len(clips)} utterances ({args.voices}; {len(texts)} texts), {sum(len(x) for _, x in clips) / RATE:.0f} s")
    voices = list(dict.fromkeys(v for v, _ in clips))
    print("| bitrate | complexity | PESQ-WB mean | its difference from 5 | by voice | SNR dB mean "
          "| its difference from 5 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for bitrate in bitrates:
        got = {c: [scores(x, through_opus(x, c, bitrate)) for _, x in clips] for c in complexities}
        for c in complexities:
            mos, snr = [s[0] for s in got[c]], [s[1] for s in got[c]]
            dm = ds = by_voice = ""
            if 5 in got and c != 5:
                dmos = [a[0] - b[0] for a, b in zip(got[c], got[5])]
                dm, ds = interval(dmos), interval([a[1] - b[1] for a, b in zip(got[c], got[5])])
                by_voice = ", ".join(f"{v} {statistics.fmean(d for (w, _), d in zip(clips, dmos) if w == v):+.2f}"
                                     for v in voices)
            print(f"| {bitrate // 1000} kbit/s | {c} | {statistics.fmean(mos):.3f} | {dm} | {by_voice} "
                  f"| {statistics.fmean(snr):.2f} | {ds} |", flush=True)


if __name__ == "__main__":
    main()
