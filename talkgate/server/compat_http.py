"""Routes of the compatible HTTP speech APIs (docs/compat.md): ElevenLabs text-to-speech (convert, stream,
with timestamps) and its model listing (`GET /v1/models`, which Deepgram's clients get in Deepgram's shape),
Cartesia `/tts/bytes` and `/tts/sse`, Deepgram `POST /v1/speak`, DashScope's Qwen TTS (and the WAV files its
non-streamed answers name, `GET /api/v1/audio/{id}.wav`).
Each handler only parses the request into its translator (sessions/elevenlabs.py, cartesia.py,
deepgram.py, dashscope_http.py); keys, drain, body and the streamed response are server/http_speech.py's."""
from __future__ import annotations

from dataclasses import replace

from aiohttp import web

from talkgate.server import voices_http
from talkgate.server.compat_ws import scope
from talkgate.server.errors import add_route, respond
from talkgate.server.http_speech import serve_speech
from talkgate.sessions import cartesia, dashscope_http, deepgram, elevenlabs
from talkgate.sessions.voices import ISO_LANGUAGES

# model ids the ElevenLabs clients send by default: listed, and served by the one loaded model
ELEVENLABS_MODEL_IDS = ("eleven_flash_v2_5", "eleven_turbo_v2_5", "eleven_multilingual_v2", "eleven_v3")


def _elevenlabs(timestamps: bool, streamed: bool):
    async def handler(request: web.Request) -> web.StreamResponse:
        gw = request.app["gateway"]

        async def make(body) -> elevenlabs.ElevenLabsSpeech:
            own = scope(request)
            text, config, output = elevenlabs.parse_http_request(
                request.match_info["voice_id"], dict(request.query), body, gw.models, own.voice_map,
                gw.limits.max_text_chars)
            return elevenlabs.ElevenLabsSpeech(gw.new_session("elevenlabs", own.voices, config), text, output,
                                               timestamps, streamed)

        return await serve_speech(request, "elevenlabs", make, elevenlabs.http_error)

    return handler


async def elevenlabs_models(request: web.Request) -> web.Response:
    """ElevenLabs `GET /v1/models`: the default model under its own name and under the ids clients send, then each
    other served model under its name (with its voices: `talkgate_voices`)."""
    gw = request.app["gateway"]
    if not gw.authorized(request):
        return respond(elevenlabs.http_error(401, "unauthorized", "a valid API key is required"))
    info = gw.client.info
    names = {code: name for code, name in ISO_LANGUAGES.items() if name in info.languages}
    languages = [{"language_id": code, "name": name.capitalize()} for code, name in names.items()]
    notice = " (random untrained weights: the audio is noise)" if info.untrained else ""

    def model(model_id: str, name: str, info=info) -> dict:
        return {"talkgate_model_type": info.model_type, "talkgate_voices": list(info.voices),"model_id": model_id, "name": name, "can_do_text_to_speech": True, "can_do_voice_conversion": False,
                "can_be_finetuned": False, "can_use_style": False, "can_use_speaker_boost": False,
                "serves_pro_voices": False, "requires_alpha_access": False, "token_cost_factor": 1.0,
                "description": f"talkgate serving {info.name} ({info.model_type} {info.size}){notice}",
                "maximum_text_length_per_request": gw.limits.max_text_chars, "languages": languages}

    served = [model(m.name, f"{m.name}: talkgate {m.info.model_type} {m.info.size}", m.info) for m in gw.models.all]
    return web.json_response([model("talkgate", f"talkgate {info.model_type} {info.size}")]
                             + [model(m, f"{m} (served by talkgate)") for m in ELEVENLABS_MODEL_IDS] + served)


def deepgram_client(request: web.Request) -> bool:
    """Whether a request comes from a Deepgram client: its SDK's name header, its user agent, or Deepgram's
    `Authorization: Token` scheme (ElevenLabs' clients send xi-api-key)."""
    agent = request.headers.get("User-Agent", "").lower()
    return (request.headers.get("X-Fern-SDK-Name") == "deepgram-sdk" or agent.startswith("deepgram")
            or request.headers.get("Authorization", "").lower().startswith("token "))


async def models(request: web.Request) -> web.StreamResponse:
    """`GET /v1/models` is ElevenLabs' model list and Deepgram's model list, in two shapes: a Deepgram client
    gets Deepgram's (the voices as TTS models, stored ones included), every other client ElevenLabs'."""
    if deepgram_client(request):
        return await voices_http.deepgram_models(request)
    return await elevenlabs_models(request)


def _cartesia(events: bool):
    async def handler(request: web.Request) -> web.StreamResponse:
        gw = request.app["gateway"]

        async def make(body) -> cartesia.CartesiaSpeech:
            voices = scope(request)
            text, config, own = cartesia.parse_http_request(body, gw.models, voices.voice_map,
                                                            gw.limits.max_text_chars, events)
            session = gw.new_session("cartesia", voices.voices)
            session.configure(**config)
            return cartesia.CartesiaSpeech(session, text, config["format"], events, **own)

        return await serve_speech(request, "cartesia", make, cartesia.http_error)

    return handler


async def deepgram_rest(request: web.Request) -> web.StreamResponse:
    gw = request.app["gateway"]

    async def make(body) -> deepgram.DeepgramSpeech:
        own = scope(request)
        text, model, config = deepgram.parse_rest_request(dict(request.query), body, gw.models, own.voice_map)
        return deepgram.DeepgramSpeech(gw.new_session("deepgram", own.voices, config), text, model, config.format)

    return await serve_speech(request, "deepgram", make, deepgram.rest_error)


async def dashscope_speech(request: web.Request) -> web.StreamResponse:
    """Qwen TTS: `X-DashScope-SSE: enable` streams server-sent events; else the answer names a WAV file kept in the
    workers' shared folder (server/audio_files.py) for its TTL, at a URL of the host the request came to."""
    gw = request.app["gateway"]
    streamed = request.headers.get("X-DashScope-SSE", "").lower() == "enable"

    def keep(wav: bytes) -> tuple[str, str, int]:
        audio_id, expires_at = gw.audio_files.put(wav)
        return audio_id, f"{request.scheme}://{request.host}{DASHSCOPE_AUDIO}{audio_id}.wav", expires_at

    async def make(body) -> dashscope_http.DashScopeSpeech:
        own = scope(request)
        text, model, config = dashscope_http.parse_request(body, gw.models, own.voice_map, gw.limits.max_text_chars)
        fmt = dashscope_http.STREAM_FORMAT if streamed else dashscope_http.FILE_FORMAT
        session = gw.new_session("dashscope", own.voices, replace(config, format=fmt))
        return dashscope_http.DashScopeSpeech(session, text, streamed, None if streamed else keep)

    return await serve_speech(request, "dashscope", make, dashscope_http.http_error)


DASHSCOPE_AUDIO = "/api/v1/audio/"          # a non-streamed DashScope answer's audio URL: DASHSCOPE_AUDIO + its id .wav


async def dashscope_audio(request: web.Request) -> web.StreamResponse:
    """A non-streamed answer's WAV while its URL is valid; the id is the whole of the access rule (DashScope's URL
    is a signed one, fetched without a key)."""
    path = request.app["gateway"].audio_files.path(request.match_info["name"])
    if path is None:
        return respond(dashscope_http.http_error(404, "not_found", "no such audio, or its URL has expired"))
    return web.FileResponse(path, headers={"Content-Type": "audio/wav"})


def add_routes(app: web.Application) -> None:
    for path, timestamps, streamed in (("", False, True), ("/stream", False, True),
                                       ("/with-timestamps", True, False), ("/stream/with-timestamps", True, True)):
        add_route(app, "POST", f"/v1/text-to-speech/{{voice_id}}{path}", _elevenlabs(timestamps, streamed),
                  elevenlabs.http_error)
    app.router.add_get("/v1/models", models)
    add_route(app, "POST", "/tts/bytes", _cartesia(events=False), cartesia.http_error)
    add_route(app, "POST", "/tts/sse", _cartesia(events=True), cartesia.http_error)
    add_route(app, "POST", "/v1/speak", deepgram_rest, deepgram.rest_error)
    add_route(app, "POST", dashscope_http.PATH, dashscope_speech, dashscope_http.http_error)
    add_route(app, "GET", DASHSCOPE_AUDIO + "{name}", dashscope_audio, dashscope_http.http_error)
