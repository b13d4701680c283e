"""Float PCM -> linear PCM bytes: s16le (rounded, clipped, never wrapped) and f32le (clipped)."""
from __future__ import annotations

import numpy as np

S16_SCALE = 32767.0     # +1.0 -> 32767 and -1.0 -> -32767; anything below -1.0 clips at -32768


def clean_f32(x: np.ndarray) -> np.ndarray:
    """A new float32 copy of `x` with NaN -> 0 and everything clipped to [-1, 1]."""
    y = np.array(x, dtype=np.float32)          # copy: the caller's array is never modified
    if y.ndim != 1:
        raise ValueError(f"expected mono samples as a 1-D array, got shape {y.shape}")
    np.clip(y, -1.0, 1.0, out=y)         # clips +-inf too; NaN passes through clip
    y[np.isnan(y)] = 0.0
    return y


def to_s16(x: np.ndarray) -> np.ndarray:
    """float samples -> int16, rounded to nearest; out-of-range and NaN input can never wrap around."""
    y = np.multiply(x, S16_SCALE, dtype=np.float32)
    if y.ndim != 1:
        raise ValueError(f"expected mono samples as a 1-D array, got shape {y.shape}")
    np.clip(y, -32768.0, 32767.0, out=y)
    y[np.isnan(y)] = 0.0                 # (half the cost of np.nan_to_num)
    return np.rint(y, out=y).astype(np.int16)


def s16le_bytes(x: np.ndarray) -> bytes:
    return to_s16(x).astype("<i2", copy=False).tobytes()


def f32le_bytes(x: np.ndarray) -> bytes:
    return clean_f32(x).astype("<f4", copy=False).tobytes()


def s16le_to_f32(data: bytes) -> np.ndarray:
    """Inverse of `s16le_bytes` (within half a step): for tests and for inbound audio."""
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / S16_SCALE
