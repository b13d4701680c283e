"""OpenAI-compatible `POST /v1/audio/speech` and `GET /v1/audio/voices` (sessions/openai.py is the
translator, gateway/http_speech.py the I/O every HTTP speech endpoint shares)."""
from __future__ import annotations

from aiohttp import web

from talkgate.gateway.compat_routes import VOICE_MAP
from talkgate.gateway.http_speech import serve_speech
from talkgate.gateway.server import ErrorResponse
from talkgate.sessions.openai import SpeechProtocol, parse_request


async def speech(request: web.Request) -> web.StreamResponse:
    gw = request.app["gateway"]

    def make(body) -> SpeechProtocol:
        req = parse_request(body, gw.limits.max_http_input_chars, gw.client.info, request.app[VOICE_MAP])
        return SpeechProtocol(gw.new_session("openai", req.config), req)

    return await serve_speech(request, "openai", make)


async def voices(request: web.Request) -> web.Response:
    gw = request.app["gateway"]
    if not gw.authorized(request):
        return ErrorResponse(401, "unauthorized", "a valid API key is required")
    info = gw.client.info
    return web.json_response({"voices": [{"id": v, "name": v} for v in info.voices],
                              "languages": list(info.languages), "model": info.as_dict()})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/audio/voices", voices)
