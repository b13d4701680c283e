"""OpenAI-compatible `POST /v1/audio/speech` (sessions/openai.py is the translator, server/http_speech.py the
I/O every HTTP speech endpoint shares; the voices endpoints are voices_http.py's)."""
from __future__ import annotations

import asyncio
from dataclasses import replace

from aiohttp import web

from talkgate.server.compat_ws import scope
from talkgate.server.http_speech import serve_speech
from talkgate.sessions.openai import OpenAISpeech, parse_request
from talkgate.sessions.reference_audio import read_clip
from talkgate.sessions.session import Reference


async def speech(request: web.Request) -> web.StreamResponse:
    gw = request.app["gateway"]

    async def make(body) -> OpenAISpeech:
        own = scope(request)
        req = parse_request(body, gw.limits.max_http_input_chars, gw.models, own.voice_map)
        config = req.config
        if req.ref_audio is not None:       # this request's own voice: decoded off the loop, made by the engine
            clip = await asyncio.to_thread(read_clip, req.ref_audio, "ref_audio")
            config = replace(config, reference=Reference(clip.samples.tobytes(), req.ref_text))
        return OpenAISpeech(gw.new_session("openai", own.voices, config), req)

    return await serve_speech(request, "openai", make)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/speech", speech)
