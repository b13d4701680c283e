"""Routes of the drop-in compatible WebSocket APIs (docs/compat.md): ElevenLabs, Cartesia, Deepgram (/v1/speak and
Flux /v2/speak), DashScope's Qwen-TTS realtime, and the Twilio Media Streams mode. Each handler only builds the
Sans-I/O protocol object; accept, limits, access checks and the socket loop are `Gateway.serve_websocket`'s. Each
speaks the voices of its client's tenant (`scope`: Gateway.scope), or, for a key sent in the first message, those
of the scope `authenticate` gives."""
from __future__ import annotations

from aiohttp import web

from talkgate.server.errors import ErrorResponse, add_route, respond
from talkgate.server.gateway import IDENTITY
from talkgate.sessions import dashscope_http, deepgram_v2
from talkgate.sessions.cartesia import CartesiaProtocol, http_error as cartesia_error
from talkgate.sessions.dashscope import DashScopeProtocol
from talkgate.sessions.deepgram import DeepgramProtocol, rest_error
from talkgate.sessions.elevenlabs import ElevenLabsProtocol, http_error as elevenlabs_error
from talkgate.sessions.fields import SessionError
from talkgate.sessions.native import NativeProtocol
from talkgate.sessions.twilio import TwilioProtocol
from talkgate.sessions.voices import VoiceScope

def scope(request: web.Request) -> VoiceScope:
    """The voices the request's client may name (none before it is authenticated)."""
    return request.app["gateway"].scope(request.get(IDENTITY))


def _elevenlabs(multi: bool):
    label = "elevenlabs"

    async def handler(request: web.Request) -> web.WebSocketResponse:
        gw = request.app["gateway"]
        voice_id, query = request.match_info["voice_id"], dict(request.query)

        def make(session_id, authenticate):
            own = scope(request)
            return ElevenLabsProtocol(gw.new_session(label, own.voices, player=True), session_id, voice_id, query,
                                      own.voice_map, multi, authenticate)

        return await gw.serve_websocket(request, label, make, first_message_auth=True)

    return handler


async def cartesia_ws(request: web.Request) -> web.WebSocketResponse:
    gw = request.app["gateway"]

    def make(session_id, authenticate):
        own = scope(request)
        return CartesiaProtocol(gw.new_session("cartesia", own.voices, player=True), session_id, own.voice_map)

    return await gw.serve_websocket(request, "cartesia", make)


async def deepgram_ws(request: web.Request) -> web.WebSocketResponse:
    gw = request.app["gateway"]
    query = dict(request.query)

    def make(session_id, authenticate):
        own = scope(request)
        return DeepgramProtocol(gw.new_session("deepgram", own.voices, player=True), session_id, query, own.voice_map)

    return await gw.serve_websocket(request, "deepgram", make)


async def deepgram_v2_ws(request: web.Request) -> web.StreamResponse:
    """Flux TTS. A bad query is refused before the upgrade, with HTTP 400 in Deepgram's REST error shape, as Deepgram
    refuses it (the SDK's connect raises ApiError with that status). Only for a client with a valid key: the answer
    names the models and voices, and an unauthorized one is refused after the upgrade, as on every socket."""
    gw = request.app["gateway"]
    settings, known = None, gw.identify(request) is not None    # serve_websocket refuses (and audits) the others
    own = scope(request)
    if known:
        try:
            settings = deepgram_v2.parse_query(dict(request.query), gw.models, own.voice_map)
        except SessionError as e:
            return respond(rest_error(400, e.code, e.message))

    def make(session_id, authenticate):
        session = gw.new_session("deepgram_v2", own.voices, player=True)
        return deepgram_v2.DeepgramV2Protocol(session, session_id, settings)

    return await gw.serve_websocket(request, "deepgram_v2", make)


async def dashscope_ws(request: web.Request) -> web.StreamResponse:
    """Qwen-TTS realtime; the SDK sends its key as Authorization: Bearer. A connection without `model` is refused
    before the upgrade, in DashScope's HTTP error shape."""
    gw = request.app["gateway"]
    model = request.query.get("model", "")
    if not model:
        return respond(dashscope_http.http_error(400, "invalid_request", "model is required (?model=qwen-tts-realtime)"))

    def make(session_id, authenticate):
        own = scope(request)
        return DashScopeProtocol(gw.new_session("dashscope", own.voices, player=True), session_id, model, own.voice_map)

    return await gw.serve_websocket(request, "dashscope", make)


async def twilio_ws(request: web.Request) -> web.StreamResponse:
    gw = request.app["gateway"]
    stream_sid = request.query.get("stream_sid", "")
    if not stream_sid:
        return ErrorResponse(400, "invalid_request", "stream_sid (the Twilio Media Stream's streamSid) is required")

    def make(session_id, authenticate):
        native = NativeProtocol(gw.new_session("twilio", scope(request).voices, player=True), gw.limits, session_id,
                                authenticate)
        return TwilioProtocol(native, stream_sid)

    return await gw.serve_websocket(request, "twilio", make, first_message_auth=True)


def add_routes(app: web.Application) -> None:
    add_route(app, "GET", "/v1/text-to-speech/{voice_id}/stream-input", _elevenlabs(multi=False), elevenlabs_error)
    add_route(app, "GET", "/v1/text-to-speech/{voice_id}/multi-stream-input", _elevenlabs(multi=True),
              elevenlabs_error)
    add_route(app, "GET", "/tts/websocket", cartesia_ws, cartesia_error)
    add_route(app, "GET", "/v1/speak", deepgram_ws, rest_error)
    add_route(app, "GET", "/v2/speak", deepgram_v2_ws, rest_error)
    add_route(app, "GET", "/api-ws/v1/realtime", dashscope_ws, dashscope_http.http_error)
    app.router.add_get("/v1/twilio", twilio_ws)
