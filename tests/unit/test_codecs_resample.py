"""The streaming resampler: chunked output equals one-shot output, time-aligned, tail on flush."""
from __future__ import annotations

import numpy as np
import pytest
import soxr

from talkgate.codecs.resample import QUALITY, RATES, Resampler


def _chunks(x: np.ndarray, seed: int) -> list[np.ndarray]:
    """Odd chunk sizes, including empty and one-sample chunks and several engine frames at once."""
    rng = np.random.default_rng(seed)
    out, i = [], 0
    while i < len(x):
        n = int(rng.choice([0, 1, 7, 480, 1919, 1920, 3840, 5760]))
        out.append(x[i:i + n])
        i += n
    return out


def _signal(n: int, rate: int = 24000) -> np.ndarray:
    t = np.arange(n) / rate
    chirp = np.sin(2 * np.pi * (100 * t + 2900 * t * t))
    return (0.4 * np.sin(2 * np.pi * 440 * t) + 0.3 * chirp).astype(np.float32)


@pytest.mark.parametrize("rate", [r for r in RATES if r != 24000])
def test_chunked_output_equals_one_shot(rate):
    x = _signal(24000 + 1234)
    r = Resampler(rate)
    y = np.concatenate([r.process(c) for c in _chunks(x, rate)] + [r.flush()])
    one_shot = soxr.resample(x, 24000, rate, quality=QUALITY)
    assert y.dtype == np.float32
    assert len(y) == len(one_shot) == round(len(x) * rate / 24000)
    np.testing.assert_allclose(y, one_shot, rtol=0, atol=1e-6)


@pytest.mark.parametrize("rate", [8000, 16000, 48000])
def test_output_is_time_aligned_with_the_input(rate):
    """Output sample k is input time k / rate: no leading filter delay to trim."""
    n = 24000
    x = (0.5 * np.sin(2 * np.pi * 1000 * np.arange(n) / 24000)).astype(np.float32)
    r = Resampler(rate)
    y = np.concatenate([r.process(x[i:i + 1920]) for i in range(0, n, 1920)] + [r.flush()])
    want = 0.5 * np.sin(2 * np.pi * 1000 * np.arange(len(y)) / rate)
    middle = slice(rate // 10, len(y) - rate // 10)      # away from the start and end transients
    assert np.abs(y[middle] - want[middle]).max() < 2e-3


def test_the_tail_is_held_until_flush():
    r = Resampler(48000)
    streamed = sum(len(r.process(np.zeros(1920, np.float32))) for _ in range(10))
    tail = len(r.flush())
    assert streamed + tail == 2 * 19200
    assert 0 < tail <= 48000 * 50 // 1000       # the documented ~21 ms (at most 50 ms) held back


def test_24k_passes_through_untouched():
    r = Resampler(24000)
    x = _signal(1000)
    assert np.array_equal(r.process(x), x)
    assert len(r.flush()) == 0


def test_rejects_multichannel_input():
    with pytest.raises(ValueError, match="1-D"):
        Resampler(16000).process(np.zeros((10, 2), np.float32))
