"""The engine's public surface: what sessions/ and gateway/ may import from synth.

Everything here is plain data (no tensors, no threads) so that callers and tests can build and
inspect it without a model. The engine itself lives in synth/engine.py: commands in (OpenContext,
AppendText, EndText, CancelContext through Engine.submit), events out (one deliver call per step).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Union

import numpy as np

SAMPLE_RATE = 24000          # Code2Wav output rate
FRAME_SAMPLES = 1920         # samples per codec frame (12.5 frames/s)
FRAME_MS = 80


class EngineError(Exception):
    """An error a client can be told about: `code` is stable, `message` is readable."""

    code = "engine_error"

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class InvalidParams(EngineError):
    code = "invalid_params"


class UnknownVoice(InvalidParams):
    code = "unknown_voice"


class UnknownLanguage(InvalidParams):
    code = "unknown_language"


class EngineFull(EngineError):
    """No free context slot (or KV memory): refuse cleanly, try again later."""

    code = "engine_full"


class EngineStopped(EngineError):
    code = "engine_stopped"


SEED_RANGE = "-2^63 to 2^64 - 1"


def seed_fits(seed: int) -> bool:
    """Sampling seeds are 64-bit integers, signed or unsigned (synth.sampling hashes their 64 bits)."""
    return -(1 << 63) <= seed < 1 << 64


@dataclass(frozen=True)
class SamplingParams:
    """Per-context sampling; None means the checkpoint's generation_config.json value."""

    greedy: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None


@dataclass(frozen=True)
class ContextParams:
    voice: str | None = None          # CustomVoice speaker name (case-insensitive); None: model default
    language: str = "auto"            # "auto" or a language name from ModelInfo.languages
    instructions: str | None = None   # VoiceDesign description / CustomVoice instruction
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Benchmarks with random weights (which never sample eos) fix the length: see
    # synth.engine.frames_for_text for the documented text-length rule.
    fixed_frames: int | None = None


@dataclass(frozen=True)
class ModelInfo:
    name: str                  # directory or Hugging Face id it was loaded from
    model_type: str            # tts_model_type: custom_voice | base | voice_design
    size: str                  # tts_model_size: 0b6 | 1b7 | (preset name for generated checkpoints)
    untrained: bool            # True for random-weight checkpoints: say so wherever model info is shown
    voices: tuple[str, ...]
    languages: tuple[str, ...]  # includes "auto"
    sample_rate: int = SAMPLE_RATE
    device: str = "cpu"
    dtype: str = "float32"

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["voices"], d["languages"] = list(self.voices), list(self.languages)
        if self.untrained:
            d["notice"] = "random untrained weights: the audio is noise, not speech"
        return d


@dataclass(frozen=True)
class AudioChunk:
    """PCM for frames [first_frame, first_frame + n_frames) of one context, mono float32 at 24 kHz."""

    context: int
    pcm: np.ndarray
    first_frame: int
    n_frames: int
    t_emitted: float          # time.perf_counter() when the engine handed it over


@dataclass(frozen=True)
class ContextDone:
    """The context ended by itself: reason is "eos", "length" (fixed_frames reached) or "budget"
    (runaway guard: frame budget for its text length). Last event of the context."""

    context: int
    reason: str
    frames: int


@dataclass(frozen=True)
class ContextFailed:
    """The engine could not continue this context (last event of the context)."""

    context: int
    code: str
    message: str


EngineEvent = Union[AudioChunk, ContextDone, ContextFailed]
# called by the engine once per step per client with that step's events of the client's contexts
Deliver = Callable[[list[EngineEvent]], None]


# ----- commands (client -> engine): `context` is chosen by the client, unique among its open contexts -----
@dataclass(frozen=True)
class OpenContext:
    """Start a context. Never refused by an exception: a bad voice, a full engine, ... come back as
    ContextFailed(context, code, message) with the codes of the EngineError classes above."""

    context: int
    params: ContextParams


@dataclass(frozen=True)
class AppendText:
    """Committed text token ids (synth.tokenizer.StreamingTokenizer.feed) and the text-length rule's
    seconds of the text they came from (synth.request.text_seconds)."""

    context: int
    ids: tuple[int, ...]
    seconds: float = 0.0


@dataclass(frozen=True)
class EndText:
    """The last ids (StreamingTokenizer.finish: the held-back tail) and seconds; no more text."""

    context: int
    ids: tuple[int, ...] = ()
    seconds: float = 0.0


@dataclass(frozen=True)
class CancelContext:
    """Stop now (idempotent): once submitted, no further event of the context reaches its client."""

    context: int


EngineCommand = Union[OpenContext, AppendText, EndText, CancelContext]

