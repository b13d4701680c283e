"""Opus packets through libopus and back; the Ogg/Opus container read back by libsndfile."""
from __future__ import annotations

import ctypes.util
import io
import struct
import subprocess
import sys

import numpy as np
import pytest
import soundfile

from talkgate.codecs import FormatError, OpusUnavailable, Packet, make_stream_encoder
from talkgate.codecs.ogg import OggOpusWriter, ogg_crc
from talkgate.codecs.opus import OpusDecoder, OpusEncoder


def tone_and_chirp(n: int, rate: int) -> np.ndarray:
    t = np.arange(n) / rate
    chirp = np.sin(2 * np.pi * (150 * t + 1500 * t * t))      # 150 Hz .. ~6 kHz over 2 s
    return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.3 * chirp).astype(np.float32)


def odd_chunks(x: np.ndarray, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    cuts = np.cumsum(rng.integers(0, 2500, size=len(x) // 500 + 2))
    return [c for c in np.split(x, cuts[cuts < len(x)])]


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    return 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - got).astype(np.float64) ** 2))


def ref_ogg_crc(data: bytes) -> int:
    """Bit-by-bit CRC-32 of RFC 3533: polynomial 0x04C11DB7, MSB first, init 0, no final xor."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc


def parse_pages(data: bytes) -> list[dict]:
    pages, pos = [], 0
    while pos < len(data):
        magic, version, flags, granule, serial, seq, crc, nseg = struct.unpack_from("<4sBBqIIIB", data, pos)
        assert magic == b"OggS" and version == 0
        lacing = data[pos + 27:pos + 27 + nseg]
        end = pos + 27 + nseg + sum(lacing)
        raw = bytearray(data[pos:end])
        raw[22:26] = b"\0\0\0\0"
        packets, cur = [], bytearray()
        body = data[pos + 27 + nseg:end]
        i = 0
        for v in lacing:
            cur += body[i:i + v]
            i += v
            if v < 255:
                packets.append(bytes(cur))
                cur = bytearray()
        pages.append(dict(flags=flags, granule=granule, serial=serial, seq=seq, crc=crc,
                          crc_ok=ref_ogg_crc(bytes(raw)) == crc, packets=packets))
        pos = end
    return pages


# ----- Opus -----
@pytest.mark.parametrize("rate", [24000, 48000])
def test_opus_round_trip(rate):
    n = 2 * rate + 777      # not a whole number of 20 ms frames
    x = tone_and_chirp(n, rate)
    enc = OpusEncoder(rate)
    packets = [p for c in odd_chunks(x) for p in enc.encode(c)] + enc.flush()
    frame = rate // 50
    assert len(packets) == -(-(n + enc.lookahead) // frame)
    dec = OpusDecoder(rate)
    decoded = [dec.decode(p) for p in packets]
    assert all(len(d) == frame for d in decoded)
    y = np.concatenate(decoded)[enc.lookahead:enc.lookahead + n]
    assert len(y) == n
    assert snr_db(x, y) > 20


def test_opus_packets_do_not_depend_on_chunking():
    x = tone_and_chirp(24000, 24000)
    a, b = OpusEncoder(24000), OpusEncoder(24000)
    pa = [p for c in odd_chunks(x, 1) for p in a.encode(c)] + a.flush()
    pb = b.encode(x) + b.flush()
    assert pa == pb


def test_opus_packet_count_on_frame_boundaries():
    enc = OpusEncoder(24000)
    assert enc.encode(np.zeros(479, np.float32)) == []
    assert len(enc.encode(np.zeros(1, np.float32))) == 1
    assert len(enc.encode(np.zeros(480 * 3, np.float32))) == 3
    # 4 whole frames of input: the tail packet carries the last `lookahead` samples out of the decoder
    assert len(enc.flush()) == 1 and enc.packets_out == 5


def test_opus_decodes_at_the_other_rate_too():
    enc = OpusEncoder(24000)
    packets = enc.encode(tone_and_chirp(2400, 24000))
    assert [len(OpusDecoder(48000).decode(p)) for p in packets] == [960] * 5


def test_opus_rejects_bad_settings():
    with pytest.raises(FormatError, match="8000, 12000, 16000, 24000, 48000"):
        OpusEncoder(44100)
    with pytest.raises(FormatError, match="bitrate"):
        OpusEncoder(24000, bitrate=100)


def test_missing_libopus_names_the_fix_and_pcm_still_works(monkeypatch):
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    for name in [m for m in sys.modules if m == "opuslib" or m.startswith("opuslib.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(OpusUnavailable, match=r"libopus not found: install it with `apt-get install libopus0`"):
        make_stream_encoder("opus", 48000)
    with pytest.raises(FormatError):
        make_stream_encoder("ogg_opus", 24000)
    assert make_stream_encoder("pcm_s16le", 24000).encode(np.zeros(240, np.float32)) == [Packet(bytes(480), 10.0)]


def test_importing_codecs_does_not_load_libopus():
    code = "import sys, talkgate.codecs; print('opuslib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ----- Ogg -----
def test_ogg_crc_matches_the_bitwise_definition():
    rng = np.random.default_rng(2)
    for n in (0, 1, 27, 1000, 4096):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert ogg_crc(data) == ref_ogg_crc(data)


def test_ogg_crc_matches_libogg_pages():
    """Pages written by libsndfile (libogg) carry checksums our function must reproduce."""
    buf = io.BytesIO()
    with soundfile.SoundFile(buf, "w", 48000, 1, "OPUS", format="OGG") as f:
        f.write(tone_and_chirp(48000, 48000))
    data, pos, checked = buf.getvalue(), 0, 0
    while pos < len(data):
        nseg = data[pos + 26]
        end = pos + 27 + nseg + sum(data[pos + 27:pos + 27 + nseg])
        page = bytearray(data[pos:end])
        want = struct.unpack_from("<I", page, 22)[0]
        page[22:26] = b"\0\0\0\0"
        assert ogg_crc(bytes(page)) == want
        pos, checked = end, checked + 1
    assert checked >= 3


@pytest.mark.parametrize("rate", [24000, 48000])
def test_ogg_opus_stream_decodes_with_the_right_length_and_audio(rate):
    n = 2 * 24000 + 333
    x = tone_and_chirp(n, 24000)
    enc = make_stream_encoder("ogg_opus", rate)
    units = [u for c in odd_chunks(x, 3) for u in enc.encode(c)] + enc.flush()
    y, sr = soundfile.read(io.BytesIO(b"".join(u.data for u in units)), dtype="float32")
    assert sr == rate
    assert len(y) == n * rate // 24000          # pre-skip and end trim applied by the reader
    ref = _resampled(x, rate)
    assert snr_db(ref, y) > 20


def _resampled(x: np.ndarray, rate: int) -> np.ndarray:
    """x at `rate`, resampled the way the stream encoders do it."""
    enc = make_stream_encoder("pcm_f32le", rate)
    return np.frombuffer(b"".join(p.data for p in enc.encode(x) + enc.flush()), dtype="<f4")


def test_ogg_opus_page_structure():
    n = 24000 + 100
    enc = make_stream_encoder("ogg_opus", 24000)
    first = enc.encode(np.zeros(10, np.float32))
    assert len(first) == 2        # the two header pages leave with the first call, before any audio
    units = first + [u for c in odd_chunks(tone_and_chirp(n - 10, 24000), 4) for u in enc.encode(c)] + enc.flush()
    pages = [p for u in units for p in parse_pages(u.data)]
    assert len(pages) == len(units)                          # every unit is whole pages
    # a header page carries no audio, an audio page the 20 ms of each packet on it
    assert [u.ms for u in units] == [0.0, 0.0] + [20.0 * len(p["packets"]) for p in pages[2:]]
    assert all(p["crc_ok"] for p in pages)
    assert [p["seq"] for p in pages] == list(range(len(pages)))
    assert len({p["serial"] for p in pages}) == 1
    assert pages[0]["flags"] == 0x02 and pages[-1]["flags"] == 0x04
    assert all(p["flags"] == 0 for p in pages[1:-1])
    head = pages[0]["packets"][0]
    magic, version, channels, pre_skip, input_rate, gain, family = struct.unpack("<8sBBHIhB", head)
    assert (magic, version, channels, input_rate, gain, family) == (b"OpusHead", 1, 1, 24000, 0, 0)
    assert pre_skip == 2 * OpusEncoder(24000).lookahead
    assert pages[1]["packets"][0].startswith(b"OpusTags") and pages[1]["granule"] == 0
    audio = pages[2:]
    granules = [p["granule"] for p in audio]
    assert granules == sorted(granules)
    n_packets = sum(len(p["packets"]) for p in audio)
    assert granules[:-1] == list(np.cumsum([960 * len(p["packets"]) for p in audio[:-1]]))
    assert granules[-1] == pre_skip + 2 * n <= 960 * n_packets
    dec = OpusDecoder(48000)
    assert all(len(dec.decode(pk)) == 960 for p in audio for pk in p["packets"])


def test_ogg_writer_splits_pages_at_255_segments():
    w = OggOpusWriter(48000, 312, 960, serial=7)
    w.headers()
    pages = w.pages([bytes(300)] * 200)       # 2 lacing values each: 127 packets fit on a page
    assert [len(parse_pages(p)[0]["packets"]) for p, _ in pages] == [n for _, n in pages] == [127, 73]
    assert parse_pages(pages[-1][0])[0]["granule"] == 200 * 960
    [(page, n)] = w.last_pages([], 200 * 960 - 500)
    last = parse_pages(page)[0]
    assert last["packets"] == [] and n == 0 and last["flags"] == 0x04 and last["granule"] == 312 + 200 * 960 - 500


def test_ogg_writer_counts_the_packets_of_the_last_pages():
    w = OggOpusWriter(48000, 312, 960, serial=7)
    pages = w.last_pages([bytes(300)] * 130, 130 * 960 - 500)
    assert [len(parse_pages(p)[0]["packets"]) for p, _ in pages] == [n for _, n in pages] == [127, 3]
    assert [parse_pages(p)[0]["flags"] for p, _ in pages] == [0, 0x04]


@pytest.mark.parametrize("encoding", ["opus", "ogg_opus"])
def test_a_48_khz_opus_stream_is_encoded_from_the_24_khz_pcm(encoding):
    n = 24000
    enc = make_stream_encoder(encoding, 48000)
    units = enc.encode(tone_and_chirp(n, 24000)) + enc.flush()
    pages = [] if encoding == "opus" else [p for u in units for p in parse_pages(u.data)]
    packets = [u.data for u in units] if encoding == "opus" else [pk for p in pages for pk in p["packets"]][2:]
    # 20 ms a packet at 48 kHz too (960 samples of the stream's rate from 480 of the encoder's)
    assert [u.ms for u in units] == ([20.0] * len(packets) if encoding == "opus"
                                     else [0.0, 0.0] + [20.0 * len(p["packets"]) for p in pages[2:]])
    # CELT's TOC: configurations 24-27 are super-wideband (what a 24-kHz input gives), 28-31 fullband
    assert {pk[0] >> 3 for pk in packets} <= set(range(24, 28))
    assert sum(u.ms for u in units) == 20 * len(packets)
    if encoding == "ogg_opus":
        head = pages[0]["packets"][0]
        pre_skip, input_rate = struct.unpack("<8sBBHIhB", head)[3:5]
        assert input_rate == 48000 and pre_skip == 2 * OpusEncoder(24000).lookahead
