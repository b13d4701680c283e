"""OpenAI `POST /v1/audio/speech`, Sans-I/O, onto `Session` (sessions/http.py): the request's input is
one context, its audio the response.

As OpenAI's endpoint: the body streams as the audio is generated (chunked) in every format, and
`stream_format: "sse"` sends `speech.audio.delta` events (base64 audio of the response format) and a
last `speech.audio.done` with `usage` (input_tokens: the text's token ids; output_tokens: the codec
frames made, the model's audio tokens, 12.5 a second). talkgate's own `stream: false` asks for the
whole file at the end instead (a WAV, MP3 or FLAC with exact length fields). Wire facts: docs/compat.md.

The voice: `voice` names a voice (OpenAI's names through the voice map's "openai" table, a voice of the
model, or a stored cloned voice), as a string or as OpenAI's custom-voice object `{"id": ...}`; or
`ref_audio` (a data URL or base64 of an audio file) with optional `ref_text` (its words: an in-context
clone) clones a voice for this request only, and `voice`, which OpenAI's clients always send, is then ignored.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass

from talkgate.sessions.actions import SERVER_ERRORS
from talkgate.sessions.fields import SessionError, field_of, integer, number, show
from talkgate.sessions.http import HttpSpeech, sse
from talkgate.sessions.models import Models
from talkgate.sessions.reference_audio import MAX_BYTES, check_ref_text, decode_inline
from talkgate.sessions.session import AudioFormat, AudioOut, ContextConfig, ContextFinished, Session
from talkgate.sessions.voices import UnknownVoice, VoiceMap
from talkgate.synth.api import SEED_RANGE, ModelInfo, SamplingParams, seed_fits

# response_format -> (session encoding, sample rate, content type)
FORMATS = {
    "mp3": ("mp3", 24000, "audio/mpeg"),
    "opus": ("ogg_opus", 24000, "audio/ogg"),   # players decode Ogg/Opus at 48 kHz whatever the input rate
    "aac": ("aac", 24000, "audio/aac"),         # ADTS
    "flac": ("flac", 24000, "audio/flac"),
    "wav": ("wav", 24000, "audio/wav"),
    "pcm": ("pcm_s16le", 24000, "audio/pcm"),
}


@dataclass(frozen=True)
class SpeechRequest:
    text: str
    config: ContextConfig
    response_format: str
    streamed: bool
    sse: bool
    ref_audio: bytes | None = None      # a file of reference audio for this request (the caller decodes it
    ref_text: str | None = None         # into config.reference: sessions/reference_audio.py read_clip)


def parse_request(body: object, max_chars: int, models: Models, voices: VoiceMap) -> SpeechRequest:
    """The JSON body -> SpeechRequest; raises SessionError (codes as OpenAI's: invalid_request, ...). `models`: the
    served models (sessions/models.py), whose `model` field picks the voices `voice` is mapped against."""
    try:
        return _parse(body, max_chars, models, voices)
    except SessionError as e:
        if e.code in ("invalid_message", "invalid_params"):    # a missing or mistyped field
            raise SessionError("invalid_request", e.message) from None
        raise


def _voice(body: dict, info: ModelInfo, voices: VoiceMap) -> str | None:
    """`voice`: a name (OpenAI's, mapped by the voice map's "openai" table, or a talkgate voice) or
    {"id": ...}, resolved the same way."""
    voice = body.get("voice")
    if isinstance(voice, dict):
        voice = voice.get("id")
        if not isinstance(voice, str) or not voice:
            raise SessionError("invalid_request", "voice must be a name or an object {\"id\": \"<voice id>\"}")
    elif voice is not None and not isinstance(voice, str):
        raise SessionError("invalid_request", "voice must be a name or an object {\"id\": \"<voice id>\"}")
    if voice is None:
        return None
    try:
        return voices.resolve("openai", voice, info.voices)
    except UnknownVoice:
        raise SessionError("unknown_voice", f"unknown voice {show(voice)}; available: OpenAI's voices "
                           f"({', '.join(voices.tables['openai']) or 'none mapped'}) and this model's "
                           f"({', '.join(info.voices) or 'none: it takes instructions'})") from None


def _parse(body: object, max_chars: int, models: Models, voices: VoiceMap) -> SpeechRequest:
    if not isinstance(body, dict):
        raise SessionError("invalid_request", "the body must be a JSON object")
    text = field_of(body, "input", str, required=True)
    if not text.strip():
        raise SessionError("invalid_request", "input is empty")
    if len(text) > max_chars:
        raise SessionError("text_too_long", f"input is limited to {max_chars} characters")
    fmt = field_of(body, "response_format", str, "mp3")
    if fmt not in FORMATS:
        raise SessionError("invalid_format", f"response_format {show(fmt)} is not supported; use one of "
                           f"{', '.join(FORMATS)}")
    speed = number(body, "speed", 0.25, 4.0, 1.0)
    streamed = field_of(body, "stream", bool, True)
    stream_format = field_of(body, "stream_format", str, "audio")
    if stream_format not in ("audio", "sse"):
        raise SessionError("invalid_request", "stream_format must be 'audio' or 'sse'")
    if stream_format == "sse" and not streamed:
        raise SessionError("invalid_request", "stream_format 'sse' streams its events: it cannot be combined with "
                           "stream: false")
    if field_of(body, "non_streaming_mode", bool, False):
        raise SessionError("unsupported", "non_streaming_mode=true is not supported: talkgate feeds text to "
                           "the model as it arrives (non_streaming_mode=false)")
    model = field_of(body, "model", str)
    info = models.info_for(model)           # the voice is one of the model's the request names (or any model's)
    fixed = integer(body, "fixed_frames", 1, 100_000)
    seed = field_of(body, "seed", int)
    if seed is not None and not seed_fits(seed):
        raise SessionError("invalid_request", f"seed must fit in 64 bits ({SEED_RANGE})")
    encoding, rate, _ = FORMATS[fmt]
    voice = _voice(body, info, voices)
    ref_audio = ref_text = None
    if body.get("ref_audio") is not None:
        ref_audio = decode_inline(body["ref_audio"], MAX_BYTES)
        ref_text = check_ref_text(body.get("ref_text"))
        if field_of(body, "x_vector_only_mode", bool, False):
            ref_text = None
        voice = None                        # the clients always send one
    elif body.get("ref_text") is not None:
        raise SessionError("invalid_request", "ref_text needs ref_audio, the audio whose words it is")
    cfg = ContextConfig(voice=voice, language=field_of(body, "language", str, "auto"),
                        instructions=field_of(body, "instructions", str),
                        format=AudioFormat(encoding, rate, streaming=streamed),
                        sampling=SamplingParams(seed=seed), fixed_frames=fixed, speed=speed, model=model)
    return SpeechRequest(text, cfg, fmt, streamed, stream_format == "sse", ref_audio, ref_text)


class OpenAISpeech(HttpSpeech):
    def __init__(self, session: Session, request: SpeechRequest):
        super().__init__(session, request.text, request.streamed)
        self.request = request
        self.content_type = "text/event-stream" if request.sse else FORMATS[request.response_format][2]

    def body(self, ev: AudioOut) -> list[bytes]:
        if self.request.sse:
            return [sse({"type": "speech.audio.delta", "audio": base64.b64encode(ev.payload).decode()})]
        return [ev.payload]

    def end(self, ev: ContextFinished) -> list[bytes]:
        if not self.request.sse:
            return []
        return [sse({"type": "speech.audio.done", "usage": {
            "input_tokens": ev.text_tokens, "output_tokens": ev.frames, "total_tokens": ev.text_tokens + ev.frames}})]

    def failed_body(self, code: str, message: str) -> bytes | None:
        if not self.request.sse:
            return None
        kind = "server_error" if code in SERVER_ERRORS else "invalid_request_error"
        return sse({"type": "error", "error": {"message": message, "type": kind, "code": code}})
