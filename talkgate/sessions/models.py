"""The models one server serves (`talkgate serve --model A --model B ...`) and which of them a request is for.

Pure: `Models` holds each model's name and ModelInfo, in the order given (the first is the default), and
answers the one routing question every protocol asks, `route`:
  1. a model the request names: a configured model's name (case-insensitive), or a vendor's model name that
     clients send today (OpenAI's tts-1, ElevenLabs' eleven_*, Cartesia's sonic*, DashScope's qwen*-realtime*, ...: VENDOR_MODELS), which
     stays an alias of the default model; any other name is unknown_model (the protocol's own error);
  2. else the voice: a voice of a model (a CustomVoice speaker) -> the first model that has it, the default
     first; a stored cloned voice or reference audio -> the first Base model; instructions alone (no voice)
     -> the first VoiceDesign model;
  3. else the default.
A server of one model routes everything to it, as before there were several.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import PurePath

from talkgate.sessions.fields import SessionError, show
from talkgate.synth.api import ModelInfo

# the model names the vendors' clients send (their defaults and documented ids): aliases of the default model
# (Qwen's own: qwen3-tts, qwen3-tts-flash, qwen-tts-realtime, a Hugging Face id such as Qwen/Qwen3-TTS-12Hz-1.7B-Base)
VENDOR_MODELS = re.compile(r"(tts(-1(-hd)?)?|gpt-4o(-mini)?-tts(-[\w-]+)?|eleven_[\w]+|sonic[\w.-]*|aura[\w-]*"
                           r"|(qwen/)?qwen[\w.-]*-tts[\w.-]*|qwen[\w.-]*-realtime[\w.-]*|talkgate)\Z", re.IGNORECASE)
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


def model_name(checkpoint: str) -> str:
    """The name a model is served under when none is given: its directory's (or Hugging Face id's) last part."""
    return PurePath(checkpoint.rstrip("/")).name


@dataclass(frozen=True)
class Model:
    name: str
    info: ModelInfo


class Models:
    def __init__(self, models: list[Model]):
        if not models:
            raise ValueError("no model")
        self.all = tuple(models)
        self.default = models[0]
        self._by_name = {m.name.lower(): m for m in models}
        self._voices = tuple(dict.fromkeys(v for m in models for v in m.info.voices))
        # what a request that names no model maps its voice against (info_for): made once, not per request
        self._any_info = replace(self.default.info, voices=self._voices)

    def __len__(self) -> int:
        return len(self.all)

    def named(self, name: str, context_id: str | None = None) -> Model:
        """A configured model by name, or the default for a vendor's model name; SessionError unknown_model."""
        # a Hugging Face id names the served model of its last part (`--model ORG/NAME` serves it as NAME)
        found = self._by_name.get(name.lower()) or self._by_name.get(model_name(name).lower())
        if found is not None:
            return found
        if VENDOR_MODELS.match(name):
            return self.default
        raise SessionError("unknown_model", f"unknown model {show(name)}; available: "
                           f"{', '.join(m.name for m in self.all)}", context_id)

    def route(self, name: str | None = None, voice: str | None = None, stored: bool = False,
              instructions: bool = False, context_id: str | None = None) -> Model:
        """The model a request is for (the module's rules). `voice`: the voice asked for, `stored`: it is a stored
        (cloned) voice or the request brings reference audio; `instructions`: the request has instructions."""
        if name:
            return self.named(name, context_id)
        if stored:
            return self.first("base")
        if voice:
            lowered = voice.lower()
            return next((m for m in self.all if lowered in m.info.voices), self.default)
        if instructions:
            return self.first("voice_design")
        return self.default

    def info_for(self, name: str | None, context_id: str | None = None) -> ModelInfo:
        """What a translator maps a vendor's voice id against: the named model's info; with no name (the voice
        chooses the model), the default's with every model's voices."""
        if name:
            return self.named(name, context_id).info
        return self._any_info

    def first(self, model_type: str) -> Model:
        """The first model of `model_type` (custom_voice, base, voice_design), else the default."""
        return next((m for m in self.all if m.info.model_type == model_type), self.default)

    def voices(self) -> tuple[str, ...]:
        """Every model's voices, each once, in the models' order."""
        return self._voices
