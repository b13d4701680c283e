"""The HTTP speech translators, Sans-I/O (sessions/http.py and its users): one request's context in, the
response's actions out, engine events built here. The real endpoints are run with the vendors' SDKs in
tests/system/test_compat_sdks.py; this covers what a healthy engine never does (a refused context, a failure
after the body began) and the parsing each API refuses."""
from __future__ import annotations

import base64
import json

import pytest

from talkgate.sessions.actions import Close, Send
from talkgate.sessions.cartesia import CartesiaSpeech, parse_http_request as cartesia_request
from talkgate.sessions.deepgram import DeepgramSpeech, parse_rest_query, parse_rest_request
from talkgate.sessions.elevenlabs import ElevenLabsSpeech, parse_http_request as elevenlabs_request
from talkgate.sessions.fields import SessionError
from talkgate.sessions.http import Begin, Respond
from talkgate.sessions.limits import Limits
from talkgate.sessions.openai import OpenAISpeech, parse_request
from talkgate.sessions.session import Session
from talkgate.sessions.voices import VoiceMap
from talkgate.synth.api import AppendText, AudioChunk, ContextDone, ContextFailed, EndText, OpenContext
from talkgate.synth.tokenizer import StreamingTokenizer
from tests.compat_harness import INFO, ONE_MODEL, pcm

VOICES = VoiceMap()


def session(tokenizer) -> Session:
    return Session(INFO, Limits(), lambda: StreamingTokenizer(tokenizer))


def started(proto) -> tuple[int, list]:
    """The I/O layer's two calls (server/http_speech.py): the open, then the text."""
    actions = proto.start()
    (ctx,) = [c.context for c in proto.engine_commands() if isinstance(c, OpenContext)]
    actions += proto.speak()
    proto.engine_commands()
    return ctx, actions


def openai(tokenizer, **body):
    req = parse_request({"input": "Hello there.", **body}, 4096, ONE_MODEL, VOICES)
    s = session(tokenizer)
    s.configure(**{k: getattr(req.config, k) for k in ("voice", "format", "language")})
    return OpenAISpeech(s, req)


def test_openai_voices_and_defaults():
    req = parse_request({"input": "Hi.", "voice": "onyx"}, 4096, ONE_MODEL, VOICES)
    assert req.config.voice == "uncle_fu" and req.streamed and not req.sse and req.response_format == "mp3"
    assert parse_request({"input": "Hi.", "voice": {"id": "Ryan"}}, 4096, ONE_MODEL, VOICES).config.voice == "ryan"
    assert parse_request({"input": "Hi.", "stream": False}, 4096, ONE_MODEL, VOICES).config.format.streaming is False
    for body, code in (({"voice": {"name": "x"}}, "invalid_request"), ({"voice": 3}, "invalid_request"),
                       ({"voice": "nobody"}, "unknown_voice"), ({"stream": False, "stream_format": "sse"},
                                                                 "invalid_request")):
        with pytest.raises(SessionError) as e:
            parse_request({"input": "Hi.", **body}, 4096, ONE_MODEL, VOICES)
        assert e.value.code == code, body


def test_refused_context_is_an_error_status_in_each_apis_shape(tokenizer):
    s = session(tokenizer)
    text, config, output = elevenlabs_request("21m00Tcm4TlvDq8ikWAM", {"output_format": "pcm_16000"},
                                              {"text": "Hi."}, ONE_MODEL, VOICES, 1000)
    s.configure(**{k: getattr(config, k) for k in ("voice", "format", "language")})
    protocols = [openai(tokenizer), ElevenLabsSpeech(s, text, output, timestamps=False, streamed=True)]
    s = session(tokenizer)
    text, model, config = parse_rest_request({}, {"text": "Hi."}, ONE_MODEL, VOICES)
    s.configure(voice=config.voice, format=config.format)
    protocols.append(DeepgramSpeech(s, text, model, config.format))
    bodies = []
    for proto in protocols:
        ctx, _ = started(proto)
        (answer,) = [a for a in proto.engine_event(ContextFailed(ctx, "engine_full", "all slots busy"))
                     if isinstance(a, Respond)]
        assert answer.status == 503 and answer.error == "engine_full"
        bodies.append(json.loads(answer.body))
    assert bodies[0]["error"]["code"] == "engine_full"
    assert bodies[1] == {"detail": {"status": "engine_full", "message": "all slots busy"}}
    assert bodies[2]["err_code"] == "engine_full" and bodies[2]["request_id"] == protocols[2].request_id


def test_an_http_request_opens_its_context_before_its_text_is_tokenized(tokenizer):
    """start() hands the engine the open alone, speak() the whole text's ids and its end: the engine opens the slot
    while the worker tokenizes. A start that fails answers in the API's shape and leaves speak() nothing to do."""
    proto = openai(tokenizer, response_format="pcm")
    assert proto.start() == []
    (opened,) = proto.engine_commands()
    assert isinstance(opened, OpenContext)
    assert proto.speak() == []
    append, end = proto.engine_commands()
    assert isinstance(append, AppendText) and isinstance(end, EndText)
    assert {append.context, end.context} == {opened.context}
    assert append.ids + end.ids == tuple(StreamingTokenizer(tokenizer).whole("Hello there."))

    proto = openai(tokenizer, response_format="pcm")
    proto.session.close()                                   # the session no longer takes contexts
    (answer,) = proto.start()
    assert isinstance(answer, Respond) and answer.status == 400 and answer.error == "session_closing"
    assert proto.speak() == [] and proto.engine_commands() == []


def test_openai_streams_then_a_failure_ends_the_body(tokenizer):
    proto = openai(tokenizer, response_format="pcm")
    ctx, _ = started(proto)
    out = proto.engine_event(AudioChunk(ctx, pcm(0), 0, 1, 0.0))
    assert isinstance(out[0], Begin) and out[0].content_type == "audio/pcm" and isinstance(out[1], Send)
    out = proto.engine_event(ContextFailed(ctx, "engine_error", "boom"))
    assert out == [Close(1011, "engine_error", error="engine_error")]     # a truncated body: the client sees it

    proto = openai(tokenizer, response_format="pcm", stream_format="sse")
    ctx, _ = started(proto)
    proto.engine_event(AudioChunk(ctx, pcm(0), 0, 1, 0.0))
    send, close = proto.engine_event(ContextFailed(ctx, "engine_error", "boom"))
    assert json.loads(send.data.decode()[6:]) == {"type": "error", "error": {"message": "boom", "type": "server_error",
                                                                             "code": "engine_error"}}
    assert close == Close(1000, "engine_error")


def test_openai_whole_file_at_the_end(tokenizer):
    proto = openai(tokenizer, response_format="wav", stream=False)
    ctx, _ = started(proto)
    assert proto.engine_event(AudioChunk(ctx, pcm(0), 0, 1, 0.0)) == []
    (answer,) = [a for a in proto.engine_event(ContextDone(ctx, "length_rule", 1)) if isinstance(a, Respond)]
    assert answer.status == 200 and answer.content_type == "audio/wav" and len(answer.body) == 44 + 1920 * 2


def test_elevenlabs_with_timestamps_whole_and_streamed(tokenizer):
    for streamed in (False, True):
        s = session(tokenizer)
        text, config, output = elevenlabs_request("21m00Tcm4TlvDq8ikWAM", {"output_format": "pcm_24000"},
                                                  {"text": "Hi there."}, ONE_MODEL, VOICES, 1000)
        s.configure(**{k: getattr(config, k) for k in ("voice", "format", "language")})
        proto = ElevenLabsSpeech(s, text, output, timestamps=True, streamed=streamed)
        ctx, _ = started(proto)
        out = proto.engine_event(AudioChunk(ctx, pcm(0), 0, 1, 0.0))
        out += proto.engine_event(ContextDone(ctx, "length_rule", 1))
        if streamed:
            lines = [json.loads(a.data) for a in out if isinstance(a, Send)]
            chars = "".join(c for line in lines if line["alignment"] for c in line["alignment"]["characters"])
            assert chars == "Hi there." and lines[-1]["audio_base64"] == ""      # the rest, at the end
            assert lines[-1]["alignment"]["character_start_times_seconds"][-1] == 0.08
        else:
            (answer,) = [a for a in out if isinstance(a, Respond)]
            whole = json.loads(answer.body)
            assert len(base64.b64decode(whole["audio_base64"])) == 1920 * 2
            assert "".join(whole["alignment"]["characters"]) == "Hi there."


def test_cartesia_and_deepgram_requests_refused_in_their_terms(tokenizer):
    for body, code in (({"transcript": "Hi.", "voice": {"mode": "embedding", "embedding": [0.1]},
                         "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 16000}},
                        "invalid_voice"),
                       ({"transcript": "Hi.", "voice": "ryan", "output_format": {"container": "wav",
                                                                                "encoding": "pcm_mulaw",
                                                                                "sample_rate": 8000}},
                        "invalid_output_format"),
                       ({"transcript": "Hi.", "voice": "ryan", "output_format": {"container": "mp3",
                                                                                "sample_rate": 24000,
                                                                                "bit_rate": 1000}},
                        "invalid_output_format"),
                       ({"transcript": " ", "voice": "ryan"}, "invalid_request")):
        with pytest.raises(SessionError) as e:
            cartesia_request(body, ONE_MODEL, VOICES, 1000, events=False)
        assert e.value.code == code, body
    for query, code in (({"encoding": "pcm"}, "UNSUPPORTED_ENCODING"),
                        ({"encoding": "linear16", "sample_rate": "44100"}, "UNSUPPORTED_SAMPLE_RATE"),
                        ({"encoding": "mulaw", "container": "wav"}, "UNSUPPORTED_CONTAINER"),
                        ({"encoding": "mp3", "bit_rate": "64000"}, "UNSUPPORTED_BIT_RATE"),
                        ({"encoding": "flac", "bit_rate": "64000"}, "UNSUPPORTED_BIT_RATE")):
        with pytest.raises(SessionError) as e:
            parse_rest_query(query)
        assert e.value.code == code, query
    assert parse_rest_query({}).encoding == "mp3" and parse_rest_query({}).bitrate == 48000
    assert parse_rest_query({"encoding": "linear16"}).encoding == "wav"


def test_deepgram_errors_before_the_request_is_parsed_have_a_request_id():
    """Deepgram's error always names its request; one refused before its translator was made (a bad body or query,
    a key) said "request_id": null, which no Deepgram answer holds: now an id of its own, as DashScope's."""
    from talkgate.sessions.deepgram import rest_error

    first, second = (json.loads(rest_error(400, "INVALID_REQUEST", "no text").body) for _ in range(2))
    assert set(first) == {"err_code", "err_msg", "request_id"}
    assert isinstance(first["request_id"], str) and len(first["request_id"]) == 36
    assert first["request_id"] != second["request_id"]
    assert json.loads(rest_error(400, "INVALID_REQUEST", "no text", "r1").body)["request_id"] == "r1"


def test_cartesia_errors_before_the_request_is_parsed_have_a_request_id():
    """As Deepgram's: a Cartesia HTTP error refused before its translator was made said "request_id": null."""
    from talkgate.sessions.cartesia import http_error

    first, second = (json.loads(http_error(400, "invalid_request", "no transcript").body) for _ in range(2))
    assert isinstance(first["request_id"], str) and first["request_id"] != second["request_id"]
    assert json.loads(http_error(400, "invalid_request", "no transcript", "r1").body)["request_id"] == "r1"


def test_cartesia_sse_failure_after_audio_is_an_error_event(tokenizer):
    text, config, own = cartesia_request({"transcript": "Hi.", "voice": "ryan", "context_id": "c9",
                                          "output_format": {"container": "raw", "encoding": "pcm_s16le",
                                                            "sample_rate": 24000}},
                                         ONE_MODEL, VOICES, 1000, events=True)
    s = session(tokenizer)
    s.configure(**config)
    proto = CartesiaSpeech(s, text, config["format"], True, **own)
    ctx, _ = started(proto)
    proto.engine_event(AudioChunk(ctx, pcm(0), 0, 1, 0.0))
    send, close = proto.engine_event(ContextFailed(ctx, "engine_error", "boom"))
    event = json.loads(send.data.decode().split("data: ")[1])
    assert event["type"] == "error" and event["error_code"] == "engine_error" and event["status_code"] == 500
    assert event["context_id"] == "c9" and close == Close(1000, "engine_error")


# ----- DashScope's Qwen TTS over HTTP -----
def dashscope(tokenizer, streamed: bool, kept: list | None = None, **given):
    from dataclasses import replace

    from talkgate.sessions import dashscope_http
    body = {"model": "qwen3-tts-flash", "input": {"text": "Hello there.", **given}, "parameters": {"stream": streamed}}
    text, _, config = dashscope_http.parse_request(body, ONE_MODEL, VOICES, 1000)
    fmt = dashscope_http.STREAM_FORMAT if streamed else dashscope_http.FILE_FORMAT
    s = Session(INFO, Limits(), lambda: StreamingTokenizer(tokenizer), replace(config, format=fmt))

    def keep(wav: bytes):
        kept.append(wav)
        return "audio_kept", "http://host/api/v1/audio/audio_kept.wav", 1234

    return dashscope_http.DashScopeSpeech(s, text, streamed, None if streamed else keep)


def sse_events(actions) -> list[tuple[str, dict]]:
    """(event, data) of each server-sent event in the actions' bodies."""
    out = []
    for a in actions:
        if isinstance(a, Send):
            fields = dict(line.split(":", 1) for line in a.data.decode().strip().split("\n") if not line.startswith(":"))
            out.append((fields["event"], json.loads(fields["data"])))
    return out


def test_dashscope_http_streamed_events_and_whole_answer(tokenizer):
    proto = dashscope(tokenizer, streamed=True, voice="Ethan", language_type="English")
    assert proto.session.defaults.voice == "ryan" and proto.session.defaults.language == "english"
    ctx, _ = started(proto)
    out = proto.engine_event(AudioChunk(ctx, pcm(0), 0, 1, 0.0))
    assert isinstance(out[0], Begin) and out[0].content_type == "text/event-stream"
    out += proto.engine_event(ContextDone(ctx, "length_rule", 1))
    events = sse_events(out)
    assert [e for e, _ in events] == ["result", "result"] and isinstance(out[-1], Close) and out[-1].code == 1000
    first, last = events[0][1], events[1][1]
    assert first["output"]["finish_reason"] == "null" and len(base64.b64decode(first["output"]["audio"]["data"])) \
        == 1920 * 2
    assert last["output"] == {"finish_reason": "stop", "audio": {"data": "", "id": first["output"]["audio"]["id"],
                                                                 "expires_at": 0, "url": ""}}
    assert last["usage"] == {"characters": len("Hello there.")} and last["request_id"] == proto.request_id
    assert out[1].data.startswith(b"id:1\nevent:result\n:HTTP_STATUS/200\ndata:")

    kept: list = []
    proto = dashscope(tokenizer, streamed=False, kept=kept)
    ctx, _ = started(proto)
    assert proto.engine_event(AudioChunk(ctx, pcm(0), 0, 1, 0.0)) == []
    (answer,) = [a for a in proto.engine_event(ContextDone(ctx, "length_rule", 1)) if isinstance(a, Respond)]
    assert answer.status == 200 and answer.content_type == "application/json"
    assert kept[0][:4] == b"RIFF" and len(kept[0]) == 44 + 1920 * 2
    assert json.loads(answer.body)["output"] == {"finish_reason": "stop", "audio": {
        "data": "", "id": "audio_kept", "expires_at": 1234, "url": "http://host/api/v1/audio/audio_kept.wav"}}


def test_dashscope_http_errors_in_dashscope_shape(tokenizer):
    from talkgate.sessions import dashscope_http
    for body, code in (([], "invalid_request"), ({"input": {"text": "Hi."}}, "invalid_request"),
                       ({"model": "qwen3-tts-flash", "input": {"text": "  "}}, "invalid_request"),
                       ({"model": "qwen3-tts-flash"}, "invalid_message"),
                       ({"model": "qwen3-tts-flash", "input": {"text": "Hi.", "voice": "Nobody"}}, "unknown_voice"),
                       ({"model": "qwen3-tts-flash", "input": {"text": "Hi.", "voice": 3}}, "invalid_message"),
                       ({"model": "nope", "input": {"text": "Hi."}}, "unknown_model"),
                       ({"model": "qwen3-tts-flash", "input": {"text": "x" * 1001}}, "text_too_long")):
        with pytest.raises(SessionError) as e:
            dashscope_http.parse_request(body, ONE_MODEL, VOICES, 1000)
        assert e.value.code == code, body
    text, model, config = dashscope_http.parse_request(
        {"model": "tiny", "input": {"text": "Hi.", "voice": "Dylan", "instructions": "Calm."}, "parameters": {}},
        ONE_MODEL, VOICES, 1000)
    assert (text, model, config.voice, config.instructions, config.language) == ("Hi.", "tiny", "dylan", "Calm.", "auto")
    for status, code, expected in ((400, "unknown_voice", (400, "InvalidParameter")),
                                   (400, "unknown_model", (404, "ModelNotFound")),
                                   (401, "unauthorized", (401, "InvalidApiKey")),
                                   (503, "engine_full", (429, "Throttling.AllocationQuota")),
                                   (500, "engine_error", (500, "InternalError"))):
        answer = dashscope_http.http_error(status, code, "why", "r1")
        assert (answer.status, json.loads(answer.body)) == (expected[0], {"code": expected[1], "message": "why",
                                                                          "request_id": "r1"})
        assert answer.error == code
    # a failure after the stream began: an `event:error` whose status the SDK reads from `status:`
    proto = dashscope(tokenizer, streamed=True)
    ctx, _ = started(proto)
    proto.engine_event(AudioChunk(ctx, pcm(0), 0, 1, 0.0))
    send, close = proto.engine_event(ContextFailed(ctx, "engine_error", "boom"))
    assert b"\nevent:error\n:HTTP_STATUS/500\nstatus:500\n" in send.data and close == Close(1000, "engine_error")
    assert sse_events([send])[0][1] == {"code": "InternalError", "message": "boom", "request_id": proto.request_id}


def test_audio_files_expire_and_stay_within_their_bound(tmp_path):
    from talkgate.server.audio_files import AudioFiles
    files = AudioFiles(str(tmp_path), ttl_s=100, max_bytes=10)
    a, expires = files.put(b"12345", now=1000.0)
    assert expires == 1100 and files.path(f"{a}.wav", now=1050.0) == str(tmp_path / f"{a}.wav")
    assert files.path(f"{a}.wav", now=1e12) is None         # expired
    for bad in (f"{a}.mp3", "../x.wav", "audio_1234.wav", f"{a}"):
        assert files.path(bad) is None
    b, _ = files.put(b"123456", now=1001.0)                # over the bound: the oldest goes
    assert not (tmp_path / f"{a}.wav").exists() and (tmp_path / f"{b}.wav").exists()
    own = AudioFiles()
    c, _ = own.put(b"x")
    folder = own.root
    assert own.path(f"{c}.wav") is not None
    own.close()
    files.close()
    assert not __import__("os").path.exists(folder) and (tmp_path / f"{b}.wav").exists()


@pytest.mark.parametrize("route, shape, code", [
    ("elevenlabs", lambda d: d["detail"]["status"], "payload_too_large"),
    ("cartesia", lambda d: d["error_code"], "payload_too_large"), ("deepgram", lambda d: d["err_code"], "payload_too_large"),
    ("dashscope", lambda d: d["code"], "BadRequest.TooLarge")])
def test_a_body_over_the_limit_is_refused_in_each_apis_shape(route, shape, code):
    """A body over client_max_size (or a gzip body inflating past it) was aiohttp's 413 in talkgate's (OpenAI's)
    shape on every vendor route, the errors middleware's: now read_json's BodyTooLarge, answered by the route."""
    import asyncio
    from unittest import mock

    from aiohttp import streams
    from aiohttp.test_utils import make_mocked_request

    from talkgate.server.http_speech import read_json
    from talkgate.sessions import cartesia, dashscope_http, deepgram, elevenlabs

    errors = {"elevenlabs": elevenlabs.http_error, "cartesia": cartesia.http_error, "deepgram": deepgram.rest_error,
              "dashscope": dashscope_http.http_error}

    async def refused():
        body = b'{"text": "' + b"x" * 200 + b'"}'
        payload = streams.StreamReader(protocol=mock.Mock(_reading_paused=False), limit=2 ** 16, loop=asyncio.get_running_loop())
        payload.feed_data(body)
        payload.feed_eof()
        request = make_mocked_request("POST", "/", payload=payload, client_max_size=100,
                                      headers={"Content-Length": str(len(body))})
        with pytest.raises(SessionError) as e:
            await read_json(request, 1000, 5.0)
        return e.value

    e = asyncio.run(refused())
    answer = errors[route](e.status, e.code, e.message)
    assert (answer.status, shape(json.loads(answer.body))) == (413, code)
    assert "100 bytes" in e.message


@pytest.mark.parametrize("path, shape, code", [
    ("/v1/text-to-speech/ryan/stream", lambda d: d["detail"]["status"], "bad_request"),
    ("/tts/sse", lambda d: d["error_code"], "bad_request"), ("/v1/speak", lambda d: d["err_code"], "bad_request"),
    ("/api/v1/services/aigc/multimodal-generation/generation", lambda d: d["code"], "InvalidParameter"),
    ("/v1/audio/speech", lambda d: d["error"]["code"], "bad_request"), ("/nowhere", lambda d: d["error"]["code"],
                                                                        "bad_request"),
    # the vendors' WebSocket routes (asked without an upgrade) and DashScope's audio files; Twilio's and the native
    # socket are talkgate's own
    ("/v1/text-to-speech/ryan/multi-stream-input", lambda d: d["detail"]["status"], "bad_request"),
    ("/tts/websocket", lambda d: d["error_code"], "bad_request"), ("/v2/speak", lambda d: d["err_code"], "bad_request"),
    ("/api-ws/v1/realtime", lambda d: d["code"], "InvalidParameter"),
    ("/api/v1/audio/x.wav", lambda d: d["code"], "InvalidParameter"),
    ("/v1/twilio", lambda d: d["error"]["code"], "bad_request"), ("/v1/ws", lambda d: d["error"]["code"], "bad_request"),
    # the voice APIs: ElevenLabs' and Cartesia's voice routes in their shapes, OpenAI's in talkgate's
    ("/v1/voices/add", lambda d: d["detail"]["status"], "bad_request"),
    ("/v2/voices", lambda d: d["detail"]["status"], "bad_request"),
    ("/voices/clone", lambda d: (d["error_code"], d["title"]), ("bad_request", "Bad request")),
    ("/v1/audio/voices", lambda d: d["error"]["code"], "bad_request"),
    ("/v1/voicesx", lambda d: d["error"]["code"], "bad_request")])
def test_errors_before_a_handler_runs_are_in_the_shape_of_the_api_whose_path_it_is(path, shape, code):
    """aiohttp's own refusals (a body it cannot decode, say Content-Encoding br without Brotli; a method the route
    does not take; a WebSocket route asked without an upgrade) come before the handler's own answers: on a vendor
    API's path they are in that API's shape, elsewhere in talkgate's (OpenAI's); the headers aiohttp gives (Allow) are
    kept."""
    from aiohttp import web

    from talkgate.server import compat_http, compat_ws, voices_http
    from talkgate.server.errors import error_for, shaped_error

    app = web.Application()
    for module in (compat_http, compat_ws, voices_http):
        module.add_routes(app)
    answer = shaped_error(error_for(app), path, 400, "Can not decode content-encoding: br", {"Allow": "POST"})
    assert answer.status == 400 and answer.headers["Allow"] == "POST"
    assert shape(json.loads(answer.body)) == code
    assert answer.code in (code, "bad_request")
