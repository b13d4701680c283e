"""Alibaba DashScope's Qwen TTS over HTTP (`POST /api/v1/services/aigc/multimodal-generation/generation`), Sans-I/O,
onto `Session` through sessions/http.py. The official `dashscope` SDK's `MultiModalConversation.call(model=
"qwen3-tts-flash", text=..., voice=..., stream=...)` and `dashscope.audio.qwen_tts.SpeechSynthesizer.call` post
here: `{"model", "input": {"text", "voice", "language_type"}, "parameters": {...}}` with `Authorization: Bearer KEY`;
`X-DashScope-SSE: enable` asks for a stream.

- Streamed: server-sent events as DashScope's (`id:`, `event:result`, `:HTTP_STATUS/200`, `data:`), each
  `{"output": {"finish_reason": "null", "audio": {"data": <base64 PCM s16le 24 kHz>, "id", "expires_at"}},
  "usage", "request_id"}`, the last with `finish_reason: "stop"`, empty `data` and the usage (`characters`). The
  stream keeps no file: its last event's `url` is empty.
- Not streamed: one JSON object once the audio is made, whose `output.audio.url` is a WAV file (24 kHz, 16-bit)
  that talkgate serves for a bounded time (server/audio_files.py), `data` empty, as DashScope answers.
Errors are DashScope's `{"code", "message", "request_id"}` with its HTTP statuses; after a stream began, an
`event:error` event of the same object.
"""
from __future__ import annotations

import base64
from typing import Callable

from talkgate.sessions.actions import dumps, http_status
from talkgate.sessions.fields import SessionError, field_of, show
from talkgate.sessions.http import HttpSpeech, Respond, new_request_id
from talkgate.sessions.models import Models
from talkgate.sessions.session import AudioFormat, AudioOut, ContextConfig, ContextFinished, Session
from talkgate.sessions.voices import UnknownVoice, VoiceMap, resolve_language

PATH = "/api/v1/services/aigc/multimodal-generation/generation"
DEFAULT_VOICE = "Cherry"
STREAM_FORMAT = AudioFormat("pcm_s16le", 24000)
FILE_FORMAT = AudioFormat("wav", 24000, streaming=False)
# (HTTP status, DashScope's code) of talkgate's codes that have their own; any other client mistake is
# 400 InvalidParameter, a server failure 500 InternalError
CODES = {"unauthorized": (401, "InvalidApiKey"), "unknown_model": (404, "ModelNotFound"),
         "shutting_down": (503, "ServiceUnavailable"), "engine_full": (429, "Throttling.AllocationQuota")}
OTHER_CODES = {404: "NotFound", 413: "BadRequest.TooLarge", 429: "Throttling"}   # by status: a key's limits are 429

# keep(wav) -> (the audio's id, its URL, when the URL expires: Unix seconds): the I/O layer's, for a response
# that is not streamed
Keep = Callable[[bytes], "tuple[str, str, int]"]


def parse_request(body: object, models: Models, voices: VoiceMap, max_chars: int) -> tuple[str, str, ContextConfig]:
    """-> (text, the request's model name, the context's config without its format); raises SessionError."""
    if not isinstance(body, dict):
        raise SessionError("invalid_request", "the body must be a JSON object {\"model\", \"input\": {\"text\", ...}}")
    model = field_of(body, "model", str)
    if not model:
        raise SessionError("invalid_request", "model is required (qwen3-tts-flash, qwen-tts, or a served model)")
    info = models.info_for(model)       # unknown_model
    given = field_of(body, "input", dict, required=True)
    field_of(body, "parameters", dict)
    text = field_of(given, "text", str, "")
    if not text.strip():
        raise SessionError("invalid_request", "input.text is required and must not be empty")
    if len(text) > max_chars:
        raise SessionError("text_too_long", f"input.text is limited to {max_chars} characters")
    voice_id = field_of(given, "voice", str) or DEFAULT_VOICE
    try:
        voice = voices.resolve("dashscope", voice_id, info.voices)
    except UnknownVoice:
        raise SessionError("unknown_voice", f"input.voice: unknown voice {show(voice_id)}: add it to the voice map "
                           "(talkgate serve --voice-map)") from None
    if voice_id == DEFAULT_VOICE and info.voices and voice not in info.voices:
        voice = None        # a model without DashScope's default voice speaks its own default (as the realtime API)
    language = resolve_language(field_of(given, "language_type", str), info.languages)
    instructions = field_of(given, "instructions", str) or None
    return text, model, ContextConfig(voice=voice, language=language, instructions=instructions, model=model)


def error_body(status: int, code: str, message: str, request_id: str) -> tuple[int, dict]:
    """talkgate's (status, code) -> DashScope's status and error object."""
    status, name = CODES.get(code, (status, OTHER_CODES.get(status) or
                                    ("InternalError" if status >= 500 else "InvalidParameter")))
    return status, {"code": name, "message": message, "request_id": request_id}


def http_error(status: int, code: str, message: str, request_id: str | None = None) -> Respond:
    """An error before any audio (a request refused before its translator is made gets a request id of its own)."""
    status, body = error_body(status, code, message, request_id or new_request_id())
    return Respond(status, "application/json", dumps(body).encode(), error=code)


class DashScopeSpeech(HttpSpeech):
    def __init__(self, session: Session, text: str, streamed: bool, keep: Keep | None = None):
        super().__init__(session, text, streamed)
        self.keep = keep
        self.content_type = "text/event-stream" if streamed else "application/json"
        self.audio_id = f"audio_{self.request_id.replace('-', '')}"
        self.events = 0

    def body(self, ev: AudioOut) -> list[bytes]:
        if not self.streamed:
            return [ev.payload]
        return [self._sse("result", 200, self._result("null", base64.b64encode(ev.payload).decode("ascii")))]

    def end(self, ev: ContextFinished) -> list[bytes]:
        if not self.streamed:
            return []
        return [self._sse("result", 200, self._result("stop", ""))]

    def whole(self, pieces: list[bytes]) -> bytes:
        """The WAV kept at a URL (keep); the answer names it."""
        self.audio_id, url, expires_at = self.keep(b"".join(pieces))
        return dumps(self._result("stop", "", url, expires_at)).encode()

    def failed_body(self, code: str, message: str) -> bytes | None:
        status, body = error_body(http_status(code), code, message, self.request_id)
        return self._sse("error", status, body)

    def error(self, status: int, code: str, message: str) -> Respond:
        return http_error(status, code, message, self.request_id)

    def _result(self, finish_reason: str, data: str, url: str = "", expires_at: int = 0) -> dict:
        audio = {"data": data, "id": self.audio_id, "expires_at": expires_at, "url": url}
        out = {"output": {"finish_reason": finish_reason, "audio": audio}, "request_id": self.request_id}
        if finish_reason == "stop":
            out["usage"] = {"characters": len(self.text)}
        return out

    def _sse(self, event: str, status: int, obj: dict) -> bytes:
        """One event as DashScope frames it; `status:` (the SDK reads an error's status there) on errors only."""
        self.events += 1
        extra = f"status:{status}\n" if event == "error" else ""
        return f"id:{self.events}\nevent:{event}\n:HTTP_STATUS/{status}\n{extra}data:{dumps(obj)}\n\n".encode()
