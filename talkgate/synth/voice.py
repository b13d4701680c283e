"""Cloned voices: reference audio -> synth.api.VoicePrompt, once per voice (a voice store keeps the result).

    vp = make_voice_prompt(tts, audio, sample_rate)                  # x-vector only
    vp = make_voice_prompt(tts, audio, sample_rate, ref_text="...")  # in-context (ICL): + reference codes
    OpenContext(context, ContextParams(voice_prompt=vp))       # the engine command that speaks with it

Preprocessing as the reference's create_voice_clone_prompt: channels mixed to mono (the mean; `audio` is
[samples] or [samples, channels], as soundfile reads it), resampled to 24 kHz with soxr's HQ quality and
cut or zero-padded to ceil(N * 24000 / rate) samples (librosa.resample's default, which the reference
calls), no normalization. Integer PCM is scaled to [-1, 1] by its type's range (the reference leaves that to
its callers). The speaker encoder takes the whole clip (synth/speaker_encoder.py); with a reference text,
the speech tokenizer's encoder turns it into codes [ceil(N / 1920), 16] (synth/codec_encoder.py), which the
reference computes but drops in x-vector mode: skipped here.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from talkgate.synth.api import SAMPLE_RATE, InvalidParams, VoicePrompt

MIN_SECONDS = 1.0
MAX_SECONDS = 30.0


def to_mono_24k(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """float32 [N'] at 24 kHz from [N] or [N, channels] samples at sample_rate."""
    import soxr

    a = np.asarray(audio)
    if a.ndim not in (1, 2) or a.size == 0:
        raise InvalidParams(f"reference audio must be [samples] or [samples, channels], got shape {list(a.shape)}")
    if np.issubdtype(a.dtype, np.integer):
        info = np.iinfo(a.dtype)
        a = a.astype(np.float64) / max(-float(info.min), float(info.max))
    elif not np.issubdtype(a.dtype, np.floating):
        raise InvalidParams(f"reference audio must be numbers, got {a.dtype}")
    if a.ndim == 2:
        a = a.mean(axis=-1)
    a = a.astype(np.float32)
    if not np.isfinite(a).all():
        raise InvalidParams("reference audio has NaN or infinite samples")
    if not isinstance(sample_rate, (int, np.integer)) or not 1000 <= sample_rate <= 384000:
        raise InvalidParams(f"sample rate {sample_rate!r}: expected an integer from 1000 to 384000")
    if sample_rate == SAMPLE_RATE:
        return a
    n = math.ceil(len(a) * SAMPLE_RATE / sample_rate)
    out = soxr.resample(a, int(sample_rate), SAMPLE_RATE, quality="soxr_hq")
    return np.pad(out, (0, max(0, n - len(out))))[:n].astype(np.float32)


def make_voice_prompt(tts, audio: np.ndarray, sample_rate: int, ref_text: str | None = None) -> VoicePrompt:
    """A Base checkpoint's (synth.loader.LoadedTTS) cloned voice from 1-30 s of reference audio. With ref_text
    (the words spoken in the audio) an ICL voice, else x-vector only. InvalidParams for a model that cannot
    clone, bad audio, or a duration outside 1-30 s."""
    return finish(voice_prompt_steps(tts, audio, sample_rate, ref_text))


def finish(steps):
    """Run a generator of steps (voice_prompt_steps, Runner.priming) to its end -> what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


@contextlib.contextmanager
def cudnn_heuristics():
    """Within: cuDNN takes its heuristic algorithms instead of timing every one for each new input shape
    (the engine sets cudnn.benchmark for its fixed step shapes). Clips come in every length, and a search
    took 2.4-3.5 s for a voice's first clip on an H100 (1.7B Base); the engine thread alone runs in here.
    Also cudnn.deterministic: PyTorch keeps one plan per convolution, whichever mode ran it first, keyed by its
    parameters, `deterministic` among them; without it a shape met here would keep the heuristics' plan when
    the search runs later (the warm-up's first decode at the largest batch runs here, its graph's warm run
    with the search), and the heuristics put some of the decoder's convolutions on kernels many times slower
    (docs/benchmarks.md)."""
    import torch

    cudnn = torch.backends.cudnn
    search, deterministic = cudnn.benchmark, cudnn.deterministic
    cudnn.benchmark, cudnn.deterministic = False, True
    try:
        yield
    finally:
        cudnn.benchmark, cudnn.deterministic = search, deterministic


def voice_prompt_steps(tts, audio: np.ndarray, sample_rate: int, ref_text: str | None = None):
    """make_voice_prompt in steps, a generator returning the VoicePrompt: it yields between the speaker
    encoder and the codec encoder (the engine thread runs one step per step boundary, synth/engine.py)."""
    if tts.speaker_encoder is None or tts.codec_encoder is None:
        raise InvalidParams(f"voice cloning needs a Base checkpoint; this model is {tts.config.model_type}")
    wav = to_mono_24k(audio, sample_rate)
    seconds = len(wav) / SAMPLE_RATE
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise InvalidParams(f"reference audio is {seconds:.2f} s; it must be {MIN_SECONDS:g} to {MAX_SECONDS:g} s")
    import torch                # here: to_mono_24k serves gateway processes that never load torch

    text = ref_text.strip() if ref_text is not None else ""
    with torch.inference_mode(), cudnn_heuristics():
        embedding = tts.speaker_encoder.embed(wav).float().cpu().numpy()
    if not text:
        return VoicePrompt.from_arrays(embedding)
    yield
    with torch.inference_mode(), cudnn_heuristics():
        codes = tts.codec_encoder.encode(wav).numpy()
    return VoicePrompt.from_arrays(embedding, codes, ref_text)
