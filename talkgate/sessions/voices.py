"""What a client's voice means: `Voices`, the one resolution every session uses (a voice of the model, or a
stored cloned voice), and `VoiceMap`, which takes a compatible API's voice identifier to a talkgate voice.

Voices: a voice of the model (case-insensitive) is itself; otherwise a stored voice by id (`voice_` and 16
hex digits) or by name (case-insensitive) is its synth.api.VoicePrompt (server/voice_store.py keeps them).

VoiceMap: a table per API maps the API's voice ids (OpenAI voice names, ElevenLabs voice ids, Cartesia voice
UUIDs, Deepgram model names, DashScope voice names) onto talkgate voices (a model voice's name, a stored voice's
id or name), or onto null (the model's default voice). A stored voice's id or name is itself (so the ids the clone endpoints return work
as they are); an id that is not in the table but names a voice of the model (case-insensitive) is that
voice; otherwise the table's "*" entry, if it has one, applies; otherwise the id is unknown and the API
answers with its own error shape. A model without named voices (Base, VoiceDesign) speaks every other id
with its default voice, except an id of the stored-voice form, which is a deleted voice: unknown.

The JSON file given by `talkgate serve --voice-map FILE` has the shape of `DEFAULT_TABLES`, e.g.
    {"elevenlabs": {"21m00Tcm4TlvDq8ikWAM": "vivian", "*": "ryan"}, "deepgram": {"aura-2-thalia-en": null}}
Its tables replace the defaults API by API (an API it does not name keeps the default table).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from talkgate.sessions.fields import SessionError, show
from talkgate.synth.api import ModelInfo, VoicePrompt

APIS = ("openai", "elevenlabs", "cartesia", "deepgram", "dashscope")
ANY = "*"
VOICE_ID_PREFIX = "voice_"
STORED_ID = re.compile(r"voice_[0-9a-f]{16}\Z")

# Defaults: the voices the clients use out of the box, onto Qwen3-TTS CustomVoice speakers.
DEFAULT_TABLES: dict[str, dict[str, str | None]] = {
    # OpenAI's built-in voices by their character (OpenAI's descriptions: warm / bright, lower / higher)
    "openai": {
        "alloy": "serena",      # neutral, balanced
        "ash": "ryan",          # clear, male
        "ballad": "aiden",      # expressive, male
        "coral": "vivian",      # warm, female
        "echo": "ryan",         # resonant, male
        "fable": "aiden",       # storyteller, male
        "nova": "vivian",       # bright, female
        "onyx": "uncle_fu",     # deep, male
        "sage": "serena",       # calm, female
        "shimmer": "vivian",    # light, female
        "verse": "aiden",       # versatile, male
        "marin": "serena",      # natural, female
        "cedar": "ryan",        # natural, male
    },
    "elevenlabs": {
        "hpp4J3VqNfWAUOO0d1Us": "serena",    # LiveKit plugin default
        "21m00Tcm4TlvDq8ikWAM": "vivian",    # Rachel
        "JBFqnCBsd6RMkjVDRZzb": "ryan",      # George (the SDK's quickstart)
        "EXAVITQu4vr4xnSDxMaL": "serena",    # Sarah
        "pNInz6obpgDQGcFmaJgB": "ryan",      # Adam
        "TxGEqnHWrfWFTfGW9XjX": "aiden",     # Josh
        "ErXwobaYiN019PkySvjV": "eric",      # Antoni
    },
    "cartesia": {
        "f786b574-daa5-4673-aa0c-cbe3e8534c02": "vivian",   # LiveKit plugin default (Katie)
        "71a7ad14-091c-4e8e-a314-022ece01c121": "serena",   # pipecat examples (British Reading Lady)
        "a0e99841-438c-4a64-b679-ae501e7d6091": "ryan",     # Barbershop Man
    },
    "deepgram": {
        "aura-2-helena-en": "serena",        # pipecat default
        "aura-2-andromeda-en": "vivian",     # LiveKit plugin default
        "aura-2-thalia-en": "vivian",
        "aura-2-apollo-en": "ryan",
        "aura-2-arcas-en": "aiden",
        "aura-asteria-en": "serena",
        "flux-alexis-en": "vivian",          # Flux TTS (/v2/speak), the SDK's example
        "flux-haley-en": "serena",           # Flux TTS, Deepgram's docs' example
    },
    # DashScope's Qwen-TTS realtime system voices (Alibaba's descriptions); Serena and Dylan are speakers of the
    # model too. No speaker speaks Shanghainese (Jada): the gender and age are kept over the dialect.
    "dashscope": {
        "Cherry": "vivian",     # sunny, friendly young woman (DashScope's default)
        "Chelsie": "vivian",    # sweet young woman
        "Jada": "vivian",       # Shanghai woman
        "Sunny": "vivian",      # Sichuan girl
        "Ethan": "ryan",        # bright, energetic man
        "Serena": "serena",     # gentle woman
        "Dylan": "dylan",       # Beijing young man
        "Eric": "eric",         # Sichuan man
    },
}


class UnknownVoice(Exception):
    def __init__(self, api: str, voice_id: str):
        super().__init__(f"unknown {api} voice {voice_id!r}: add it to the voice map (talkgate serve --voice-map)")
        self.api, self.voice_id = api, voice_id


class Voices:
    """The voices a session may name: the model's, then the store's. `stored(key)` -> a stored voice (with
    .id, .name, .prompt and .model, server/voice_store.py StoredVoice) by id or name, or None."""

    def __init__(self, info: ModelInfo, stored: Callable[[str], object | None] | None = None):
        self.info = info
        self.stored = stored or (lambda key: None)

    def resolve(self, voice: str, context_id: str | None = None,
                info: ModelInfo | None = None) -> tuple[str, VoicePrompt | None]:
        """-> (the voice's canonical name: a model voice's name, lower case, or a stored voice's id; the stored
        voice's VoicePrompt, else None) on `info`'s model (default: this one's). SessionError unknown_voice, or
        invalid_voice for a stored voice on a model that cannot speak cloned voices."""
        info = info or self.info
        if voice.lower() in info.voices:
            return voice.lower(), None
        found = self.stored(voice)
        if found is not None:
            if not info.clones:
                raise SessionError("invalid_voice", f"{show(voice)} is a cloned voice, which needs a Base checkpoint; "
                                   f"this model is {info.model_type}", context_id)
            if not info.speaks(found.model):
                made_by = found.model
                raise SessionError("invalid_voice", f"{show(voice)} was cloned by another Base checkpoint "
                                   f"({made_by.get('name')}, {made_by.get('size')}): a cloned voice is valid only on "
                                   f"the checkpoint that made it (its speaker encoder's); this model is {info.name} "
                                   f"({info.size}): store the voice again with this model", context_id)
            return found.id, found.prompt
        if STORED_ID.match(voice):
            raise SessionError("unknown_voice", f"no voice {show(voice)}: it was deleted, or never stored",
                               context_id)
        if info.voices:
            available = ", ".join(info.voices)
        elif info.clones:
            available = "none of its own (this model speaks cloned voices: see GET /v1/audio/voices)"
        else:
            available = "none (this model takes instructions)"
        raise SessionError("unknown_voice", f"unknown voice {show(voice)}; available: {available}", context_id)


class VoiceMap:
    def __init__(self, tables: dict[str, dict[str, str | None]] | None = None,
                 stored: Callable[[str], bool] | None = None):
        """`stored(key)`: whether a stored voice has this id or name."""
        self.stored = stored or (lambda key: False)
        self.tables = {api: dict(DEFAULT_TABLES[api]) for api in APIS}
        for api, table in (tables or {}).items():
            if api not in APIS:
                raise ValueError(f"voice map: unknown API {api!r}; expected one of {', '.join(APIS)}")
            if not isinstance(table, dict) or not all(
                    isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in table.items()):
                raise ValueError(f"voice map: {api!r} must map voice ids (strings) to talkgate voices (string or null)")
            self.tables[api] = dict(table)

    def with_stored(self, stored: Callable[[str], bool]) -> "VoiceMap":
        """The same tables, seeing the stored voices `stored` sees (one tenant's: VoiceScope)."""
        scoped = VoiceMap.__new__(VoiceMap)
        scoped.tables, scoped.stored = self.tables, stored
        return scoped

    @classmethod
    def load(cls, path: str | Path | None, stored: Callable[[str], bool] | None = None) -> "VoiceMap":
        if path is None:
            return cls(stored=stored)
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"voice map {path}: {e}") from None
        if not isinstance(data, dict):
            raise ValueError(f"voice map {path}: the file must hold a JSON object")
        return cls(data, stored)

    def resolve(self, api: str, voice_id: str | None, voices: tuple[str, ...]) -> str | None:
        """-> a talkgate voice (a model voice's name, a stored voice's id or name), or None for the model's
        default voice; raises UnknownVoice. `voices`: the loaded model's voices (an empty id or a model
        without voices: its default, or a stored voice the table names)."""
        table = self.tables[api]
        if voice_id and (STORED_ID.match(voice_id) or self.stored(voice_id)):
            return voice_id     # a cloned voice: the session speaks it, or says it was deleted
        if not voices:      # a model without named voices (voice design, voice clone): its default
            target = table.get(voice_id if voice_id in table else ANY) if voice_id else table.get(ANY)
            return target if target is not None and (STORED_ID.match(target) or self.stored(target)) else None
        if not voice_id:
            return table.get(ANY)
        if voice_id in table:
            return table[voice_id]
        if voice_id.lower() in voices:
            return voice_id.lower()
        if ANY in table:
            return table[ANY]
        raise UnknownVoice(api, voice_id)


@dataclass(frozen=True)
class VoiceScope:
    """The voices one client may name: the model's, and the stored voices of its tenant (and those shared with
    every tenant). The server makes it once it knows who the client is (server/gateway.py Gateway.scope); a
    connection that authenticates with its first message is given its scope then."""
    voices: Voices
    voice_map: VoiceMap


# ISO 639-1 codes the compatible APIs send -> Qwen3-TTS language names
ISO_LANGUAGES = {"en": "english", "zh": "chinese", "ja": "japanese", "ko": "korean", "de": "german",
                 "fr": "french", "ru": "russian", "pt": "portuguese", "es": "spanish", "it": "italian"}


def resolve_language(code: str | None, languages: tuple[str, ...]) -> str:
    """An API's language code ("en", "en-US", "english") -> a language of the model, else "auto":
    clients send their own default language with every request, and refusing it would break them."""
    if not code:
        return "auto"
    code = code.lower()
    name = ISO_LANGUAGES.get(code.replace("_", "-").split("-")[0], code)
    return name if name in languages else "auto"
