"""Opus through libopus (opuslib's ctypes binding): 20 ms mono packets, state carried across chunks.

Application RESTRICTED_LOWDELAY (CELT only). Measured on the 2-core EPYC build machine, 24 kHz,
complexity 5, 20 ms frames: ~35-40 us per packet and 2.5 ms of lookahead, against ~130 us and
6.5 ms for VOIP (SILK/hybrid) at the same complexity; CELT also tracks the waveform (SNR ~28 dB at
32 kbit/s, ~35 dB at 64 on a tone + chirp, where VOIP's SILK gives ~7 dB), so the round trip is
testable. SILK's edge is below ~24 kbit/s, which a LAN or data-centre gateway does not need.
Complexity 5 rather than libopus's default 10: it is the lowest level at which CELT runs its pitch
pre-filter (which voiced speech needs: without it, at 4, a female voice lost 0.5 of PESQ-WB at 48 kbit/s
and 1.1 at 24, bench/opus_quality.py), and it costs 25-43% less than 10 (PESQ-WB 0.12-0.14 lower on
speech). At 4 packets per 80 ms engine frame that is ~140 us per frame and stream.

libopus is loaded when the first encoder or decoder is made, not when talkgate.codecs is imported,
so a server without it still starts and serves PCM; asking for Opus then raises `OpusUnavailable`.
"""
from __future__ import annotations

import numpy as np

from talkgate.codecs.formaterror import FormatError
from talkgate.codecs.pcm import clean_f32

FRAME_MS = 20
RATES = (8000, 12000, 16000, 24000, 48000)    # the rates libopus accepts
DEFAULT_BITRATE = 48000
DEFAULT_COMPLEXITY = 5
APPLICATION = "restricted_lowdelay"
MAX_PACKET_MS = 120

MISSING_LIBOPUS = ("libopus not found: install it with `apt-get install libopus0` (Debian/Ubuntu), "
                   "`dnf install opus` (Fedora), `apk add opus` (Alpine) or `brew install opus` (macOS), "
                   "then restart the server")
MISSING_OPUSLIB = "the Python package opuslib is missing: install it with `pip install opuslib`"


class OpusUnavailable(FormatError):
    """Opus was asked for but libopus (or opuslib) cannot be loaded on this machine."""


def _opuslib():
    try:
        import opuslib
    except ImportError as e:
        raise OpusUnavailable(MISSING_OPUSLIB) from e
    except Exception as e:      # opuslib raises a bare Exception at import when ctypes finds no libopus
        raise OpusUnavailable(MISSING_LIBOPUS) from e
    return opuslib


class OpusEncoder:
    """float32 mono at `sample_rate` in any chunking -> whole 20 ms Opus packets.

    Partial frames wait in a buffer for the next chunk. `flush()` pads with silence and emits as many
    packets as it takes for the decoder output, which lags the input by `lookahead` samples, to
    cover every input sample: ceil((samples_in + lookahead) / frame_size) packets in all.
    """

    def __init__(self, sample_rate: int = 48000, bitrate: int = DEFAULT_BITRATE,
                 complexity: int = DEFAULT_COMPLEXITY, application: str = APPLICATION):
        if sample_rate not in RATES:
            raise FormatError(f"Opus takes sample rates {', '.join(map(str, RATES))} Hz, not {sample_rate}")
        if not 6000 <= bitrate <= 510000:
            raise FormatError(f"Opus bitrate must be 6000..510000 bit/s, not {bitrate}")
        self._enc = _opuslib().Encoder(sample_rate, 1, application)
        self._enc.bitrate = bitrate
        self._enc.complexity = complexity
        self.sample_rate = sample_rate
        self.frame_size = sample_rate * FRAME_MS // 1000
        self.lookahead = self._enc.lookahead        # samples at sample_rate; the Ogg pre-skip
        self.samples_in = 0
        self.packets_out = 0
        self._buf = np.zeros(self.frame_size, dtype=np.float32)
        self._fill = 0

    def encode(self, pcm: np.ndarray) -> list[bytes]:
        x = clean_f32(pcm)
        self.samples_in += len(x)
        F, packets, pos = self.frame_size, [], 0
        if self._fill:
            pos = min(F - self._fill, len(x))
            self._buf[self._fill:self._fill + pos] = x[:pos]
            self._fill += pos
            if self._fill < F:
                return packets
            packets.append(self._packet(self._buf))
            self._fill = 0
        while len(x) - pos >= F:
            packets.append(self._packet(x[pos:pos + F]))
            pos += F
        self._fill = len(x) - pos
        self._buf[:self._fill] = x[pos:]
        return packets

    def flush(self) -> list[bytes]:
        needed = -(-(self.samples_in + self.lookahead) // self.frame_size)
        packets = []
        while self.packets_out < needed:
            self._buf[self._fill:] = 0.0
            packets.append(self._packet(self._buf))
            self._fill = 0
        return packets

    def _packet(self, frame: np.ndarray) -> bytes:
        self.packets_out += 1
        return self._enc.encode_float(frame.tobytes(), self.frame_size)


class OpusDecoder:
    """Opus packets -> float32 mono at `sample_rate` (tests, and clients' point of view)."""

    def __init__(self, sample_rate: int = 48000):
        self._dec = _opuslib().Decoder(sample_rate, 1)
        self.sample_rate = sample_rate
        self._max_samples = sample_rate * MAX_PACKET_MS // 1000

    def decode(self, packet: bytes) -> np.ndarray:
        pcm = self._dec.decode_float(packet, self._max_samples)
        return np.frombuffer(pcm, dtype=np.float32).copy()
