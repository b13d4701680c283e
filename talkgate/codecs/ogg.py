"""Ogg/Opus container writer (RFC 7845 on RFC 3533 pages), streaming: pages leave as packets arrive.

Page 1: OpusHead (BOS). Page 2: OpusTags. Then one page per batch of audio packets handed in (the
session hands in the packets of one engine frame, so a page is ~80 ms of audio and ~30 bytes of
overhead). Granule positions count 48 kHz samples including the pre-skip; the last page has the
end-of-stream flag and a granule that trims the padding of the final packet (RFC 7845 section 4.4).
"""
from __future__ import annotations

import struct
import zlib

_REV8 = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))
GRANULE_RATE = 48000
VENDOR = b"talkgate"
MAX_SEGMENTS = 255


def ogg_crc(data: bytes) -> int:
    """Ogg's CRC-32: polynomial 0x04C11DB7, MSB first, initial value 0, no final xor.

    That is zlib's (bit-reflected) CRC-32 run over bit-reversed bytes, bit-reversed back, with
    zlib's initial and final inversion undone; zlib does the byte loop in C.
    """
    reflected = zlib.crc32(data.translate(_REV8), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{reflected:032b}"[::-1], 2)


def opus_head(pre_skip: int, input_rate: int, channels: int = 1) -> bytes:
    return struct.pack("<8sBBHIhB", b"OpusHead", 1, channels, pre_skip, input_rate, 0, 0)


def opus_tags() -> bytes:
    return struct.pack("<8sI", b"OpusTags", len(VENDOR)) + VENDOR + struct.pack("<I", 0)


class OggPager:
    """Numbers and checksums the pages of one logical stream."""

    BOS, EOS = 0x02, 0x04

    def __init__(self, serial: int):
        self.serial = serial
        self.seq = 0

    def page(self, packets: list[bytes], granule: int, flags: int = 0) -> bytes:
        lacing = bytearray()
        for p in packets:       # a packet of n bytes: n // 255 values of 255, then n % 255 (may be 0)
            lacing += b"\xff" * (len(p) // 255) + bytes((len(p) % 255,))
        if len(lacing) > MAX_SEGMENTS:
            raise ValueError(f"{len(lacing)} lacing values do not fit on one Ogg page")
        header = struct.pack("<4sBBqIIIB", b"OggS", 0, flags, granule, self.serial, self.seq, 0, len(lacing))
        page = bytearray(header + lacing + b"".join(packets))
        struct.pack_into("<I", page, 22, ogg_crc(bytes(page)))
        self.seq += 1
        return bytes(page)


class OggOpusWriter:
    """Opus packets of a fixed duration -> Ogg pages.

    `pre_skip` and `packet_samples` are in samples at `input_rate` (the encoder's rate); the
    container counts them at 48 kHz. `stream_rate` (default input_rate) is the rate OpusHead names as the
    original's, which players such as libsndfile decode at: the stream's rate where it is above the encoder's.
    """

    def __init__(self, input_rate: int, pre_skip: int, packet_samples: int, serial: int,
                 stream_rate: int | None = None):
        if GRANULE_RATE % input_rate:
            raise ValueError(f"Ogg/Opus needs an input rate that divides 48000, not {input_rate}")
        self._scale = GRANULE_RATE // input_rate
        self._pager = OggPager(serial)
        self.stream_rate = stream_rate or input_rate
        self.pre_skip = pre_skip * self._scale
        self.packet_granules = packet_samples * self._scale
        self.granule = 0

    def headers(self) -> list[bytes]:
        return [self._pager.page([opus_head(self.pre_skip, self.stream_rate)], 0, OggPager.BOS),
                self._pager.page([opus_tags()], 0)]

    def pages(self, packets: list[bytes]) -> list[tuple[bytes, int]]:
        """Audio pages for `packets`, each with the number of packets on it; no page for no packets."""
        out = []
        for batch in self._batches(packets):
            self.granule += len(batch) * self.packet_granules
            out.append((self._pager.page(batch, self.granule), len(batch)))
        return out

    def last_pages(self, packets: list[bytes], samples_in: int) -> list[tuple[bytes, int]]:
        """The final pages with their packet counts, as `pages`; the last one is flagged end-of-stream
        (with no packet if `packets` is empty).

        `samples_in` counts the real input samples (at input_rate): the last granule stops there,
        so a decoder drops the silence that padded the final packet.
        """
        batches = self._batches(packets) or [[]]
        out = self.pages([p for batch in batches[:-1] for p in batch])
        self.granule += len(batches[-1]) * self.packet_granules
        end = self.pre_skip + samples_in * self._scale
        if end > self.granule:
            raise ValueError(f"end granule {end} is past the {self.granule} samples the packets decode to")
        out.append((self._pager.page(batches[-1], end, OggPager.EOS), len(batches[-1])))
        return out

    @staticmethod
    def _batches(packets: list[bytes]) -> list[list[bytes]]:
        batches, batch, segments = [], [], 0
        for p in packets:
            n = len(p) // 255 + 1
            if batch and segments + n > MAX_SEGMENTS:
                batches.append(batch)
                batch, segments = [], 0
            batch.append(p)
            segments += n
        if batch:
            batches.append(batch)
        return batches
