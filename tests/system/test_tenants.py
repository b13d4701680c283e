"""Tenants against a real `talkgate serve --keys FILE` (tiny Base checkpoint, CPU, supervisor and a worker): two
tenants on every clone API and every protocol that speaks a voice - another tenant's voice is answered exactly as
an id never stored (and in as long: the median times of both), lists hold only one's own, only the owner or an
admin deletes; a tenant's voice cap; admin endpoints need an admin
key; the keys file reloaded (poll and SIGHUP): a malformed file keeps the keys in force and logs its line, a key
removed is refused while a session opened with it goes on; the audit log."""
from __future__ import annotations

import asyncio
import hashlib
import json
import random
import signal
import statistics
import time

import aiohttp
import pytest

from tests.serverproc import TalkgateServer
from tests.voicetools import audio_file, voice_form

TEXT = "Hello there, this is my voice."
KEYS = {"a": ("a-1", "acme", "user"), "a2": ("a-2", "acme", "user"), "b": ("b-1", "beta", "user"),
        "admin": ("ops-1", "ops", "admin"), "leaving": ("a-3", "acme", "user"), "c": ("c-1", "gamma", "user"),
        "c2": ("c-2", "gamma", "user")}
LIMITS = {"c": {"voices": 2}, "c2": {"voices": 2}}         # gamma may hold 2 voices in the store
SECRET = {name: f"secret-of-{name}" for name in KEYS}
NEVER_STORED = "voice_0123456789abcdef"


def keys_text(names) -> str:
    return "".join(json.dumps({"id": KEYS[n][0], "tenant": KEYS[n][1], "role": KEYS[n][2],
                               "sha256": hashlib.sha256(SECRET[n].encode()).hexdigest(),
                               "limits": LIMITS.get(n, {})}) + "\n" for n in names)


def run(coro, timeout: float = 240):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def bearer(name: str) -> dict:
    return {"Authorization": f"Bearer {SECRET[name]}"}


@pytest.fixture(scope="module")
def server(tiny_base_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("tenants")
    (root / "keys.jsonl").write_text(keys_text(KEYS))
    with TalkgateServer(tiny_base_checkpoint, "--keys", str(root / "keys.jsonl"), "--voice-store", str(root / "store"),
                        "--audit-log", str(root / "audit.jsonl"), "--seed", "1", "--workers", "1") as srv:
        srv.root = root
        yield srv


async def clone(http, url: str, api: str, key: str, name: str, **fields) -> tuple[int, dict]:
    """Store a voice through one clone API -> (status, body with its `id`)."""
    path, file_field = {"openai": ("/v1/audio/voices", "audio_sample"), "elevenlabs": ("/v1/voices/add", "files"),
                        "cartesia": ("/voices/clone", "clip")}[api]
    form = voice_form(name, audio_file(1.5, hash(name) % 100), file_field=file_field, **fields)
    async with http.post(url + path, data=form, headers=bearer(key)) as r:
        body = await r.json()
    if r.status == 200:
        body["id"] = body.get("id") or body.get("voice_id")
    return r.status, body


def same_shape(answer, voice_id: str):
    """An answer with the voice id asked for written as <id>, and a request id of its own (Deepgram's and DashScope's
    errors name one) as <request_id>: a foreign and an unknown id compare equal."""
    def masked(v):
        if isinstance(v, dict):
            return {k: "<request_id>" if k == "request_id" and isinstance(x, str) else masked(x) for k, x in v.items()}
        return [masked(x) for x in v] if isinstance(v, list) else v
    return masked(json.loads(json.dumps(answer).replace(voice_id, "<id>")))


async def speak_everywhere(http, url: str, key: str, voice_id: str) -> dict:
    """What each protocol answers when `key` speaks `voice_id`: "ok" (audio came) or its error, as the client sees it."""
    ws = url.replace("http", "ws", 1)
    out = {}
    async with http.ws_connect(f"{ws}/v1/ws") as s:          # the key in the first message
        await s.send_json({"type": "auth", "api_key": SECRET[key]})
        assert (await s.receive_json(timeout=30))["type"] == "session.ready"
        await s.send_json({"type": "context.start", "context_id": "c", "voice": voice_id, "fixed_frames": 3})
        await s.send_json({"type": "text", "context_id": "c", "text": TEXT})
        await s.send_json({"type": "flush", "context_id": "c"})
        while (m := await s.receive(timeout=60)).type == aiohttp.WSMsgType.TEXT and \
                json.loads(m.data)["type"] == "context.started":
            pass
        out["native"] = "ok" if m.type == aiohttp.WSMsgType.BINARY else json.loads(m.data)
    for name, path, body in (
            ("openai", "/v1/audio/speech", {"model": "tts-1", "input": TEXT, "voice": {"id": voice_id},
                                            "response_format": "pcm", "fixed_frames": 3}),
            ("elevenlabs_http", f"/v1/text-to-speech/{voice_id}?output_format=pcm_24000", {"text": TEXT}),
            ("cartesia_http", "/tts/bytes", {"model_id": "sonic", "transcript": TEXT, "voice": {"mode": "id", "id": voice_id},
                                             "output_format": {"container": "raw", "encoding": "pcm_s16le",
                                                               "sample_rate": 24000}}),
            ("deepgram_http", f"/v1/speak?model={voice_id}", {"text": TEXT})):
        async with http.post(url + path, json=body, headers=bearer(key)) as r:
            data = await r.read()
            out[name] = "ok" if r.status == 200 and data else (r.status, json.loads(data))
    async with http.ws_connect(f"{ws}/v1/text-to-speech/{voice_id}/stream-input?output_format=pcm_24000") as s:
        await s.send_json({"text": " ", "xi_api_key": SECRET[key]})       # ElevenLabs' key in the first message
        await s.send_json({"text": TEXT, "flush": True})
        m = await s.receive_json(timeout=60)
        out["elevenlabs_ws"] = "ok" if m.get("audio") else m
    async with http.ws_connect(f"{ws}/tts/websocket", headers={"X-API-Key": SECRET[key]}) as s:
        await s.send_json({"context_id": "k", "transcript": TEXT, "continue": False, "voice": {"mode": "id", "id": voice_id},
                           "output_format": {"container": "raw", "encoding": "pcm_f32le", "sample_rate": 24000}})
        m = await s.receive_json(timeout=60)
        out["cartesia_ws"] = "ok" if m["type"] == "chunk" else m
    async with http.ws_connect(f"{ws}/v1/speak?model={voice_id}", headers={"Authorization": f"Token {SECRET[key]}"}) as s:
        m = await s.receive(timeout=30)
        out["deepgram_ws"] = "ok" if m.type == aiohttp.WSMsgType.TEXT else (s.close_code, m.extra)
    try:
        async with http.ws_connect(f"{ws}/v2/speak?model={voice_id}", headers=bearer(key)):
            out["deepgram_v2"] = "ok"
    except aiohttp.WSServerHandshakeError as e:
        out["deepgram_v2"] = e.status
    async with http.ws_connect(f"{ws}/v1/twilio?stream_sid=MZ1", headers=bearer(key)) as s:
        await s.send_json({"type": "context.start", "context_id": "c", "voice": voice_id, "fixed_frames": 3})
        await s.send_json({"type": "text", "context_id": "c", "text": TEXT})
        await s.send_json({"type": "flush", "context_id": "c"})
        while (m := await s.receive_json(timeout=60)).get("type") in ("session.ready", "context.started"):
            pass
        out["twilio"] = "ok" if m.get("event") == "media" else m
    return same_shape(out, voice_id)


async def voice_api(http, url: str, key: str, method: str, api: str, voice_id: str):
    path = {"openai": "/v1/audio/voices/", "elevenlabs": "/v1/voices/", "cartesia": "/voices/"}[api] + voice_id
    async with http.request(method, url + path, headers=bearer(key)) as r:
        return same_shape((r.status, await r.text()), voice_id)


async def listed(http, url: str, key: str) -> dict[str, set]:
    out = {}
    for api, path, items, field in (("openai", "/v1/audio/voices", "voices", "id"), ("elevenlabs", "/v1/voices", "voices", "voice_id"),
                                    ("elevenlabs_v2", "/v2/voices?page_size=100", "voices", "voice_id"),
                                    ("cartesia", "/voices?limit=100", "data", "id")):
        async with http.get(url + path, headers=bearer(key)) as r:
            assert r.status == 200
            out[api] = {v[field] for v in (await r.json())[items]}
    async with http.get(url + "/v1/models", headers={"Authorization": f"Token {SECRET[key]}"}) as r:
        out["deepgram_models"] = {m["name"] for m in (await r.json())["tts"]}
    return out


def test_two_tenants_on_every_clone_api_and_protocol(server):
    url = server.url

    async def go():
        async with aiohttp.ClientSession() as http:
            mine = {}
            for api in ("openai", "elevenlabs", "cartesia"):
                status, body = await clone(http, url, api, "a", f"Alpha {api}")
                assert status == 200, body
                mine[api] = body["id"]
            # names are per tenant: beta may use the same name (a 409 would say acme has it)
            status, b_voice = await clone(http, url, "openai", "b", "Alpha openai")
            assert status == 200, b_voice
            lists = {k: await listed(http, url, k) for k in ("a", "a2", "b", "admin")}
            ids = set(mine.values())
            for seen in lists["a"].values():
                assert ids <= seen and b_voice["id"] not in seen
            assert all(ids <= seen for seen in lists["a2"].values())          # one tenant, another key
            assert all(not (ids & seen) and b_voice["id"] in seen for seen in lists["b"].values())
            assert all(ids | {b_voice["id"]} <= seen for seen in lists["admin"].values())
            # speaking: the owner's tenant gets audio everywhere; another tenant exactly what a never-stored id gets
            own = await speak_everywhere(http, url, "a2", mine["openai"])
            assert all(v == "ok" for v in own.values()), json.dumps(own)
            for voice_id in mine.values():
                foreign = await speak_everywhere(http, url, "b", voice_id)
                unknown = await speak_everywhere(http, url, "b", NEVER_STORED)
                # (Flux accepts the socket for any stored-form id and refuses it at the first turn: the handshake is "ok")
                assert foreign == unknown and all(v != "ok" for k, v in foreign.items() if k != "deepgram_v2"), foreign
            # by name too: beta's "Alpha openai" is beta's own voice, acme's by that name is not reached
            by_name = await speak_everywhere(http, url, "b", "Alpha openai")
            assert by_name["native"] == "ok" and by_name["openai"] == "ok"
            # get and delete on each clone API: foreign == unknown; the voice is still there afterwards
            for api, voice_id in mine.items():
                for method in ("GET", "DELETE"):
                    foreign = await voice_api(http, url, "b", method, api, voice_id)
                    assert foreign == await voice_api(http, url, "b", method, api, NEVER_STORED), (api, method)
                    assert foreign[0] == 404
                assert (await voice_api(http, url, "a2", "GET", api, voice_id))[0] == 200
            # a shared voice (admins only share): every tenant speaks it, only its owner or an admin deletes it
            status, refused = await clone(http, url, "openai", "a", "Not shared", shared="true")
            assert status == 403 and refused["error"]["code"] == "forbidden"
            status, shared = await clone(http, url, "openai", "admin", "House voice", shared="true")
            assert status == 200 and shared["shared"] is True and shared["tenant"] == "ops"
            assert (await speak_everywhere(http, url, "b", shared["id"]))["openai"] == "ok"
            assert (await voice_api(http, url, "b", "DELETE", "openai", shared["id"]))[0] == 403
            # deletes: the owner's tenant, or an admin
            assert (await voice_api(http, url, "a2", "DELETE", "elevenlabs", mine["elevenlabs"]))[0] == 200
            assert (await voice_api(http, url, "admin", "DELETE", "cartesia", mine["cartesia"]))[0] == 204
            assert (await voice_api(http, url, "a", "GET", "openai", mine["elevenlabs"]))[0] == 404
            return mine
    mine = run(go())
    record = json.loads((server.root / "store" / "voices" / f"{mine['openai']}.json").read_text())
    assert (record["tenant"], record["key_id"], record["consent"]) == ("acme", "a-1", "recorded with consent")
    audit = [json.loads(x) for x in (server.root / "audit.jsonl").read_text().splitlines()]
    created = [r for r in audit if r["event"] == "voice_created" and r["voice"] == mine["openai"]]
    assert created and created[0]["key_id"] == "a-1" and created[0]["tenant"] == "acme"
    deleted = {r["voice"]: r for r in audit if r["event"] == "voice_deleted"}
    assert deleted[mine["elevenlabs"]]["key_id"] == "a-2" and deleted[mine["cartesia"]]["key_id"] == "ops-1"


def test_a_tenants_voice_cap_holds_for_it_alone_in_each_clone_apis_shape(server):
    url = server.url

    async def go():
        async with aiohttp.ClientSession() as http:
            stored = []
            for api, key in (("openai", "c"), ("elevenlabs", "c2")):       # the cap is the tenant's, both keys
                status, body = await clone(http, url, api, key, f"Gamma {api}")
                assert status == 200, body
                stored.append(body["id"])
            refused = {}
            for api in ("openai", "elevenlabs", "cartesia"):
                status, body = await clone(http, url, api, "c2", f"Gamma third {api}")
                refused[api] = (status, body)
            assert refused["openai"] == (400, {"error": {**refused["openai"][1]["error"], "code": "voice_limit_reached",
                                                         "type": "invalid_request_error"}}), refused
            assert refused["elevenlabs"][0] == 400 and \
                refused["elevenlabs"][1]["detail"]["status"] == "voice_limit_reached", refused
            assert refused["cartesia"][0] == 400 and refused["cartesia"][1]["error_code"] == "voice_limit_reached" \
                and refused["cartesia"][1]["status_code"] == 400, refused
            assert "2 voices" in refused["openai"][1]["error"]["message"]
            # another tenant stores on (its keys have no cap: the store's own holds)
            status, body = await clone(http, url, "cartesia", "b", "Beta after gamma")
            assert status == 200, body
            # one of gamma's deleted: room for one more, not two
            assert (await voice_api(http, url, "c", "DELETE", "openai", stored[0]))[0] == 200
            status, body = await clone(http, url, "cartesia", "c", "Gamma again")
            assert status == 200, body
            status, body = await clone(http, url, "openai", "c", "Gamma over again")
            assert (status, body["error"]["code"]) == (400, "voice_limit_reached"), body
    run(go())


def test_a_foreign_voice_id_takes_as_long_as_an_unknown_one(server):
    """An existence leak through timing: on the OpenAI and ElevenLabs clone (get, delete) and speak endpoints and
    Cartesia's get and speak, another tenant's voice id and an id never stored are asked in turn with a second set of
    the unknown id, in random order; the foreign id's median answer time must be within the noise (the gap between
    the two unknown sets' medians, at least 0.25 ms: a file read or a parse on the foreign path alone is more).
    Another load on the machine can shift one set's median: an endpoint is measured again, up to `attempts` times,
    before it fails; a leak fails every time."""
    url, tries, attempts = server.url, 80, 3
    rng = random.Random(5)
    endpoints = {
        "openai get": ("GET", "/v1/audio/voices/{}", None),
        "openai delete": ("DELETE", "/v1/audio/voices/{}", None),
        "openai speak": ("POST", "/v1/audio/speech", lambda v: {"model": "tts-1", "input": TEXT, "voice": {"id": v},
                                                                "response_format": "pcm"}),
        "elevenlabs get": ("GET", "/v1/voices/{}", None),
        "elevenlabs delete": ("DELETE", "/v1/voices/{}", None),
        "elevenlabs speak": ("POST", "/v1/text-to-speech/{}?output_format=pcm_24000", lambda v: {"text": TEXT}),
        "cartesia get": ("GET", "/voices/{}", None),
        "cartesia speak": ("POST", "/tts/bytes", lambda v: {"model_id": "sonic", "transcript": TEXT,
                                                            "voice": {"mode": "id", "id": v},
                                                            "output_format": {"container": "raw",
                                                                              "encoding": "pcm_s16le",
                                                                              "sample_rate": 24000}})}

    async def go():
        async with aiohttp.ClientSession() as http:
            status, body = await clone(http, url, "openai", "a", "Timing voice")
            assert status == 200, body
            ids = {"foreign": body["id"], "unknown": NEVER_STORED, "unknown again": NEVER_STORED}

            async def once(endpoint: str, voice_id: str) -> float:
                method, path, make_body = endpoints[endpoint]
                t = time.perf_counter()
                async with http.request(method, url + path.format(voice_id), headers=bearer("b"),
                                        json=make_body(voice_id) if make_body else None) as r:
                    await r.read()
                    assert r.status in (400, 404), (endpoint, r.status)
                return time.perf_counter() - t

            out = {}
            for endpoint in endpoints:
                for name in ids:            # warm: the first answers of each (a voice file parsed, a route's first use)
                    await once(endpoint, ids[name])
                for _ in range(attempts):
                    times = {name: [] for name in ids}
                    for _ in range(tries):
                        order = list(ids)
                        rng.shuffle(order)
                        for name in order:
                            times[name].append(await once(endpoint, ids[name]))
                    m = {name: round(1000 * statistics.median(t), 3) for name, t in times.items()}
                    out.setdefault(endpoint, []).append(m)
                    if abs(m["foreign"] - m["unknown"]) <= max(0.25, 3 * abs(m["unknown again"] - m["unknown"])):
                        break
            return out
    medians = run(go())
    for endpoint, rounds in medians.items():
        m = rounds[-1]
        assert abs(m["foreign"] - m["unknown"]) <= max(0.25, 3 * abs(m["unknown again"] - m["unknown"])), \
            (endpoint, medians)


def test_admin_endpoints_need_an_admin_key(server):
    async def go():
        async with aiohttp.ClientSession() as http:
            out = []
            for headers in (bearer("a"), bearer("admin"), {"Authorization": "Bearer nope"}):
                async with http.get(server.url + "/admin/drain", headers=headers) as r:
                    out.append(r.status)
            return out
    assert run(go()) == [403, 200, 401]
    audit = (server.root / "audit.jsonl").read_text()
    assert '"reason":"not_admin"' in audit and '"reason":"unknown_key"' in audit and "nope" not in audit


def test_reload_keeps_old_keys_on_a_bad_file_and_refuses_a_removed_key_without_dropping_its_session(server):
    keys, url = server.root / "keys.jsonl", server.url

    async def status(http, key: str) -> int:
        async with http.get(url + "/v1/audio/voices", headers=bearer(key)) as r:
            return r.status

    async def until(http, key: str, wanted: int) -> None:
        deadline = time.monotonic() + 15
        while await status(http, key) != wanted:
            assert time.monotonic() < deadline, f"{key} never answered {wanted}"
            await asyncio.sleep(0.2)

    async def go():
        async with aiohttp.ClientSession() as http:
            assert await status(http, "leaving") == 200
            async with http.ws_connect(url.replace("http", "ws", 1) + "/v1/ws", headers=bearer("leaving")) as s:
                assert (await s.receive_json(timeout=30))["type"] == "session.ready"
                # a malformed file (line 3): the keys in force stay, the log names the line
                keys.write_text(keys_text(["a", "b"]) + "{broken\n")
                server.wait_output("line 3: not JSON", 15)
                assert await status(http, "leaving") == 200 and await status(http, "admin") == 200
                # SIGHUP (to the supervisor: each worker reloads) says so again, and still keeps them
                server.proc.send_signal(signal.SIGHUP)
                deadline = time.monotonic() + 15
                while server.log().count("line 3: not JSON") < 2:
                    assert time.monotonic() < deadline, server.log()[-3000:]
                    await asyncio.sleep(0.1)
                assert await status(http, "leaving") == 200 and server.proc.poll() is None
                # the key removed: refused from the next request on; the session it opened goes on
                keys.write_text(keys_text(["a", "a2", "b", "admin"]))
                await until(http, "leaving", 401)
                await s.send_json({"type": "context.start", "context_id": "c", "fixed_frames": 3})
                await s.send_json({"type": "text", "context_id": "c", "text": TEXT})
                await s.send_json({"type": "flush", "context_id": "c"})
                events = []
                while not events or events[-1]["type"] not in ("context.done", "error"):
                    if (m := await s.receive(timeout=60)).type == aiohttp.WSMsgType.TEXT:
                        events.append(json.loads(m.data))
                    assert m.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), m
                assert events[-1]["type"] == "context.done", events
    run(go())
    audit = [json.loads(x) for x in (server.root / "audit.jsonl").read_text().splitlines()]
    refused = [r for r in audit if r["event"] == "keys_reload_refused"]
    assert refused and refused[0]["line"] == 3 and refused[0]["keys_in_force"] == len(KEYS)
    assert any(r["event"] == "keys_reloaded" and r["keys"] == 4 for r in audit)
    assert not any(SECRET["leaving"] in json.dumps(r) for r in audit)
