"""make_stream_encoder: validation, packets and their durations per encoding, and the encode cost per frame."""
from __future__ import annotations

import time

import numpy as np
import pytest

from talkgate.codecs import ENCODINGS, FormatError, Packet, make_stream_encoder, pcm

FRAME = 1920        # one engine frame: 80 ms at 24 kHz


def signal(n: int) -> np.ndarray:
    t = np.arange(n) / 24000
    return (0.3 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 1700 * t)).astype(np.float32)


def run(enc, x: np.ndarray, sizes=(FRAME,)) -> list[Packet]:
    packets, i, k = [], 0, 0
    while i < len(x):
        n = sizes[k % len(sizes)]
        packets += enc.encode(x[i:i + n])
        i, k = i + n, k + 1
    return packets + enc.flush()


def data(packets: list[Packet]) -> bytes:
    return b"".join(p.data for p in packets)


def sizes(packets: list[Packet]) -> list[int]:
    return [len(p.data) for p in packets]


@pytest.mark.parametrize("encoding, rate, message", [
    ("speex", 24000, "unknown encoding 'speex'; valid: pcm_s16le, pcm_f32le, mulaw, alaw, opus, ogg_opus"),
    ("mulaw", 16000, "mulaw takes sample rate 8000 Hz only, not 16000"),
    ("alaw", 24000, "alaw takes sample rate 8000 Hz only, not 24000"),
    ("opus", 44100, "opus takes sample rates 8000, 12000, 16000, 24000, 48000 Hz, not 44100"),
    ("ogg_opus", 22050, "ogg_opus takes sample rates 8000, 12000, 16000, 24000, 48000 Hz"),
    ("pcm_s16le", 12345, "pcm_s16le takes sample rates 8000, 16000, 22050, 24000, 32000, 44100, 48000 Hz, not 12345"),
    ("pcm_f32le", "24000", "not '24000'"),
    ("wav", True, "not True"),
    ("mp3", 12000, "mp3 takes sample rates 8000, 16000"),
])
def test_invalid_formats_raise_format_error_listing_what_is_valid(encoding, rate, message):
    with pytest.raises(FormatError) as e:
        make_stream_encoder(encoding, rate)
    assert message in str(e.value)
    assert isinstance(e.value, ValueError)


def test_invalid_options_raise_format_error():
    with pytest.raises(FormatError, match="frame_ms is 1..1000 and only for pcm_s16le, pcm_f32le, mulaw, alaw"):
        make_stream_encoder("opus", 48000, frame_ms=20)
    with pytest.raises(FormatError, match="frame_ms"):
        make_stream_encoder("mulaw", 8000, frame_ms=0)
    with pytest.raises(FormatError, match="bitrate is an integer in bit/s and applies to opus, ogg_opus, mp3 and aac"):
        make_stream_encoder("flac", 24000, bitrate=64000)
    with pytest.raises(FormatError, match="got 64.5 for mp3"):
        make_stream_encoder("mp3", 24000, bitrate=64.5)
    with pytest.raises(FormatError, match="MP3 at 24000 Hz takes 8..160 kbit/s, not 0"):
        make_stream_encoder("mp3", 24000, bitrate=500)
    with pytest.raises(FormatError, match="MP3 at 24000 Hz takes 8..160 kbit/s, not 320"):
        make_stream_encoder("mp3", 24000, bitrate=320000)


@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_every_encoding_streams_and_accounts_for_its_audio(encoding):
    rate = {"mulaw": 8000, "alaw": 8000}.get(encoding, 48000)
    enc = make_stream_encoder(encoding, rate)
    assert (enc.encoding, enc.sample_rate) == (encoding, rate) and enc.mime_type.startswith("audio/")
    x = signal(24000)
    packets = run(enc, x, sizes=(FRAME, 3 * FRAME, 701))
    assert packets and all(isinstance(p, Packet) and isinstance(p.data, bytes) and p.data for p in packets)
    # 1 s of input: the audio accounted for is 1 s, plus at most one padded 20 ms Opus packet; AAC adds
    # the encoder's 1024 priming samples and pads its last 1024-sample frame
    slack = 2 * 1024 * 1000 / rate if encoding == "aac" else 20.0
    samples = sum(p.ms for p in packets) * rate / 1000
    assert samples == pytest.approx(round(samples), abs=1e-6)       # whole samples at the stream's rate
    assert 1000.0 <= 1000.0 * round(samples) / rate <= 1000.0 + slack
    with pytest.raises(RuntimeError, match="already flushed"):
        enc.encode(x)


@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize("encoding", ["pcm_s16le", "mulaw", "wav", "mp3", "flac"])
def test_packets_carry_the_samples_handed_in_so_far_wherever_packets_come_out(encoding, streaming):
    """MP3 and FLAC too, whose bytes lag the samples by up to a codec block. The samples handed in are
    counted by a pcm_f32le stream at the same rate fed the same calls. (Opus and AAC packets carry fixed
    frames: see the tests of each.)"""
    rate = 8000 if encoding == "mulaw" else 22050
    enc, counter = make_stream_encoder(encoding, rate, streaming=streaming), make_stream_encoder("pcm_f32le", rate)
    calls = [lambda e, c=c: e.encode(c) for c in np.split(signal(24000), [FRAME, FRAME + 701, 3 * FRAME, 9000])]
    calls[3:3] = [lambda e: e.drain()]      # a pause mid-stream
    total, handed_in, came_out = 0.0, 0, 0
    for call in calls + [lambda e: e.flush()]:
        packets = call(enc)
        handed_in += len(data(call(counter))) // 4
        assert all(p.ms >= 0 for p in packets)
        total += sum(p.ms for p in packets)
        if packets:
            came_out += 1
            assert total == pytest.approx(1000 * handed_in / rate, abs=1e-9)
    whole_file = not streaming and encoding in ("wav", "mp3", "flac")
    assert came_out == 1 if whole_file else came_out >= 3
    assert handed_in == pytest.approx(rate, abs=2)


@pytest.mark.parametrize("rate", [8000, 44100])
def test_each_aac_frame_is_1024_samples(rate):
    packets = run(make_stream_encoder("aac", rate), signal(24000))
    assert all(p.data[:2] == b"\xff\xf1" for p in packets)          # one ADTS frame each
    assert [p.ms for p in packets] == [1000 * 1024 / rate] * len(packets)


@pytest.mark.parametrize("encoding", ["wav", "mp3", "flac"])
def test_whole_file_mode_sends_nothing_before_flush(encoding):
    enc = make_stream_encoder(encoding, 24000, streaming=False)
    assert [p for i in range(0, 24000, FRAME) for p in enc.encode(signal(24000)[i:i + FRAME])] == []
    packets = enc.flush()
    assert len(packets) == 1 and packets[0].ms == 1000.0      # the one file carries all of the audio


@pytest.mark.parametrize("encoding, rate, width", [("pcm_s16le", 16000, 2), ("pcm_f32le", 44100, 4),
                                                   ("mulaw", 8000, 1), ("alaw", 8000, 1)])
def test_raw_units_and_duration_follow_the_samples(encoding, rate, width):
    enc = make_stream_encoder(encoding, rate)
    packets = enc.encode(signal(FRAME)) + enc.flush()
    assert sum(sizes(packets)) == width * FRAME * rate // 24000
    assert [p.ms for p in packets] == [1000.0 * len(p.data) / width / rate for p in packets]
    assert sum(p.ms for p in packets) == pytest.approx(80.0)


def test_24k_pcm_is_one_unit_per_chunk_with_no_delay():
    enc = make_stream_encoder("pcm_s16le", 24000)
    assert enc.encode(signal(FRAME)) == [Packet(pcm.s16le_bytes(signal(FRAME)), 80.0)]
    assert enc.encode(np.zeros(0, np.float32)) == [] and enc.flush() == []


def test_twilio_framing_gives_160_byte_mulaw_units():
    enc = make_stream_encoder("mulaw", 8000, frame_ms=20)
    packets = run(enc, signal(24000 + 300), sizes=(FRAME, 2 * FRAME, 333))
    assert all(len(p.data) == 160 and p.ms == 20.0 for p in packets[:-1]) and 0 < len(packets[-1].data) <= 160
    assert packets[-1].ms == len(packets[-1].data) / 8
    assert sum(sizes(packets)) == 8100 and sum(p.ms for p in packets) == pytest.approx(8100 / 8)
    whole = make_stream_encoder("mulaw", 8000)
    assert data(packets) == data(run(whole, signal(24000 + 300)))


def test_framing_cuts_whole_samples():
    """3 ms at 44.1 kHz is 132.3 samples: 132 of them (528 bytes of f32), never a unit that splits a sample."""
    enc = make_stream_encoder("pcm_f32le", 44100, frame_ms=3)
    packets = run(enc, signal(2400), sizes=(700,))
    assert all(len(p.data) == 528 and p.ms == 1000 * 132 / 44100 for p in packets[:-1])
    assert len(packets[-1].data) % 4 == 0
    assert sum(sizes(packets)) == 4 * 4410 and sum(p.ms for p in packets) == pytest.approx(100.0)


@pytest.mark.parametrize("encoding, rate", [("pcm_s16le", 22050), ("alaw", 8000), ("opus", 48000),
                                            ("wav", 44100), ("mp3", 24000), ("flac", 32000)])
def test_output_does_not_depend_on_chunking(encoding, rate):
    """(Ogg is left out: it puts the packets of one encode call on one page, by design.)"""
    x = signal(24000 + 77)
    a = run(make_stream_encoder(encoding, rate), x, sizes=(FRAME,))
    b = run(make_stream_encoder(encoding, rate), x, sizes=(1, 4000, 333, 0, FRAME * 3))
    assert data(a) == data(b)
    assert sum(p.ms for p in a) == pytest.approx(sum(p.ms for p in b), abs=1e-9)


def test_encode_cost_per_80ms_frame(capsys):
    """Not a timed assert: prints what one engine frame costs to encode per format on this CPU."""
    x = signal(FRAME * 50)
    rows = []
    for encoding, rate in [("pcm_s16le", 24000), ("pcm_s16le", 48000), ("pcm_s16le", 16000), ("pcm_f32le", 24000),
                           ("mulaw", 8000), ("alaw", 8000), ("opus", 24000), ("opus", 48000), ("ogg_opus", 24000),
                           ("wav", 24000), ("mp3", 24000), ("flac", 24000)]:
        enc = make_stream_encoder(encoding, rate)
        enc.encode(x[:FRAME])        # first call: lazy set-up (libopus load, LAME init)
        t0 = time.perf_counter()
        n = sum(len(p.data) for i in range(FRAME, len(x), FRAME) for p in enc.encode(x[i:i + FRAME]))
        us = (time.perf_counter() - t0) / 49 * 1e6
        assert n > 0
        rows.append(f"  {encoding:>9} @ {rate:>5} Hz: {us:7.1f} us/frame  "
                    f"-> {80_000 / us:7.0f} real-time streams per core")
    with capsys.disabled():
        print("\nencode cost per 80 ms engine frame (1920 samples at 24 kHz):\n" + "\n".join(rows))
