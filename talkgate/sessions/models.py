"""The models one server serves (`talkgate serve --model A --model B ...`) and which of them a request is for.

Pure: `Models` holds each model's name and ModelInfo, in the order given (the first is the default), and
answers the one routing question every protocol asks, `route`:
  1. a model the request names: a configured model's name (case-insensitive), or a vendor's model name that
     clients send today (OpenAI's tts-1, ElevenLabs' eleven_*, Cartesia's sonic*, DashScope's qwen*-realtime*, ...: VENDOR_MODELS), which
     stays an alias of the default model; any other name is unknown_model (the protocol's own error);
  2. else the voice: a voice of a model (a CustomVoice speaker) -> the first model that has it, the default
     first; a stored cloned voice -> the first Base model it is valid on (made by a checkpoint of the same
     voice_key: synth/api.py ModelInfo.speaks), reference audio -> the first Base model; instructions alone (no
     voice) -> the first VoiceDesign model;
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
    def __init__(self, models: list[Model], aliases: dict[str, str] | None = None):
        """`aliases`: other names of served models (alias -> model name; a models file's `aliases`), looked up as
        their names are, before the vendors' names (so `tts-1` may name a configured model)."""
        if not models:
            raise ValueError("no model")
        self.all = tuple(models)
        self.default = models[0]
        self._by_name = {m.name.lower(): m for m in models}
        for alias, name in (aliases or {}).items():
            self._by_name.setdefault(alias.lower(), self._by_name[name.lower()])
        self._voices = tuple(dict.fromkeys(v for m in models for v in m.info.voices))
        # what a request that names no model maps its voice against (info_for): made once, not per request
        self._any_info = replace(self.default.info, voices=self._voices)
        # the model that makes uploaded voices unless the upload names one: the first that clones, or None
        self.cloner = next((m for m in models if m.info.clones), None)
        # what session.ready and the web page show of each model (its served name; `checkpoint`: where from)
        self.listing = tuple({**m.info.as_dict(), "name": m.name, "checkpoint": m.info.name,
                              "default": m is self.default} for m in models)

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

    def route(self, name: str | None = None, voice: str | None = None, made_by: dict | None = None,
              instructions: bool = False, context_id: str | None = None) -> Model:
        """The model a request is for (the module's rules). `voice`: the voice asked for; `made_by`: the voice is a
        stored (cloned) one, made by the model this describes (StoredVoice.model), or {} for reference audio the
        request brings; `instructions`: the request has instructions. A stored voice no served model can speak goes
        to the first that clones (or the default), whose refusal says why (sessions/voices.py)."""
        if name:
            return self.named(name, context_id)
        if made_by is not None:
            return next((m for m in self.all if m.info.speaks(made_by)), self.cloner or self.default)
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
        """The first model of `model_type` (custom_voice, voice_design), else the default."""
        return next((m for m in self.all if m.info.model_type == model_type), self.default)

    def maker(self, name: str | None = None) -> Model:
        """The model that makes a voice to store: the one named, else the first that clones; SessionError
        unknown_model, or cloning_unavailable when it (or every served model) cannot clone."""
        model = self.named(name) if name else self.cloner
        if model is None or not model.info.clones:
            which = f"model {model.name} is {model.info.model_type}" if model is not None else \
                f"this server's models are {', '.join(sorted({m.info.model_type for m in self.all}))}"
            raise SessionError("cloning_unavailable", f"{which}, which cannot clone voices: serve a Base checkpoint")
        return model

    def voices(self) -> tuple[str, ...]:
        """Every model's voices, each once, in the models' order."""
        return self._voices
