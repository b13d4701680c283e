"""MP3 (LAME) and FLAC (libFLAC) through the libsndfile bundled in the soundfile wheel, into memory.

Both stream: libsndfile writes encoded frames as samples arrive (MP3 every 576/1152 samples, FLAC
every 1152-sample block at compression level 0), and `SndfileEncoder.write` hands back whatever
bytes were appended. At close libsndfile seeks back to fill in what only the end knows (FLAC's
STREAMINFO totals and MD5, the LAME/Xing info frame of an MP3). In streaming mode those bytes have
left already, so they are dropped: the stream keeps a valid header that says "length unknown"
(FLAC total_samples 0; an MP3 info frame left empty decodes as one frame of silence). In whole-file
mode nothing leaves before close and the rewrite lands, giving an exact header.

MP3 is constant bitrate, so players that estimate duration from the bitrate are right while
streaming. Measured on the 2-core EPYC build machine: MP3 ~350 us and FLAC ~30 us per 80 ms chunk.
"""
from __future__ import annotations

import io

import numpy as np
import soundfile

# MPEG layer III bitrate ranges (kbit/s) by sample rate, as libsndfile maps compression 0..1 onto them
_MP3_KBPS_RANGE = {8000: (8, 64), 16000: (8, 160), 22050: (8, 160), 24000: (8, 160),
                   32000: (32, 320), 44100: (32, 320), 48000: (32, 320)}
MP3_RATES = tuple(_MP3_KBPS_RANGE)
MP3_DEFAULT_KBPS = {8000: 32, 16000: 64, 22050: 64, 24000: 64, 32000: 128, 44100: 128, 48000: 128}
FLAC_COMPRESSION = 0.0      # libFLAC level 0: 1152-sample blocks (48 ms at 24 kHz), lossless anyway


class _Sink:
    """A seekable in-memory file whose bytes before `base` have been taken (sent) and are gone.

    Writes that land before `base` are the close-time header rewrites: their part before `base`
    is dropped.
    """

    def __init__(self):
        self._data = bytearray()
        self._base = 0
        self._pos = 0

    def write(self, b) -> int:
        n = len(b)
        start = self._pos - self._base
        b = memoryview(b)[max(0, -start):]
        start = max(0, start)
        if start > len(self._data):
            self._data += bytes(start - len(self._data))
        self._data[start:start + len(b)] = b
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        end = self._base + len(self._data)
        self._pos = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: end}[whence] + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def take(self) -> bytes:
        """The bytes written since the last take (at the end of the file so far)."""
        out = bytes(self._data)
        self._base += len(self._data)
        self._data.clear()
        return out


class SndfileEncoder:
    """float32 mono -> MP3 or FLAC bytes; `streaming=False` returns everything from `close()`."""

    def __init__(self, fmt: str, sample_rate: int, streaming: bool = True, mp3_kbps: int | None = None):
        self.streaming = streaming
        self._sink = _Sink()
        if fmt == "mp3":
            lo, hi = _MP3_KBPS_RANGE[sample_rate]
            kbps = MP3_DEFAULT_KBPS[sample_rate] if mp3_kbps is None else mp3_kbps
            if not lo <= kbps <= hi:
                raise ValueError(f"MP3 at {sample_rate} Hz takes {lo}..{hi} kbit/s, not {kbps}")
            self._file = soundfile.SoundFile(self._sink, "w", sample_rate, 1, "MPEG_LAYER_III", format="MP3",
                                             bitrate_mode="CONSTANT", compression_level=(hi - kbps) / (hi - lo))
        elif fmt == "flac":
            self._file = soundfile.SoundFile(self._sink, "w", sample_rate, 1, "PCM_16", format="FLAC",
                                             compression_level=FLAC_COMPRESSION)
        else:
            raise ValueError(f"SndfileEncoder writes mp3 or flac, not {fmt!r}")

    def write(self, x: np.ndarray) -> bytes:
        if len(x):
            self._file.write(x)
        return self._sink.take() if self.streaming else b""

    def close(self) -> bytes:
        self._file.close()
        return self._sink.take()
