"""Linear PCM conversion and G.711, checked against a per-sample reference coder written out here."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from talkgate.codecs import g711, pcm

ALL_S16 = np.arange(-32768, 32768, dtype=np.int32)


# ----- reference G.711 coder: the classic per-sample algorithm (ITU-T G.711 / Sun g711.c), no numpy -----
def _segment(value: int, ends: list[int]) -> int:
    for i, end in enumerate(ends):
        if value <= end:
            return i
    return len(ends)


def ref_linear2ulaw(sample: int) -> int:
    v = sample >> 2
    if v < 0:
        v, mask = -v, 0x7F
    else:
        mask = 0xFF
    v = min(v, 8159) + 33
    seg = _segment(v, [0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
    if seg >= 8:
        return 0x7F ^ mask
    return ((seg << 4) | ((v >> (seg + 1)) & 0xF)) ^ mask


def ref_linear2alaw(sample: int) -> int:
    v = sample >> 3
    if v >= 0:
        mask = 0xD5
    else:
        mask, v = 0x55, -v - 1
    seg = _segment(v, [0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])
    if seg >= 8:
        return 0x7F ^ mask
    code = seg << 4
    code |= (v >> 1) & 0xF if seg < 2 else (v >> seg) & 0xF
    return code ^ mask


def ref_ulaw2linear(code: int) -> int:
    u = ~code & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return 0x84 - t if u & 0x80 else t - 0x84


def ref_alaw2linear(code: int) -> int:
    a = code ^ 0x55
    t = (a & 0x0F) << 4
    seg = (a & 0x70) >> 4
    if seg == 0:
        t += 8
    elif seg == 1:
        t += 0x108
    else:
        t = (t + 0x108) << (seg - 1)
    return t if a & 0x80 else -t


# ----- PCM -----
def test_s16_rounds_clips_and_never_wraps():
    x = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -1.5, 1e9, -1e9, np.inf, -np.inf, np.nan, 1 / 32767, 0.4 / 32767],
                 dtype=np.float32)
    s = pcm.to_s16(x)
    assert s.dtype == np.int16
    assert s.tolist() == [0, 16384, -16384, 32767, -32767, 32767, -32768, 32767, -32768, 32767, -32768, 0, 1, 0]
    assert pcm.s16le_bytes(x) == s.astype("<i2").tobytes()
    assert len(pcm.s16le_bytes(x)) == 2 * len(x)


def test_s16_round_trip_within_half_a_step():
    x = np.random.default_rng(0).uniform(-1, 1, 10000).astype(np.float32)
    back = pcm.s16le_to_f32(pcm.s16le_bytes(x))
    assert np.abs(back - x).max() <= 0.5 / 32767 + 1e-7


def test_f32le_clips_and_leaves_the_input_alone():
    x = np.array([0.25, 2.0, -3.0, np.nan, -0.75], dtype=np.float32)
    kept = x.copy()
    y = np.frombuffer(pcm.f32le_bytes(x), dtype="<f4")
    assert y.tolist() == [0.25, 1.0, -1.0, 0.0, -0.75]
    np.testing.assert_array_equal(x, kept)


def test_pcm_rejects_multichannel_arrays():
    with pytest.raises(ValueError, match="1-D"):
        pcm.s16le_bytes(np.zeros((2, 10), np.float32))


# ----- G.711 -----
def test_ulaw_and_alaw_encode_match_the_reference_for_every_int16():
    s16 = ALL_S16.astype(np.int16)
    assert g711.ulaw_from_s16(s16).tolist() == [ref_linear2ulaw(v) for v in ALL_S16.tolist()]
    assert g711.alaw_from_s16(s16).tolist() == [ref_linear2alaw(v) for v in ALL_S16.tolist()]


def test_ulaw_and_alaw_decode_match_the_reference_for_every_code():
    codes = bytes(range(256))
    assert g711.ulaw_decode(codes).tolist() == [ref_ulaw2linear(c) for c in codes]
    assert g711.alaw_decode(codes).tolist() == [ref_alaw2linear(c) for c in codes]


def test_g711_known_values():
    # silence, full scale and the extreme codes of both laws (values from the G.711 tables)
    assert g711.ulaw_from_s16(np.array([0, -1, 32767, -32768], np.int16)).tolist() == [0xFF, 0x7E, 0x80, 0x00]
    assert g711.alaw_from_s16(np.array([0, -1, 32767, -32768], np.int16)).tolist() == [0xD5, 0x55, 0xAA, 0x2A]
    assert g711.ulaw_decode(bytes([0xFF, 0x7F, 0x80, 0x00])).tolist() == [0, 0, 32124, -32124]
    assert g711.alaw_decode(bytes([0xD5, 0x55, 0xAA, 0x2A])).tolist() == [8, -8, 32256, -32256]


def test_g711_round_trip_error_is_within_half_a_segment_step():
    s16 = ALL_S16.astype(np.int16)
    for encode, decode, limit, shift in ((g711.ulaw_from_s16, g711.ulaw_decode, 32124, 2),
                                         (g711.alaw_from_s16, g711.alaw_decode, 32256, 3)):
        back = decode(encode(s16).tobytes()).astype(np.int32)
        inside = np.abs(ALL_S16) <= limit
        # a log-PCM step is 1/16 of the segment: about magnitude/16, at least one LSB of the coder's input
        step = np.maximum(np.abs(ALL_S16) >> 4, 1 << shift) * 2
        assert (np.abs(back - ALL_S16)[inside] <= step[inside] // 2 + (1 << shift)).all()
        assert (np.sign(back[np.abs(ALL_S16) > 64]) == np.sign(ALL_S16[np.abs(ALL_S16) > 64])).all()
        # out of range saturates at the largest code, never wraps
        assert np.abs(back[~inside]).min() == limit


def test_g711_float_path_matches_the_s16_path():
    x = np.random.default_rng(1).uniform(-1.2, 1.2, 4000).astype(np.float32)
    assert g711.ulaw_bytes(x) == g711.ulaw_from_s16(pcm.to_s16(x)).tobytes()
    assert g711.alaw_bytes(x) == g711.alaw_from_s16(pcm.to_s16(x)).tobytes()


def test_g711_matches_cpython_audioop():
    """A second, independent implementation where the interpreter still has one (removed in 3.13)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop", reason="audioop was removed in Python 3.13")
    data = ALL_S16.astype("<i2").tobytes()
    assert audioop.lin2ulaw(data, 2) == g711.ulaw_from_s16(ALL_S16.astype(np.int16)).tobytes()
    assert audioop.lin2alaw(data, 2) == g711.alaw_from_s16(ALL_S16.astype(np.int16)).tobytes()
