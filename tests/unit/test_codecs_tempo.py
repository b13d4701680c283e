import numpy as np
import pytest

from talkgate.codecs.tempo import RATE, TempoStretcher

SPEEDS = (0.5, 0.8, 1.25, 2.0)


def speechlike(n, seed=0):
    """Noise through a slowly changing resonance plus a 150 Hz buzz: not periodic, not flat."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / RATE
    buzz = np.sign(np.sin(2 * np.pi * 150 * t)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return (0.3 * buzz + 0.2 * rng.standard_normal(n)).astype(np.float32)


def stretch(x, speed):
    ts = TempoStretcher(speed)
    return np.concatenate([ts.process(x), ts.flush()])


def test_speed_one_is_identity():
    x = speechlike(5000)
    ts = TempoStretcher(1.0)
    out = ts.process(x)
    assert np.array_equal(out, x)
    assert len(ts.flush()) == 0


@pytest.mark.parametrize("speed", SPEEDS)
def test_output_length(speed):
    x = speechlike(RATE)
    out = stretch(x, speed)
    assert out.dtype == np.float32
    assert len(out) == round(len(x) / speed)  # flush pads to the exact length


@pytest.mark.parametrize("speed", SPEEDS)
def test_chunking_does_not_change_output(speed):
    x = speechlike(RATE, seed=1)
    rng = np.random.default_rng(2)
    ts = TempoStretcher(speed)
    parts, i = [], 0
    while i < len(x):
        n = int(rng.integers(0, 700))
        parts.append(ts.process(x[i : i + n]))
        i += n
    parts.append(ts.flush())
    assert np.array_equal(np.concatenate(parts), stretch(x, speed))


@pytest.mark.parametrize("speed", SPEEDS)
def test_sine_keeps_pitch_and_peak(speed):
    x = (0.8 * np.sin(2 * np.pi * 220 * np.arange(RATE) / RATE)).astype(np.float32)
    out = stretch(x, speed)
    mid = out[len(out) // 8 : -len(out) // 8]
    spectrum = np.abs(np.fft.rfft(mid * np.hanning(len(mid))))
    peak_hz = np.argmax(spectrum) * RATE / len(mid)
    assert abs(peak_hz - 220) <= 0.03 * 220
    assert np.max(np.abs(out)) <= 1.05 * np.max(np.abs(x))


def test_output_starts_without_waiting_for_flush():
    ts = TempoStretcher(1.25)
    assert len(ts.process(speechlike(RATE // 10))) > 0


@pytest.mark.parametrize("speed", [0.2, 4.5, 0.0, -1.0, float("nan")])
def test_invalid_speed(speed):
    with pytest.raises(ValueError, match="speed must be between 0.25 and 4.0"):
        TempoStretcher(speed)
