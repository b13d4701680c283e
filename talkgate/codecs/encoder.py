"""`make_stream_encoder`: one per-stream object from the engine's 24 kHz float PCM to wire units.

    enc = make_stream_encoder("opus", 48000)
    for pcm in engine_chunks:               # float32 mono 24 kHz, any length
        for packet in enc.encode(pcm):      # Packets: one Opus packet / PCM chunk / page each
            send(packet.data, packet.ms)    # ms: the playback time of the audio in it (0 for a header)
    for packet in enc.flush():              # the tail: resampler, partial frame, container end
        send(packet.data, packet.ms)

The stream is resampled first (pass-through at 24 kHz, and for Opus at any rate above it), then packed by
the encoding's packer. A packer returns each unit with the samples (at the stream's rate) it carries, so
the durations come from what is in the unit, not from its share of the bytes.
"""
from __future__ import annotations

import random
from typing import NamedTuple

import numpy as np

from talkgate.codecs import aac, g711, opus, pcm, sndfile
from talkgate.codecs.formaterror import FormatError
from talkgate.codecs.ogg import OggOpusWriter
from talkgate.codecs.resample import ENGINE_RATE, RATES, Resampler
from talkgate.codecs.wav import wav_header

# encoding -> (sample rates it takes, MIME type)
ENCODINGS = {
    "pcm_s16le": (RATES, "audio/pcm"),
    "pcm_f32le": (RATES, "audio/pcm"),
    "mulaw": ((8000,), "audio/basic"),
    "alaw": ((8000,), "audio/x-alaw-basic"),
    "opus": (opus.RATES, "audio/opus"),
    "ogg_opus": (opus.RATES, "audio/ogg"),
    "wav": (RATES, "audio/wav"),
    "mp3": (sndfile.MP3_RATES, "audio/mpeg"),
    "flac": (RATES, "audio/flac"),
    "aac": (aac.RATES, "audio/aac"),      # ADTS
}
# raw sample encodings: bytes per sample and float -> bytes
_RAW = {"pcm_s16le": (2, pcm.s16le_bytes), "pcm_f32le": (4, pcm.f32le_bytes),
        "mulaw": (1, g711.ulaw_bytes), "alaw": (1, g711.alaw_bytes)}


class Packet(NamedTuple):
    """One unit for the wire and the playback time of the audio it carries: 0 for a header (WAV, Ogg's
    OpusHead and OpusTags pages); an MP3/FLAC unit carries the samples handed in since the last unit."""
    data: bytes
    ms: float


def make_stream_encoder(encoding: str, sample_rate: int, *, frame_ms: int | None = None,
                        bitrate: int | None = None, streaming: bool = True) -> StreamEncoder:
    """A fresh encoder for one stream; raises FormatError (a ValueError) for what cannot be made.

    frame_ms: re-frame raw samples (pcm_s16le, pcm_f32le, mulaw, alaw) into units of this duration
        (whole samples, rounded down; the last unit may be shorter), e.g. 20 for Twilio's 160-byte
        mu-law frames.
    bitrate: bit/s, for opus / ogg_opus (default 48000), mp3 (default by rate, 64000 at 24 kHz) and aac
        (default 64000).
    streaming: False for a response sent whole (wav, mp3, flac): nothing comes out before `flush()`,
        which then returns one complete file with exact header fields. Other encodings ignore it:
        their streamed units concatenated are already the complete file.
    """
    if encoding not in ENCODINGS:
        raise FormatError(f"unknown encoding {encoding!r}; valid: {', '.join(ENCODINGS)}")
    rates, mime = ENCODINGS[encoding]
    if isinstance(sample_rate, bool) or sample_rate not in rates:
        valid = ", ".join(map(str, rates))
        valid = f"sample rate {valid} Hz only" if len(rates) == 1 else f"sample rates {valid} Hz"
        raise FormatError(f"{encoding} takes {valid}, not {sample_rate!r}")
    if frame_ms is not None and (encoding not in _RAW or isinstance(frame_ms, bool)
                                 or not isinstance(frame_ms, int) or not 1 <= frame_ms <= 1000):
        raise FormatError(f"frame_ms is 1..1000 and only for {', '.join(_RAW)}; got {frame_ms!r} for {encoding}")
    if bitrate is not None and (encoding not in ("opus", "ogg_opus", "mp3", "aac") or isinstance(bitrate, bool)
                                or not isinstance(bitrate, int)):
        raise FormatError(f"bitrate is an integer in bit/s and applies to opus, ogg_opus, mp3 and aac; "
                          f"got {bitrate!r} for {encoding}")

    packer_rate = sample_rate       # the rate the packer takes from the resampler (Opus: at most the engine's)
    if encoding in _RAW:
        width, to_bytes = _RAW[encoding]
        frame_bytes = width * (sample_rate * frame_ms // 1000) if frame_ms else None     # whole samples
        packer = RawPacker(width, to_bytes, frame_bytes)
    elif encoding == "wav":
        packer = WavPacker(sample_rate, streaming)
    elif encoding == "aac":
        packer = AacPacker(aac.AacEncoder(sample_rate, bitrate or aac.DEFAULT_BITRATE))
    elif encoding in ("opus", "ogg_opus"):
        # An Opus stream has no rate of its own: a decoder opened at 48 kHz plays one encoded from 24 kHz PCM
        # at 48 kHz. So a 48-kHz stream is encoded from the engine's 24-kHz PCM as it is (the same audio: it
        # has nothing above 12 kHz), without a resampler and its 48-kHz frames (15% less time a packet).
        packer_rate = min(sample_rate, ENGINE_RATE)
        packer = OpusPacker(opus.OpusEncoder(packer_rate, bitrate or opus.DEFAULT_BITRATE), encoding == "ogg_opus",
                            sample_rate)
    else:
        try:
            packer = SndfilePacker(sndfile.SndfileEncoder(encoding, sample_rate, streaming,
                                                          None if bitrate is None else bitrate // 1000))
        except ValueError as e:
            raise FormatError(str(e)) from e
    return StreamEncoder(encoding, sample_rate, mime, Resampler(packer_rate, ENGINE_RATE), packer)


class StreamEncoder:
    """Resampler + packer of one stream. Not thread-safe: one owner calls encode ... flush, once.

    A packer's encode(x) and flush() return its units as (bytes, the samples at `sample_rate` they carry).
    """

    def __init__(self, encoding: str, sample_rate: int, mime_type: str, resampler: Resampler, packer):
        self.encoding, self.sample_rate, self.mime_type = encoding, sample_rate, mime_type
        self._resampler, self._packer = resampler, packer
        self._flushed = False

    def encode(self, pcm_f32_24k: np.ndarray) -> list[Packet]:
        if self._flushed:
            raise RuntimeError(f"{self.encoding} stream already flushed")
        return self._packets(self._packer.encode(self._resampler.process(pcm_f32_24k)))

    def drain(self) -> list[Packet]:
        """At a pause in the audio (a flush whose audio is all made, more may follow): the resampler's
        held-back tail, and a fresh resampler for what follows. The packer keeps its state (an MP3 or AAC
        encoder's held-back block comes out with the audio after the pause, or at flush())."""
        if self._flushed:
            raise RuntimeError(f"{self.encoding} stream already flushed")
        tail = self._resampler.flush()
        self._resampler = Resampler(self._resampler.out_rate, self._resampler.in_rate)
        return self._packets(self._packer.encode(tail))

    def flush(self) -> list[Packet]:
        """The rest of the stream; the encoder is finished afterwards."""
        if self._flushed:
            raise RuntimeError(f"{self.encoding} stream already flushed")
        self._flushed = True
        return self._packets(self._packer.encode(self._resampler.flush()) + self._packer.flush())

    def _packets(self, units: list[tuple[bytes, int]]) -> list[Packet]:
        """A packer's (bytes, samples) units as Packets."""
        return [Packet(data, 1000.0 * samples / self.sample_rate) for data, samples in units]


class RawPacker:
    """Raw samples as bytes, one unit per chunk, or re-framed into `frame_bytes` units."""

    def __init__(self, width: int, to_bytes, frame_bytes: int | None):
        self._width, self._to_bytes, self._frame_bytes = width, to_bytes, frame_bytes
        self._pending = bytearray()

    def encode(self, x: np.ndarray) -> list[tuple[bytes, int]]:
        if not len(x):
            return []
        data = self._to_bytes(x)
        if self._frame_bytes is None:
            return self._out([data])
        self._pending += data
        n = len(self._pending) // self._frame_bytes * self._frame_bytes
        units = [bytes(self._pending[i:i + self._frame_bytes]) for i in range(0, n, self._frame_bytes)]
        del self._pending[:n]
        return self._out(units)

    def flush(self) -> list[tuple[bytes, int]]:
        units = [bytes(self._pending)] if self._pending else []
        self._pending.clear()
        return self._out(units)

    def _out(self, units: list[bytes]) -> list[tuple[bytes, int]]:
        return [(u, len(u) // self._width) for u in units]


class WavPacker:
    """PCM16 WAV: the streaming header (unknown length) then raw chunks, or one exact file at flush."""

    def __init__(self, sample_rate: int, streaming: bool):
        self._sample_rate, self._streaming = sample_rate, streaming
        self._header_sent = False
        self._chunks: list[bytes] = []     # whole-file mode only

    def encode(self, x: np.ndarray) -> list[tuple[bytes, int]]:
        data = pcm.s16le_bytes(x) if len(x) else b""
        if not self._streaming:
            self._chunks.append(data)
            return []
        units = [] if self._header_sent else [(wav_header(self._sample_rate), 0)]
        self._header_sent = True
        if data:
            units.append((data, len(x)))
        return units

    def flush(self) -> list[tuple[bytes, int]]:
        if self._streaming:
            return [] if self._header_sent else self.encode(np.zeros(0, np.float32))
        data = b"".join(self._chunks)
        self._chunks.clear()
        samples = len(data) // 2
        return [(wav_header(self._sample_rate, samples) + data, samples)]


class OpusPacker:
    """Raw 20 ms Opus packets, or Ogg pages (headers first, one page per encode call).

    Each packet is 20 ms at the stream's `sample_rate` (which may be above the encoder's input rate):
    the playback time of what was sent; a page carries that of the packets on it.
    """

    def __init__(self, encoder: opus.OpusEncoder, ogg: bool, sample_rate: int):
        self._enc = encoder
        self._ogg = (OggOpusWriter(encoder.sample_rate, encoder.lookahead, encoder.frame_size,
                                   serial=random.getrandbits(32), stream_rate=sample_rate) if ogg else None)
        self._headers_sent = False
        self._packet_samples = sample_rate * opus.FRAME_MS // 1000

    def encode(self, x: np.ndarray) -> list[tuple[bytes, int]]:
        packets = self._enc.encode(x)
        if self._ogg is None:
            return [(p, self._packet_samples) for p in packets]
        return self._pages(self._ogg.pages(packets))

    def flush(self) -> list[tuple[bytes, int]]:
        packets = self._enc.flush()
        if self._ogg is None:
            return [(p, self._packet_samples) for p in packets]
        return self._pages(self._ogg.last_pages(packets, self._enc.samples_in))

    def _pages(self, pages: list[tuple[bytes, int]]) -> list[tuple[bytes, int]]:
        """The headers first, then each (page, the Opus packets on it) as (page, its samples at the stream's rate)."""
        return self._headers() + [(page, packets * self._packet_samples) for page, packets in pages]

    def _headers(self) -> list[tuple[bytes, int]]:
        if self._headers_sent:
            return []
        self._headers_sent = True
        return [(page, 0) for page in self._ogg.headers()]     # OpusHead, OpusTags: no audio


class AacPacker:
    """ADTS frames of 1024 samples each."""

    def __init__(self, encoder: aac.AacEncoder):
        self._enc = encoder

    def encode(self, x: np.ndarray) -> list[tuple[bytes, int]]:
        return [(frame, aac.FRAME_SAMPLES) for frame in self._enc.encode(x)]

    def flush(self) -> list[tuple[bytes, int]]:
        return [(frame, aac.FRAME_SAMPLES) for frame in self._enc.flush()]


class SndfilePacker:
    """MP3 / FLAC bytes as libsndfile writes them (whole-file mode: all of it at flush).

    The bytes out lag the samples in by up to one codec block (576-1152 samples), and a call may give no
    bytes at all, so which samples a unit's bytes hold is not known: a unit carries the samples handed to
    the encoder since the last unit. Each unit is off by at most a block; the sum over the stream is exact.
    """

    def __init__(self, encoder: sndfile.SndfileEncoder):
        self._enc = encoder
        self._samples_unsent = 0      # handed to the encoder since the last unit

    def encode(self, x: np.ndarray) -> list[tuple[bytes, int]]:
        x = pcm.clean_f32(x)
        self._samples_unsent += len(x)
        return self._unit(self._enc.write(x))

    def flush(self) -> list[tuple[bytes, int]]:
        return self._unit(self._enc.close())

    def _unit(self, data: bytes) -> list[tuple[bytes, int]]:
        if not data:
            return []
        samples, self._samples_unsent = self._samples_unsent, 0
        return [(data, samples)]
