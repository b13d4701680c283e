"""What the voice tests share: the key of the `base_server` fixture, reference clips as files, uploads."""
from __future__ import annotations

import io

import aiohttp
import numpy as np
import soundfile

KEY = "voices-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def voiced(seed: int, seconds: float, rate: int = 24000) -> np.ndarray:
    """A deterministic voiced signal: harmonics of a wandering pitch, syllable-like envelope, some noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 110 + 90 * rng.random() + 15 * np.sin(2 * np.pi * (0.5 + rng.random()) * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = sum(rng.random() / k * np.sin(k * phase + rng.random() * 6) for k in range(1, 9))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * (3 + 2 * rng.random()) * t) ** 2
    return (0.25 * x * envelope + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


def audio_file(seconds: float = 2.0, seed: int = 1, rate: int = 24000, fmt: str = "WAV", subtype: str = "PCM_16",
               channels: int = 1) -> bytes:
    audio = voiced(seed, seconds, rate)
    if channels == 2:
        audio = np.stack([audio, voiced(seed + 100, seconds, rate)], axis=1)
    b = io.BytesIO()
    soundfile.write(b, audio, rate, format=fmt, subtype=subtype)
    return b.getvalue()


def voice_form(name: str | None, audio: bytes | None, filename: str = "ref.wav", file_field: str = "audio_sample",
               consent: str | None = "recorded with consent", **fields) -> aiohttp.FormData:
    form = aiohttp.FormData()
    if name is not None:
        form.add_field("name", name)
    if consent is not None:
        form.add_field("consent", consent)
    for k, v in fields.items():
        form.add_field(k, v)
    if audio is not None:
        form.add_field(file_field, audio, filename=filename, content_type="application/octet-stream")
    return form


async def upload(http: aiohttp.ClientSession, url: str, name: str | None, audio: bytes | None, **kw) -> tuple[int, dict]:
    """POST /v1/audio/voices -> (status, JSON body)."""
    headers = kw.pop("headers", AUTH)
    async with http.post(f"{url}/v1/audio/voices", data=voice_form(name, audio, **kw), headers=headers) as r:
        return r.status, await r.json()
