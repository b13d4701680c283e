"""Reference audio for voice cloning as clients send it: a file's bytes -> mono float32 samples at 24 kHz.

Read with libsndfile (the soundfile wheel's; MP3 since 1.1.0): WAV (PCM, float, mu-law, A-law), FLAC, Ogg
Vorbis, Ogg Opus, MP3, AIFF, CAF. Containers it cannot read (MP4/M4A/AAC, WebM/Matroska, AMR) are named in
the error, so that a client knows to convert rather than wonder whether it sent audio at all. Channels are
mixed to mono and the rate converted with soxr as the reference does (synth.voice.to_mono_24k); the clip
must be 1-30 s and not silent.

Bounded whatever the file claims: at most MAX_SOURCE_SECONDS of it are decoded, a block at a time, mixed to
mono as they come (a 10 MB MP3 can hold hours of audio; 30 s of 8 channels at 192 kHz would be 184 MB).
Pure: bytes in, samples out; the gateway runs it on a worker thread.
"""
from __future__ import annotations

import base64
import binascii
import io
import re
from dataclasses import dataclass

import numpy as np

from talkgate.sessions.fields import SessionError

MAX_BYTES = 10 * 1024 * 1024        # an uploaded file (OpenAI's and vLLM-Omni's limit)
MIN_SECONDS, MAX_SECONDS = 1.0, 30.0
MAX_SOURCE_SECONDS = MAX_SECONDS + 0.5     # decoded at most: past it the clip is too long anyway
MAX_CHANNELS = 32
SILENT_PEAK = 10 ** (-60 / 20)     # a clip whose loudest sample is under -60 dBFS holds no voice
BLOCK_FRAMES = 1 << 16
# what libsndfile reads, by its format name; and the magic of what it cannot
READABLE = ("WAV", "WAVEX", "FLAC", "OGG", "MP3", "AIFF", "CAF", "W64", "RF64")
UNREADABLE = ((re.compile(rb"\A....ftyp", re.S), "MP4/M4A (AAC)"), (re.compile(rb"\A\x1a\x45\xdf\xa3"), "WebM/Matroska"),
              (re.compile(rb"\A\xff[\xf0-\xff]", re.S), "AAC (ADTS)"), (re.compile(rb"\A#!AMR"), "AMR"),
              (re.compile(rb"\AADIF"), "AAC (ADIF)"))
SUPPORTED = "WAV, FLAC, Ogg (Vorbis or Opus) or MP3"
MAX_REF_TEXT_CHARS = 2000           # the words of a reference clip (the engine also bounds its tokens: 1024)
_DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,", re.A)


@dataclass(frozen=True)
class Clip:
    samples: np.ndarray     # float32 [N] mono at 24 kHz
    seconds: float
    format: str             # libsndfile's name of the container ("WAV", "MP3", ...) and its subtype
    sample_rate: int        # the file's
    channels: int

    def describe(self) -> dict:
        return {"format": self.format, "seconds": round(self.seconds, 3), "sample_rate": self.sample_rate,
                "channels": self.channels}


class AudioError(SessionError):
    """Reference audio refused; `status` is the HTTP status that answers it."""

    STATUS = {"audio_too_large": 413, "unsupported_audio_format": 415}

    @property
    def status(self) -> int:
        return self.STATUS.get(self.code, 400)


def _unreadable(data: bytes) -> str | None:
    head = data[:16]
    if len(head) > 1 and head[0] == 0xFF and head[1] & 0xE6 > 0xE0:   # an MPEG audio frame (layer I-III): not AAC
        return None
    return next((name for magic, name in UNREADABLE if magic.match(head)), None)


def read_clip(data: bytes, what: str = "the reference audio") -> Clip:
    """A file's bytes -> Clip; raises AudioError (invalid_audio, unsupported_audio_format, audio_too_large,
    audio_too_short, audio_too_long, audio_silent) with a message that names `what`."""
    import soundfile

    from talkgate.synth.api import InvalidParams
    from talkgate.synth.voice import to_mono_24k

    if len(data) > MAX_BYTES:
        raise AudioError("audio_too_large", f"{what} is {len(data)} bytes; at most {MAX_BYTES} ({MAX_BYTES >> 20} MB)")
    if not data:
        raise AudioError("invalid_audio", f"{what} is empty")
    try:
        f = soundfile.SoundFile(io.BytesIO(data))
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as e:
        other = _unreadable(data)
        if other is not None:
            raise AudioError("unsupported_audio_format", f"{what} is {other}, which talkgate cannot read: send "
                             f"{SUPPORTED}") from None
        raise AudioError("invalid_audio", f"{what} is not audio talkgate can read ({SUPPORTED}): "
                         f"{getattr(e, 'error_string', None) or e}") from None
    with f:
        kind = f"{f.format} {f.subtype}".strip()
        if f.format not in READABLE:
            raise AudioError("unsupported_audio_format", f"{what} is {kind}: send {SUPPORTED}")
        rate, channels = f.samplerate, f.channels
        if not 1 <= channels <= MAX_CHANNELS or not 1000 <= rate <= 384000:
            raise AudioError("invalid_audio", f"{what} has {channels} channels at {rate} Hz: expected 1 to "
                             f"{MAX_CHANNELS} channels at 1000 to 384000 Hz")
        limit = int(MAX_SOURCE_SECONDS * rate)
        blocks, n = [], 0
        try:
            while n <= limit:
                block = f.read(min(BLOCK_FRAMES, limit + 1 - n), dtype="float32", always_2d=True)
                if not len(block):
                    break
                blocks.append(block.mean(axis=1) if channels > 1 else block[:, 0])
                n += len(block)
        except (soundfile.LibsndfileError, RuntimeError) as e:
            raise AudioError("invalid_audio", f"{what} cannot be decoded ({kind}): {e}") from None
    if n > limit:
        raise AudioError("audio_too_long", f"{what} is over {MAX_SECONDS:g} s; it must be {MIN_SECONDS:g} to "
                         f"{MAX_SECONDS:g} s")
    seconds = n / rate
    if seconds < MIN_SECONDS:
        raise AudioError("audio_too_short", f"{what} is {seconds:.2f} s; it must be {MIN_SECONDS:g} to "
                         f"{MAX_SECONDS:g} s")
    try:
        samples = to_mono_24k(np.concatenate(blocks), rate)
    except InvalidParams as e:                      # NaN or infinite samples in a float file
        raise AudioError("invalid_audio", f"{what}: {e}") from None
    clip = Clip(samples, len(samples) / 24000, kind, rate, channels)
    check(clip, what)
    return clip


def check(clip: Clip, what: str = "the reference audio") -> None:
    """AudioError unless the clip's length is MIN_SECONDS..MAX_SECONDS and it is not silent."""
    if not MIN_SECONDS <= clip.seconds <= MAX_SECONDS:
        code = "audio_too_short" if clip.seconds < MIN_SECONDS else "audio_too_long"
        raise AudioError(code, f"{what} is {clip.seconds:.2f} s; it must be {MIN_SECONDS:g} to {MAX_SECONDS:g} s")
    peak = float(np.abs(clip.samples).max()) if clip.samples.size else 0.0
    if peak < SILENT_PEAK:
        raise AudioError("audio_silent", f"{what} is silent (its loudest sample is "
                         f"{20 * np.log10(max(peak, 1e-12)):.0f} dBFS): record the voice to clone")


def join(clips: list[Clip], what: str = "the reference audio") -> Clip:
    """Several clips of one voice (ElevenLabs' `files`) as one, in order: together 1-30 s."""
    if len(clips) == 1:
        return clips[0]
    samples = np.concatenate([c.samples for c in clips])
    clip = Clip(samples, len(samples) / 24000, "+".join(dict.fromkeys(c.format for c in clips)),
                max(c.sample_rate for c in clips), max(c.channels for c in clips))
    check(clip, what + " (all files together)")
    return clip


def decode_inline(value: object, max_bytes: int, what: str = "ref_audio") -> bytes:
    """Inline reference audio as a JSON field carries it: a data URL (`data:audio/wav;base64,...`) or plain
    base64 -> the file's bytes; SessionError for anything else (http URLs are not fetched)."""
    if not isinstance(value, str) or not value:
        raise SessionError("invalid_params", f"{what} must be a data URL (data:audio/wav;base64,...) or base64 text")
    text = value
    m = _DATA_URL.match(text)
    if m is not None:
        if not m.group("b64"):
            raise SessionError("invalid_params", f"{what}: a data URL must be base64 (data:audio/...;base64,...)")
        text = text[m.end():]
    elif re.match(r"[a-z][a-z0-9+.-]*://", text, re.I):
        raise SessionError("invalid_params", f"{what}: URLs are not fetched; send the audio as a data URL or "
                           "base64, or store the voice (POST /v1/audio/voices) and use its id")
    if len(text) > 4 * (max_bytes // 3 + 2):
        raise AudioError("audio_too_large", f"{what} is over {max_bytes} bytes")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise SessionError("invalid_params", f"{what} is not valid base64") from None
    if len(data) > max_bytes:
        raise AudioError("audio_too_large", f"{what} is {len(data)} bytes; at most {max_bytes}")
    return data


def check_ref_text(text: object, what: str = "ref_text") -> str | None:
    """The words spoken in a reference clip (ICL), trimmed, or None for none; SessionError unless a string of
    at most MAX_REF_TEXT_CHARS characters."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise SessionError("invalid_params", f"{what} must be a string")
    text = text.strip()
    if len(text) > MAX_REF_TEXT_CHARS:
        raise SessionError("reference_text_too_long", f"{what} is {len(text)} characters; at most "
                           f"{MAX_REF_TEXT_CHARS} (the words spoken in up to 30 s of audio)")
    return text or None
