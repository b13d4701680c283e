"""File formats for the HTTP endpoint: WAV headers, MP3 and FLAC streamed and whole, read back."""
from __future__ import annotations

import io
import struct
import wave

import numpy as np
import pytest
import soundfile

from talkgate.codecs import Packet, make_stream_encoder, pcm
from talkgate.codecs.sndfile import MP3_RATES
from talkgate.codecs.wav import wav_header

N = 24000 + 4321


def speechlike(n: int, rate: int = 24000) -> np.ndarray:
    t = np.arange(n) / rate
    x = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((180, 360, 720, 1440, 2600), 1))
    return (0.3 * x * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def encode_all(encoding: str, x: np.ndarray, rate: int = 24000, streaming: bool = True, **kw):
    """-> (packets from encode calls, packets from flush); engine-sized 80 ms chunks."""
    enc = make_stream_encoder(encoding, rate, streaming=streaming, **kw)
    packets = [p for i in range(0, len(x), 1920) for p in enc.encode(x[i:i + 1920])]
    return packets, enc.flush()


def data(packets: list[Packet]) -> bytes:
    return b"".join(p.data for p in packets)


def total_ms(packets: list[Packet]) -> float:
    return sum(p.ms for p in packets)


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    return 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - got).astype(np.float64) ** 2))


# ----- WAV -----
def test_wav_header_with_known_length_parses():
    data = pcm.s16le_bytes(speechlike(1000))
    with wave.open(io.BytesIO(wav_header(16000, 1000) + data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 16000, 1000)
        assert w.readframes(1000) == data
    assert len(wav_header(16000, 1000)) == 44


def test_streaming_wav_header_says_unknown_and_reads_to_the_end():
    header = wav_header(24000)
    assert struct.unpack_from("<I", header, 4)[0] == struct.unpack_from("<I", header, 40)[0] == 0xFFFFFFFF
    x = speechlike(N)
    units, tail = encode_all("wav", x)
    assert units[0] == Packet(header, 0.0) and tail == []          # the header carries no audio
    assert [p.ms for p in units[1:]] == [len(p.data) / 2 / 24 for p in units[1:]]
    assert total_ms(units) == pytest.approx(1000 * N / 24000)
    y, sr = soundfile.read(io.BytesIO(data(units)), dtype="int16")
    assert sr == 24000
    np.testing.assert_array_equal(y, pcm.to_s16(x))
    with wave.open(io.BytesIO(data(units))) as w:
        assert w.readframes(10 * N) == pcm.s16le_bytes(x)


def test_whole_wav_has_exact_sizes():
    x = speechlike(N)
    units, tail = encode_all("wav", x, rate=16000, streaming=False)
    assert units == [] and len(tail) == 1
    n = round(N * 16000 / 24000)
    with wave.open(io.BytesIO(tail[0].data)) as w:
        assert (w.getframerate(), w.getnframes()) == (16000, n)
    assert struct.unpack_from("<I", tail[0].data, 4)[0] == 36 + 2 * n
    assert tail[0].ms == 1000 * n / 16000


# ----- MP3 -----
def _mp3_first_frame_bytes(data: bytes) -> int:
    """Length of the MPEG-2 layer III frame at the start (144 * bitrate / rate / 2 for MPEG-2)."""
    b1, b2 = data[1], data[2]
    assert data[0] == 0xFF and b1 & 0xE0 == 0xE0
    kbps = [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160][b2 >> 4]
    return 72000 * kbps // 24000 + ((b2 >> 1) & 1)


def test_mp3_streams_while_encoding_at_constant_bitrate():
    x = speechlike(2 * 24000)
    units, tail = encode_all("mp3", x)
    streamed = len(data(units))
    total = streamed + len(data(tail))
    assert streamed > 0.9 * total                  # bytes leave as audio arrives, not at the end
    assert abs(total * 8 / 2.0 - 64000) < 0.06 * 64000
    assert len(units) >= 20                        # most 80 ms chunks yield bytes
    # a unit carries the samples handed in since the last unit: the 80 ms chunks between them
    assert all(p.ms > 0 and p.ms % 80 == 0 for p in units)
    assert total_ms(units + tail) == pytest.approx(2000.0)


def test_mp3_streamed_equals_whole_file_except_the_info_frame():
    x = speechlike(N)
    streamed = data(sum(encode_all("mp3", x), []))
    whole = data(sum(encode_all("mp3", x, streaming=False), []))
    assert len(streamed) == len(whole)
    diff = np.nonzero(np.frombuffer(streamed, np.uint8) != np.frombuffer(whole, np.uint8))[0]
    assert 0 < len(diff) and diff.max() < _mp3_first_frame_bytes(whole)


def test_mp3_whole_file_decodes_gapless():
    x = speechlike(N)
    (units, tail) = encode_all("mp3", x, streaming=False)
    assert units == [] and len(tail) == 1 and tail[0].ms == 1000 * N / 24000
    y, sr = soundfile.read(io.BytesIO(tail[0].data), dtype="float32")
    assert sr == 24000 and len(y) == N             # the LAME info frame trims encoder delay and padding
    assert snr_db(x, y) > 15


def test_mp3_stream_decodes_to_the_same_audio_after_the_codec_delay():
    x = speechlike(N)
    y, sr = soundfile.read(io.BytesIO(data(sum(encode_all("mp3", x), []))), dtype="float32")
    corr = np.correlate(y[:6000], x[:4000], mode="valid")
    delay = int(np.argmax(corr))
    assert delay < 3000                            # encoder delay plus one silent info frame (~90 ms)
    assert snr_db(x[:N - 2000], y[delay:delay + N - 2000]) > 15


@pytest.mark.parametrize("rate", MP3_RATES)
def test_mp3_every_rate(rate):
    units, tail = encode_all("mp3", speechlike(4800), rate=rate)
    y, sr = soundfile.read(io.BytesIO(data(units + tail)), dtype="float32")
    assert sr == rate and len(y) >= 0.2 * rate
    assert total_ms(units + tail) == pytest.approx(1000 * (4800 * rate // 24000) / rate)


def test_mp3_bitrate_option():
    units, tail = encode_all("mp3", speechlike(2 * 24000), bitrate=32000)
    assert abs(len(data(units + tail)) * 8 / 2.0 - 32000) < 0.06 * 32000


# ----- FLAC -----
def test_flac_whole_file_is_lossless():
    x = speechlike(N)
    units, tail = encode_all("flac", x, streaming=False)
    assert units == [] and len(tail) == 1 and tail[0].ms == 1000 * N / 24000
    y, sr = soundfile.read(io.BytesIO(tail[0].data), dtype="int16")
    assert sr == 24000
    assert np.abs(y.astype(np.int32) - pcm.to_s16(x)).max() <= 1


def test_flac_streamed_differs_only_in_the_streaminfo_totals():
    x = speechlike(N)
    units, tail = encode_all("flac", x)
    streamed = data(units + tail)
    whole = data(sum(encode_all("flac", x, streaming=False), []))
    assert len(data(units)) > 0.8 * len(streamed)
    # the block held back to the end leaves at flush() with the samples handed in after the last unit
    assert all(p.ms > 0 for p in units) and total_ms(units + tail) == pytest.approx(1000 * N / 24000)
    assert len(streamed) == len(whole) and streamed[:4] == b"fLaC"
    diff = np.nonzero(np.frombuffer(streamed, np.uint8) != np.frombuffer(whole, np.uint8))[0]
    assert 8 <= diff.min() and diff.max() < 8 + 34            # inside the STREAMINFO block
    info = streamed[8:8 + 34]
    total_samples = int.from_bytes(info[13:18], "big") & ((1 << 36) - 1)
    assert total_samples == 0 and info[18:34] == bytes(16)     # "unknown" length and MD5, as FLAC allows
    whole_total = int.from_bytes(whole[8 + 13:8 + 18], "big") & ((1 << 36) - 1)
    assert whole_total == N
