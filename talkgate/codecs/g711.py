"""ITU-T G.711 mu-law and A-law, as 64 Ki-entry lookup tables indexed by the int16 sample.

The tables are computed once, vectorized, with the segment search of the classic reference coder
(Sun Microsystems' g711.c, which is also what CPython's audioop used): mu-law works on the top 14
bits of the sample (bias 33, clip at 8159), A-law on the top 13 bits. Encoding a chunk is then one
gather, which is the cheapest thing numpy can do per sample.
"""
from __future__ import annotations

import numpy as np

from talkgate.codecs.pcm import to_s16

_ULAW_SEG_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_ALAW_SEG_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])


def _ulaw_table() -> np.ndarray:
    v = np.arange(-32768, 32768, dtype=np.int32) >> 2
    mask = np.where(v < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(v), 8159) + 0x21
    seg = np.searchsorted(_ULAW_SEG_END, mag, side="left")
    code = np.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> (seg + 1)) & 0xF))
    return _by_uint16((code ^ mask).astype(np.uint8))


def _alaw_table() -> np.ndarray:
    v = np.arange(-32768, 32768, dtype=np.int32) >> 3
    mask = np.where(v >= 0, 0xD5, 0x55)
    mag = np.where(v >= 0, v, -v - 1)
    seg = np.searchsorted(_ALAW_SEG_END, mag, side="left")
    shift = np.clip(seg, 1, 8)        # segments 0 and 1 share the step size
    code = np.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> shift) & 0xF))
    return _by_uint16((code ^ mask).astype(np.uint8))


def _by_uint16(table_from_minus_32768: np.ndarray) -> np.ndarray:
    """Reorder so that the table is indexed by the sample's bits read as uint16."""
    return np.roll(table_from_minus_32768, -32768)


def _ulaw_decode_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _alaw_decode_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = (a & 0x0F) << 4
    t = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, t, -t).astype(np.int16)


ULAW_ENCODE, ALAW_ENCODE = _ulaw_table(), _alaw_table()
ULAW_DECODE, ALAW_DECODE = _ulaw_decode_table(), _alaw_decode_table()


def ulaw_from_s16(s16: np.ndarray) -> np.ndarray:
    return ULAW_ENCODE[s16.view(np.uint16)]


def alaw_from_s16(s16: np.ndarray) -> np.ndarray:
    return ALAW_ENCODE[s16.view(np.uint16)]


def ulaw_bytes(x: np.ndarray) -> bytes:
    """float samples -> mu-law bytes (one byte per sample)."""
    return ulaw_from_s16(to_s16(x)).tobytes()


def alaw_bytes(x: np.ndarray) -> bytes:
    """float samples -> A-law bytes (one byte per sample)."""
    return alaw_from_s16(to_s16(x)).tobytes()


def ulaw_decode(data: bytes) -> np.ndarray:
    """mu-law bytes -> int16 samples (Twilio inbound audio, tests)."""
    return ULAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def alaw_decode(data: bytes) -> np.ndarray:
    """A-law bytes -> int16 samples."""
    return ALAW_DECODE[np.frombuffer(data, dtype=np.uint8)]
