"""`TempoStretcher`: streaming tempo change without pitch change (WSOLA), for the OpenAI `speed`.

    ts = TempoStretcher(1.25)            # > 1 faster/shorter: output ~ input duration / speed
    for pcm in engine_chunks:            # float32 mono 24 kHz, any length
        send(ts.process(pcm))            # what is final so far (may be empty)
    send(ts.flush())                     # the rest; total length == round(len(input) / speed)

WSOLA (waveform-similarity overlap-add, Verhelst & Roelands 1993): output frames of 20 ms (480
samples) with a periodic Hann window are laid every 10 ms; frame k is read from the input near
k * 10 ms * speed, shifted by up to +-8 ms (192 samples) to the offset whose waveform best
matches (cross-correlation) the natural continuation of the previous frame, so periods line up
and pitch is kept. A periodic Hann at 50% overlap sums to exactly 1, so the output never exceeds
the input's peak.

Every frame is computed from absolute input positions only, so the output does not depend on
how the input was chunked. speed == 1.0 is an exact pass-through with no latency. Otherwise an
output sample is returned once the input reaches one frame plus the search window past where
its frame was read: at most FRAME + SEARCH = 672 samples (28 ms) of input held back, ~18 ms in
practice (the first half-frame overlaps), plus up to a hop more at speed < 1, where the
continuation template can reach past the search window.
"""
from __future__ import annotations

import numpy as np

RATE = 24000
FRAME = 480  # 20 ms analysis/synthesis frame
HOP = FRAME // 2  # 50% overlap at the output
SEARCH = 192  # +-8 ms offset search
MIN_SPEED, MAX_SPEED = 0.25, 4.0
# periodic Hann: at hop FRAME/2 the windows sum to exactly 1
WINDOW = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(FRAME) / FRAME)).astype(np.float32)


class TempoStretcher:
    """One per stream: mono float32 24 kHz in, same out at `speed` times the tempo."""

    def __init__(self, speed: float):
        speed = float(speed)
        if not MIN_SPEED <= speed <= MAX_SPEED:  # also rejects nan
            raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed}")
        self.speed = speed
        self._in_hop = HOP * speed
        # the input is padded with HOP zeros at the front so the first output sample is not
        # faded in; the first HOP output samples (the fade) are dropped
        self._buf = np.zeros(HOP, dtype=np.float32)
        self._buf_start = 0  # absolute (padded) input index of _buf[0]
        self._n_in = 0  # real input samples received
        self._k = 0  # next frame to compute
        self._prev = None  # absolute input position the previous frame was read from
        self._acc = np.zeros(FRAME, dtype=np.float32)  # output from k*HOP, partly summed
        self._to_drop = HOP
        self._n_out = 0  # samples returned so far

    def process(self, pcm: np.ndarray) -> np.ndarray:
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if self.speed == 1.0:
            return pcm
        self._n_in += len(pcm)
        self._buf = np.concatenate([self._buf, pcm])
        return self._run()

    def flush(self) -> np.ndarray:
        """The rest of the stream: pads with silence until round(len(input) / speed) is reached."""
        if self.speed == 1.0:
            return np.zeros(0, dtype=np.float32)
        target = round(self._n_in / self.speed)
        start = self._n_out
        parts = []
        while self._n_out < target:  # _run counts what it returns in _n_out
            short = self._needed_end() - (self._buf_start + len(self._buf))
            self._buf = np.concatenate([self._buf, np.zeros(max(short, 0) + HOP, np.float32)])
            parts.append(self._run())
        out = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
        self._n_out = max(target, start)
        return out[: self._n_out - start]

    def _nominal(self, k: int) -> int:
        return int(k * self._in_hop + 0.5)  # padded input index frame k is read from before the search

    def _needed_end(self) -> int:
        """Absolute input index one past what frame self._k reads (candidates and template)."""
        end = self._nominal(self._k) + SEARCH + FRAME
        if self._prev is not None:
            end = max(end, self._prev + HOP + FRAME)
        return end

    def _run(self) -> np.ndarray:
        out = []
        while self._buf_start + len(self._buf) >= self._needed_end():
            out.append(self._frame())
        if not out:
            return np.zeros(0, dtype=np.float32)
        done = np.concatenate(out)
        dropped = min(self._to_drop, len(done))
        self._to_drop -= dropped
        done = done[dropped:]
        self._n_out += len(done)
        return done

    def _frame(self) -> np.ndarray:
        """Overlap-add frame self._k; returns the HOP output samples it makes final."""
        b = self._buf_start
        nominal = self._nominal(self._k)
        if self._prev is None:
            pos = nominal
        else:
            template = self._buf[self._prev + HOP - b : self._prev + HOP - b + FRAME]
            lo = max(nominal - SEARCH, 0)
            region = self._buf[lo - b : nominal + SEARCH + FRAME - b]
            score = np.correlate(region, template, mode="valid")
            pos = lo + int(np.argmax(score))
        self._acc += WINDOW * self._buf[pos - b : pos - b + FRAME]
        done = self._acc[:HOP].copy()
        self._acc = np.concatenate([self._acc[HOP:], np.zeros(HOP, np.float32)])
        self._prev = pos
        self._k += 1
        # drop input no later frame can read: the next template starts at pos + HOP and the
        # next candidates at nominal(k) - SEARCH
        keep_from = min(pos + HOP, self._nominal(self._k) - SEARCH)
        if keep_from - b > 4 * FRAME:
            self._buf = self._buf[keep_from - b :]
            self._buf_start = keep_from
        return done
