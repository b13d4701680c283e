"""The voice endpoints: cloned voices stored (server/voice_store.py) and listed, in each API's own shape.

    POST   /v1/audio/voices            OpenAI / vLLM-Omni: multipart audio_sample, name, consent, ref_text
                                       (every create endpoint: `model`, the Base model that makes it)
    GET    /v1/audio/voices            the models' voices and the stored ones (?model=NAME: those NAME speaks)
    GET    /v1/audio/voices/{id}       DELETE /v1/audio/voices/{id}     (by id or name)
    POST   /v1/voices/add              ElevenLabs instant voice cloning: multipart files (one or more), name,
                                       description, labels
    GET    /v1/voices, /v2/voices, /v1/voices/{id}, DELETE /v1/voices/{id}
    POST   /voices/clone               Cartesia: multipart clip, name, language, description
    GET    /voices, /voices/{id}, DELETE /voices/{id}
    GET    /v1/models                  Deepgram: the voices as TTS models (for Deepgram's clients: compat_http.models)

An upload: the form read with bounds (one file of at most 10 MB; ElevenLabs' files together), the audio
decoded and checked on a worker thread (sessions/reference_audio.py: 1-30 s, not silent, mono 24 kHz), the
name claimed in the store (409 at once if it is taken or being created), the voice made by the engine (one
MakeVoice, engine_client.py), then written durably: the answer comes once every process sees the voice.
Nothing is stored when any step fails. API keys apply as everywhere (Gateway.authorized).

Tenants (docs/voices.md): a voice belongs to the tenant of the key that stored it. A client lists, reads and
speaks its tenant's voices and those an admin shared (form field `shared=true` on any of the three create
endpoints, admin keys only); an admin sees every voice. Any other voice is answered exactly as an id or name
that was never stored. Only its tenant's keys or an admin delete a voice. A tenant holds at most its key's limit
`voices` (keys file): the store's MAX_VOICES are shared by every tenant. Creations and deletions go to the audit
log (server/audit.py) with the key id, tenant and consent.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from talkgate.server.errors import ErrorResponse, add_route
from talkgate.server.gateway import IDENTITY
from talkgate.server.http_speech import BodyTimeout, arriving
from talkgate.server.keys import Identity
from talkgate.server.voice_store import StoredVoice, StoreError
from talkgate.sessions.actions import http_status
from talkgate.sessions.fields import SessionError
from talkgate.sessions.reference_audio import MAX_BYTES, AudioError, check_ref_text, join, read_clip
from talkgate.synth.api import EngineError

log = logging.getLogger("talkgate.voices")
MAKE_TIMEOUT_S = 60.0           # the engine's answer to one MakeVoice
MAX_MAKING = 8                  # uploads being decoded and made at once per process; more: 503, try again
MAX_PARTS = 16                  # parts of one multipart form
MAX_FILES = 8                   # ElevenLabs' `files` of one voice
MAX_FIELD_BYTES = 16 * 1024     # a text field of the form
MAX_CONSENT_CHARS = 256
PAGE_SIZE = 10                  # ElevenLabs /v2/voices and Cartesia /voices pages: default ...
MAX_PAGE = 100                  # ... and most


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class Upload:
    field: str
    filename: str | None
    content_type: str | None
    data: bytes


@dataclass
class Form:
    fields: dict
    files: list


# ----- reading an upload -----
async def read_form(request: web.Request, file_fields: tuple[str, ...]) -> Form:
    """The multipart form, bounded: files (parts with a filename, or named in file_fields) of MAX_BYTES
    together, text fields of MAX_FIELD_BYTES, MAX_PARTS parts; each read waits at most the idle timeout for the
    client's next bytes (BodyTimeout: a client that stops sending mid-upload would hold its connection)."""
    arrives = partial(arriving, request, request.app["gateway"].limits.idle_timeout_s)
    if request.content_type == "application/x-www-form-urlencoded":    # fields only (the body limit holds)
        try:
            return Form({k: v for k, v in (await arrives(request.post())).items() if isinstance(v, str)}, [])
        except (ValueError, UnicodeDecodeError):
            raise Refused(400, "invalid_body", "the form cannot be read") from None
    if request.content_type != "multipart/form-data":
        raise Refused(415, "unsupported_media_type", f"send the voice as multipart/form-data (the audio file in "
                      f"{' or '.join(repr(f) for f in file_fields)}), not {request.content_type}")
    if request.content_length is not None and request.content_length > MAX_BYTES + MAX_PARTS * MAX_FIELD_BYTES:
        raise Refused(413, "audio_too_large", f"the upload is {request.content_length} bytes; the audio may be at "
                      f"most {MAX_BYTES} bytes ({MAX_BYTES >> 20} MB)")
    fields, files, budget = {}, [], MAX_BYTES
    try:
        reader = await request.multipart()
        for _ in range(MAX_PARTS + 1):
            part = await arrives(reader.next())
            if part is None:
                return Form(fields, files)
            if not hasattr(part, "read_chunk"):
                raise Refused(400, "invalid_body", "nested multipart parts are not accepted")
            if part.filename is not None or part.name in file_fields:
                data = await _read_part(part, arrives, budget, 413, "audio_too_large",
                                        f"the audio may be at most {MAX_BYTES} bytes ({MAX_BYTES >> 20} MB) in all")
                budget -= len(data)
                files.append(Upload(part.name or "", part.filename, part.headers.get("Content-Type"), data))
            else:
                data = await _read_part(part, arrives, MAX_FIELD_BYTES, 400, "field_too_long",
                                        f"the field {part.name!r} is over {MAX_FIELD_BYTES} bytes")
                try:
                    fields[part.name or ""] = data.decode(part.get_charset("utf-8"))
                except (LookupError, UnicodeDecodeError):
                    raise Refused(400, "invalid_body", f"the field {part.name!r} is not text in its charset") from None
        raise Refused(400, "invalid_body", f"the form has over {MAX_PARTS} parts")
    except (ValueError, AssertionError, KeyError, HttpProcessingError, RequestPayloadError) as e:
        raise Refused(400, "invalid_body", f"the multipart body cannot be read: {e}") from None


async def _read_part(part, arrives, limit: int, status: int, code: str, message: str) -> bytes:
    chunks, n = [], 0
    while chunk := await arrives(part.read_chunk(1 << 16)):
        n += len(chunk)
        if n > limit:
            raise Refused(status, code, message)
        chunks.append(chunk)
    return b"".join(chunks)


def _field(form: Form, *names: str, limit: int | None = None) -> str | None:
    for name in names:
        value = form.fields.get(name)
        if value is not None and value.strip():
            if limit is not None and len(value) > limit:
                raise Refused(400, "field_too_long", f"{name} is at most {limit} characters")
            return value.strip()
    return None


# ----- making a voice -----
async def make_voice(request: web.Request, form: Form, name: object, files: list[Upload], ref_text: object = None,
                     api: str = "talkgate", **meta) -> tuple[StoredVoice, dict]:
    """Decode, claim the name among the client's tenant's, make and store a voice of that tenant -> (the voice,
    where the time went in ms); raises Refused, StoreError, AudioError, SessionError or EngineError, having
    stored nothing."""
    gw = request.app["gateway"]
    who: Identity = request[IDENTITY]
    shared = (_field(form, "shared") or "false").lower()
    if shared not in ("true", "false"):
        raise Refused(400, "invalid_shared", "shared is true or false")
    if shared == "true" and not who.admin:
        raise Refused(403, "forbidden", "only an admin key shares a voice with every tenant")
    if gw.draining:
        raise Refused(503, "shutting_down", "the server is shutting down")
    maker = gw.models.maker(_field(form, "model", "model_id"))   # the one named, else the first Base model
    info = maker.info
    if not files:
        raise Refused(400, "missing_audio", "the voice needs an audio file (1-30 s of the voice: WAV, FLAC, Ogg or MP3)")
    if len(files) > MAX_FILES:
        raise Refused(400, "too_many_files", f"at most {MAX_FILES} audio files make one voice")
    ref_text = check_ref_text(ref_text)
    if gw.voices_making >= MAX_MAKING:
        raise Refused(503, "busy", f"{MAX_MAKING} voices are being made on this server; try again in a moment")
    loop = asyncio.get_running_loop()
    gw.voices_making += 1
    making = gw.voices_making_of
    making[who.tenant] = making.get(who.tenant, 0) + 1
    try:
        cap = who.limits.get("voices")
        if cap is not None:     # the tenant's voices stored and being made here (this one too) within its cap
            held = await asyncio.to_thread(gw.store.count_of, who.tenant) + making[who.tenant] - 1
            if held >= cap:
                raise Refused(400, "voice_limit_reached", f"this key's tenant holds {held} voices, its limit: "
                              "delete one first")
        t0 = loop.time()
        clip = await asyncio.to_thread(_decode, files)
        t1 = loop.time()
        with gw.store.claim(name, who.tenant) as claim:
            prompt = await gw.client.make_voice(clip.samples.tobytes(), ref_text, MAKE_TIMEOUT_S,
                                                None if maker is gw.models.default else maker.name)
            t2 = loop.time()
            source = {**clip.describe(), "files": [f.filename for f in files]}
            # voice_key: the models it is valid on (synth/api.py ModelInfo.speaks)
            model = {"name": info.name, "model_type": info.model_type, "size": info.size, "dim": prompt.dim,
                     "untrained": info.untrained, "voice_key": info.voice_key, "served_as": maker.name}
            voice = await asyncio.to_thread(claim.save, prompt, source=source, model=model, api=api,
                                            key_id=who.key_id, shared=shared == "true", **meta)
        t3 = loop.time()
    finally:
        gw.voices_making -= 1
        making[who.tenant] -= 1
        if not making[who.tenant]:
            del making[who.tenant]
    timing = {"decode_ms": round(1000 * (t1 - t0), 1), "engine_ms": round(1000 * (t2 - t1), 1),
              "store_ms": round(1000 * (t3 - t2), 1)}
    log.info("voice %s (%r, %s, %.2f s of audio) stored: %s", voice.id, voice.name, voice.mode, clip.seconds, timing)
    gw.audit.record("voice_created", voice=voice.id, name=voice.name, tenant=voice.tenant, key_id=who.key_id,
                    consent=voice.consent, api=api, shared=voice.shared)
    return voice, timing


def _decode(files: list[Upload]):
    clips = [read_clip(f.data, f"the audio file {f.filename!r}" if f.filename else "the audio") for f in files]
    return join(clips)


def refusal(e: Exception) -> tuple[int, str, str]:
    """(HTTP status, code, message) of a refused upload or lookup."""
    if isinstance(e, (Refused, StoreError, AudioError)):
        return e.status, e.code, e.message
    if isinstance(e, SessionError):
        return e.status or 400, e.code, e.message
    if isinstance(e, EngineError):
        return http_status(e.code), e.code, e.message
    raise e


async def _guarded(request: web.Request, handler, error):
    """Run handler(request) with the API key checked; a refusal answered by error(status, code, message)."""
    gw = request.app["gateway"]
    if not gw.authorized(request):
        return error(401, "unauthorized", "a valid API key is required")
    try:
        return await handler(request)
    except (Refused, StoreError, AudioError, SessionError, EngineError) as e:
        response = error(*refusal(e))
        if isinstance(e, BodyTimeout):      # the rest of the body is not read
            response.force_close()
        return response


def _builtin(gw) -> tuple[str, ...]:
    return gw.models.voices()              # every served model's


async def _stored(request: web.Request) -> list[StoredVoice]:
    """The stored voices this server speaks to the client: its tenant's and the shared ones when a Base model is
    served, none otherwise; with `?model=NAME`, those valid on that model (the web page's list). Read on a worker
    thread (the first listing of a full store parses 1000 files)."""
    gw = request.app["gateway"]
    name = request.query.get("model")
    model = gw.models.named(name) if name else None
    if gw.models.cloner is None or (model is not None and not model.info.clones):
        return []
    voices = await asyncio.to_thread(gw.store.list, request[IDENTITY])
    return voices if model is None else [v for v in voices if model.info.speaks(v.model)]


def _lookup(request: web.Request, key: str) -> StoredVoice | str | None:
    """A voice of the model (its name) or a stored voice it speaks to the client, by id or name."""
    gw = request.app["gateway"]
    if key.lower() in _builtin(gw):
        return key.lower()
    return gw.store.get(key, request[IDENTITY]) if gw.models.cloner is not None else None


async def _delete(request: web.Request, key: str, error_404: str) -> StoredVoice:
    gw, who = request.app["gateway"], request[IDENTITY]
    if key.lower() in _builtin(gw):
        raise Refused(400, "builtin_voice", f"{key!r} is a voice of the model; only stored voices can be deleted")
    voice = _lookup(request, key)
    if voice is not None and not voice.deletable_by(who):       # a shared voice of another tenant: seen, not owned
        raise Refused(403, "forbidden", f"the voice {key!r} is shared with you; only its owner or an admin deletes it")
    deleted = await asyncio.to_thread(gw.store.delete, voice.id) if voice is not None else None
    if deleted is None:
        raise Refused(404, error_404, f"no voice {key!r}")
    log.info("voice %s (%r) deleted", deleted.id, deleted.name)
    gw.audit.record("voice_deleted", voice=deleted.id, name=deleted.name, tenant=deleted.tenant, key_id=who.key_id,
                    by_tenant=who.tenant, consent=deleted.consent)
    return deleted


# ----- OpenAI / native: /v1/audio/voices -----
def _openai_error(status: int, code: str, message: str) -> web.Response:
    return ErrorResponse(status, code, message)


def openai_voice(v: StoredVoice | str) -> dict:
    if isinstance(v, str):
        return {"id": v, "object": "audio.voice", "name": v, "type": "builtin"}
    return {**v.public(), "object": "audio.voice", "type": "cloned"}


async def _openai_create(request: web.Request) -> web.Response:
    form = await read_form(request, ("audio_sample", "file", "audio"))
    consent = _field(form, "consent", limit=MAX_CONSENT_CHARS)
    if consent is None:
        raise Refused(400, "missing_consent", "consent is required: a reference to the speaker's consent to clone "
                      "their voice (stored with the voice)")
    voice, timing = await make_voice(request, form, _field(form, "name"), form.files, _field(form, "ref_text", "reference_text"),
                                     api="openai", consent=consent,
                                     description=_field(form, "description", "speaker_description") or "",
                                     language=_field(form, "language"))
    return web.json_response({**openai_voice(voice), "timing": timing})


async def _openai_list(request: web.Request) -> web.Response:
    gw = request.app["gateway"]
    info = gw.client.info
    voices = [openai_voice(v) for v in (*_builtin(gw), *await _stored(request))]
    return web.json_response({"object": "list", "voices": voices, "languages": list(info.languages),
                              "model": info.as_dict()})


async def _openai_get(request: web.Request) -> web.Response:
    voice = _lookup(request, request.match_info["voice"])
    if voice is None:
        raise Refused(404, "voice_not_found", f"no voice {request.match_info['voice']!r}")
    return web.json_response(openai_voice(voice))


async def _openai_delete(request: web.Request) -> web.Response:
    voice = await _delete(request, request.match_info["voice"], "voice_not_found")
    return web.json_response({"id": voice.id, "object": "audio.voice.deleted", "deleted": True})


# ----- ElevenLabs -----
def _elevenlabs_error(status: int, code: str, message: str) -> web.Response:
    # the SDKs retry a 409 (as a 429 or 5xx), re-sending an upload's form without its parts: a name taken is a 400
    status = 400 if status == 409 else status
    response = web.json_response({"detail": {"status": code, "message": message}}, status=status)
    response.code = code            # counted by the errors middleware
    return response


def elevenlabs_voice(v: StoredVoice | str) -> dict:
    if isinstance(v, str):
        return {"voice_id": v, "name": v, "category": "premade", "description": "", "labels": {}, "samples": None,
                "settings": None, "preview_url": None, "available_for_tiers": [], "high_quality_base_model_ids": [],
                "is_owner": False}
    labels = dict(v.labels)
    if v.language and "language" not in labels:
        labels["language"] = v.language
    return {"voice_id": v.id, "name": v.name, "category": "cloned", "description": v.description, "labels": labels,
            "samples": None, "settings": None, "preview_url": None, "available_for_tiers": [],
            "high_quality_base_model_ids": [], "is_owner": True, "created_at_unix": int(v.created_at)}


async def _elevenlabs_add(request: web.Request) -> web.Response:
    form = await read_form(request, ("files", "files[]"))
    labels = {}
    raw = _field(form, "labels")
    if raw is not None and raw != "null":
        try:
            labels = json.loads(raw)
        except ValueError:
            raise Refused(400, "invalid_labels", "labels must be a JSON object of strings") from None
        if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in labels.items()):
            raise Refused(400, "invalid_labels", "labels must be a JSON object of strings")
    voice, _ = await make_voice(request, form, _field(form, "name"), form.files, api="elevenlabs", labels=labels,
                                description=_field(form, "description") or "", language=labels.get("language"))
    return web.json_response({"voice_id": voice.id, "requires_verification": False})


async def _elevenlabs_all(request: web.Request) -> list[dict]:
    return [elevenlabs_voice(v) for v in (*_builtin(request.app["gateway"]), *await _stored(request))]


async def _elevenlabs_list(request: web.Request) -> web.Response:
    return web.json_response({"voices": await _elevenlabs_all(request)})


async def _elevenlabs_search(request: web.Request) -> web.Response:
    """GET /v2/voices: search (name or description), voice_type, category, page_size, next_page_token."""
    q = request.query
    voices = await _elevenlabs_all(request)
    search = q.get("search", "").lower()
    if search:
        voices = [v for v in voices if search in v["name"].lower() or search in (v["description"] or "").lower()]
    kind = q.get("voice_type") or ""
    if kind in ("personal", "non-default", "non-community", "saved", "workspace"):
        voices = [v for v in voices if v["category"] == "cloned"]
    elif kind == "default":
        voices = [v for v in voices if v["category"] == "premade"]
    if q.get("category"):
        voices = [v for v in voices if v["category"] == q["category"]]
    size, start = _page_args(q.get("page_size"), q.get("next_page_token") or "0")
    page = voices[start:start + size]
    more = start + size < len(voices)
    return web.json_response({"voices": page, "has_more": more, "total_count": len(voices),
                              "next_page_token": str(start + size) if more else None})


def _page_args(size: str | None, offset: str) -> tuple[int, int]:
    if not (size or str(PAGE_SIZE)).isdecimal() or not 1 <= int(size or PAGE_SIZE) <= MAX_PAGE:
        raise Refused(400, "invalid_page_size", f"page_size must be an integer from 1 to {MAX_PAGE}")
    if not offset.isdecimal():
        raise Refused(400, "invalid_page_token", "next_page_token is not one this server gave")
    return int(size or PAGE_SIZE), int(offset)


async def _elevenlabs_get(request: web.Request) -> web.Response:
    voice = _lookup(request, request.match_info["voice_id"])
    if voice is None:
        raise Refused(404, "voice_not_found", f"A voice with voice_id {request.match_info['voice_id']!r} was not found")
    return web.json_response(elevenlabs_voice(voice))


async def _elevenlabs_delete(request: web.Request) -> web.Response:
    await _delete(request, request.match_info["voice_id"], "voice_not_found")
    return web.json_response({"status": "ok"})


# ----- Cartesia -----
def _cartesia_error(status: int, code: str, message: str) -> web.Response:
    status = 400 if status == 409 else status       # as ElevenLabs' (the SDK retries a 409)
    response = web.json_response({"title": code.replace("_", " ").capitalize(), "message": message,
                                  "error_code": code, "status_code": status}, status=status,
                                 headers={"x-should-retry": "false"} if status < 500 else None)
    response.code = code
    return response


ISO = {"english": "en", "chinese": "zh", "japanese": "ja", "korean": "ko", "german": "de", "french": "fr",
       "russian": "ru", "portuguese": "pt", "spanish": "es", "italian": "it"}


def cartesia_voice(v: StoredVoice | str, metadata: bool = False) -> dict:
    if isinstance(v, str):
        return {"id": v, "name": v, "description": "", "tagline": "", "language": "en", "created_at": _iso(0),
                "is_owner": False, "is_public": True, "access": "public", "visibility": "all",
                "locales": [{"locale": "en-US", "is_native": True}], "user_id": None}
    language = v.language or "en"
    out = {"id": v.id, "name": v.name, "description": v.description, "tagline": "", "language": language,
           "created_at": _iso(v.created_at), "user_id": "talkgate", "is_public": False, "access": "private",
           "visibility": "owner"}
    if not metadata:
        out.update(is_owner=True, locales=[{"locale": language, "is_native": True}])
    return out


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


async def _cartesia_clone(request: web.Request) -> web.Response:
    form = await read_form(request, ("clip",))
    language = _field(form, "language")
    if language is not None and (len(language) > 16 or not language.replace("-", "").replace("_", "").isalnum()):
        raise Refused(400, "invalid_language", "language must be a language code such as en")
    voice, _ = await make_voice(request, form, _field(form, "name"), form.files, api="cartesia",
                                description=_field(form, "description") or "", language=language or "en")
    return web.json_response(cartesia_voice(voice, metadata=True))


async def _cartesia_list(request: web.Request) -> web.Response:
    """GET /voices: q, is_owner, limit, starting_after / ending_before (a voice id): one page of `data`."""
    gw, q = request.app["gateway"], request.query
    voices = [cartesia_voice(v) for v in (*_builtin(gw), *await _stored(request))]
    if q.get("q"):
        needle = q["q"].lower()
        voices = [v for v in voices if needle in v["name"].lower() or needle in v["description"].lower()
                  or needle == v["id"].lower()]
    if q.get("is_owner") in ("true", "false"):
        voices = [v for v in voices if v["is_owner"] == (q["is_owner"] == "true")]
    size = _page_args(q.get("limit"), "0")[0]
    ids = [v["id"] for v in voices]
    if q.get("starting_after"):
        start = ids.index(q["starting_after"]) + 1 if q["starting_after"] in ids else len(ids)
        page = voices[start:start + size]
        more = start + size < len(voices)
    elif q.get("ending_before"):
        end = ids.index(q["ending_before"]) if q["ending_before"] in ids else 0
        page = voices[max(0, end - size):end]
        more = end - size > 0
    else:
        page, more = voices[:size], size < len(voices)
    return web.json_response({"data": page, "has_more": more, "next_page": page[-1]["id"] if more and page else None})


async def _cartesia_get(request: web.Request) -> web.Response:
    voice = _lookup(request, request.match_info["voice_id"])
    if voice is None:
        raise Refused(404, "voice_not_found", f"voice {request.match_info['voice_id']!r} not found")
    return web.json_response(cartesia_voice(voice))


async def _cartesia_delete(request: web.Request) -> web.Response:
    await _delete(request, request.match_info["voice_id"], "voice_not_found")
    return web.Response(status=204)


# ----- Deepgram -----
def _deepgram_error(status: int, code: str, message: str) -> web.Response:
    response = web.json_response({"err_code": code.upper(), "err_msg": message}, status=status)
    response.code = code
    return response


async def _deepgram_models(request: web.Request) -> web.Response:
    gw = request.app["gateway"]
    languages = [ISO.get(lang, lang) for lang in gw.client.info.languages if lang != "auto"]

    def model(name: str, uuid: str, extra: dict) -> dict:
        return {"name": name, "canonical_name": name, "architecture": "qwen3-tts", "languages": languages,
                "version": "talkgate", "uuid": uuid, "metadata": extra}
    tts = [model(v, v, {"category": "builtin"}) for v in _builtin(gw)]
    tts += [model(v.id, v.id, {"display_name": v.name, "category": "cloned"}) for v in await _stored(request)]
    return web.json_response({"stt": [], "tts": tts})


def _route(handler, error):
    async def route(request: web.Request) -> web.StreamResponse:
        return await _guarded(request, handler, error)
    return route


def add_routes(app: web.Application) -> None:
    for method, path, handler, error in (
            ("POST", "/v1/audio/voices", _openai_create, _openai_error),
            ("GET", "/v1/audio/voices", _openai_list, _openai_error),
            ("GET", "/v1/audio/voices/{voice}", _openai_get, _openai_error),
            ("DELETE", "/v1/audio/voices/{voice}", _openai_delete, _openai_error),
            ("POST", "/v1/voices/add", _elevenlabs_add, _elevenlabs_error),
            ("GET", "/v1/voices", _elevenlabs_list, _elevenlabs_error),
            ("GET", "/v2/voices", _elevenlabs_search, _elevenlabs_error),
            ("GET", "/v1/voices/{voice_id}", _elevenlabs_get, _elevenlabs_error),
            ("DELETE", "/v1/voices/{voice_id}", _elevenlabs_delete, _elevenlabs_error),
            ("POST", "/voices/clone", _cartesia_clone, _cartesia_error),
            ("GET", "/voices", _cartesia_list, _cartesia_error),
            ("GET", "/voices/{voice_id}", _cartesia_get, _cartesia_error),
            ("DELETE", "/voices/{voice_id}", _cartesia_delete, _cartesia_error)):
        add_route(app, method, path, _route(handler, error), error)


# Deepgram's `GET /v1/models` (the path is ElevenLabs' model list too: server/compat_http.py's `models` chooses)
deepgram_models = _route(_deepgram_models, _deepgram_error)

