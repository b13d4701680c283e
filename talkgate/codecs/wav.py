"""RIFF/WAVE headers for 16-bit PCM: exact sizes for a whole file, or the streaming form.

The streaming form writes 0xFFFFFFFF for the RIFF and data sizes (length unknown), as OpenAI-style
speech servers do; players and libsndfile then read the data chunk up to the end of the body.
"""
from __future__ import annotations

import struct

UNKNOWN_SIZE = 0xFFFFFFFF
HEADER_BYTES = 44


def wav_header(sample_rate: int, n_samples: int | None = None, channels: int = 1) -> bytes:
    """44-byte header of a PCM16 WAV file; `n_samples=None` gives the streaming (unknown length) form."""
    block_align = 2 * channels
    if n_samples is None:
        riff_size = data_size = UNKNOWN_SIZE
    else:
        data_size = n_samples * block_align
        if data_size + HEADER_BYTES - 8 > 0xFFFFFFFF:
            raise ValueError(f"{n_samples} samples do not fit in a WAV file")
        riff_size = data_size + HEADER_BYTES - 8
    return struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", riff_size, b"WAVE", b"fmt ", 16, 1, channels,
                       sample_rate, sample_rate * block_align, block_align, 16, b"data", data_size)
