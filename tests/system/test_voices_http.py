"""Stored and one-off cloned voices against a real `talkgate serve` (tiny Base checkpoint, CPU): the voice
endpoints, each protocol speaking a stored voice, inline reference audio, bad input, concurrent uploads of one
name, and a second server on the same store (a new voice seen at once; a restart keeps them)."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import struct

import aiohttp
import numpy as np
import pytest

from tests.serverproc import TalkgateServer
from tests.voicetools import AUTH, KEY, audio_file, upload, voice_form

HEADER = struct.Struct("<BBHIII")
TEXT = "Hello there, this is my voice."


def run(coro, timeout: float = 180):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def store_files(root) -> dict:
    """What the store directory holds: {folder: sorted names}."""
    return {d: sorted(os.listdir(root / d)) for d in ("voices", "names", "tmp") if (root / d).exists()}


async def native(http, url: str, frames: int = 6, **start) -> tuple[np.ndarray, dict]:
    """One context on the native protocol, its audio as float32 at 24 kHz, and its last event."""
    async with http.ws_connect(url.replace("http", "ws") + "/v1/ws", headers=AUTH) as ws:
        assert (await ws.receive_json())["type"] == "session.ready"
        await ws.send_json({"type": "context.start", "context_id": "c", "fixed_frames": frames,
                            "format": {"encoding": "pcm_f32le", "sample_rate": 24000}, **start})
        await ws.send_json({"type": "text", "context_id": "c", "text": TEXT})
        await ws.send_json({"type": "flush", "context_id": "c"})
        pcm = []
        while True:
            msg = await ws.receive(timeout=60)
            if msg.type == aiohttp.WSMsgType.BINARY:
                pcm.append(np.frombuffer(msg.data[HEADER.size:], np.float32))
                continue
            ev = json.loads(msg.data)
            if ev["type"] in ("context.done", "error"):
                return (np.concatenate(pcm) if pcm else np.zeros(0, np.float32)), ev


async def openai(http, url: str, **body) -> tuple[int, bytes]:
    async with http.post(f"{url}/v1/audio/speech", headers=AUTH, json={
            "model": "tts-1", "input": TEXT, "response_format": "pcm", "fixed_frames": 6, **body}) as r:
        return r.status, await r.read()


def s16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.float32) / 32768


@pytest.fixture(scope="module")
def voices(base_server):
    """Two stored voices: x-vector from a stereo 44.1 kHz WAV, ICL from an MP3 with its words."""
    async def go():
        async with aiohttp.ClientSession() as http:
            a = await upload(http, base_server.url, "Xavier", audio_file(2.5, 1, 44100, channels=2))
            b = await upload(http, base_server.url, "Isla", audio_file(3.0, 2, 24000, "MP3", "MPEG_LAYER_III"),
                             filename="isla.mp3", ref_text="Some words I said.")
            return a, b
    (sa, a), (sb, b) = run(go())
    assert sa == sb == 200, (a, b)
    return a, b


def test_upload_list_get_delete(base_server, voices):
    a, b = voices
    assert a["object"] == "audio.voice" and a["type"] == "cloned" and a["mode"] == "x-vector" and a["name"] == "Xavier"
    assert a["audio"]["channels"] == 2 and a["audio"]["sample_rate"] == 44100 and abs(a["audio"]["seconds"] - 2.5) < 0.01
    assert b["mode"] == "icl" and b["ref_text"] == "Some words I said." and b["audio"]["format"].startswith("MP3")
    assert a["consent"] == "recorded with consent" and a["model"]["model_type"] == "base" and a["model"]["untrained"]
    assert set(a["timing"]) == {"decode_ms", "engine_ms", "store_ms"}

    async def go():
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base_server.url}/v1/audio/voices", headers=AUTH) as r:
                listed = await r.json()
            got = []
            for key in (a["id"], "isla", "ISLA"):
                async with http.get(f"{base_server.url}/v1/audio/voices/{key}", headers=AUTH) as r:
                    got.append((r.status, (await r.json())["id"]))
            status, c = await upload(http, base_server.url, "Temporary", audio_file(1.5, 3))
            async with http.delete(f"{base_server.url}/v1/audio/voices/{c['id']}", headers=AUTH) as r:
                deleted = (r.status, await r.json())
            async with http.delete(f"{base_server.url}/v1/audio/voices/{c['id']}", headers=AUTH) as r:
                again = (r.status, (await r.json())["error"]["code"])
            async with http.get(f"{base_server.url}/v1/audio/voices/{c['id']}", headers=AUTH) as r:
                gone = r.status
            return listed, got, status, c, deleted, again, gone
    listed, got, status, c, deleted, again, gone = run(go())
    ids = {v["id"] for v in listed["voices"]}
    assert {a["id"], b["id"]} <= ids and listed["model"]["model_type"] == "base" and "auto" in listed["languages"]
    assert all("embedding" not in v for v in listed["voices"])
    assert got == [(200, a["id"]), (200, b["id"]), (200, b["id"])]
    assert status == 200 and deleted == (200, {"id": c["id"], "object": "audio.voice.deleted", "deleted": True})
    assert again == (404, "voice_not_found") and gone == 404
    files = store_files(base_server.store)
    assert f"{a['id']}.json" in files["voices"] and f"{c['id']}.json" not in files["voices"] and files["tmp"] == []


def test_every_protocol_speaks_a_stored_voice(base_server, voices):
    """The same stored voice by id or name, on the native protocol, OpenAI (a name or {"id"}), ElevenLabs (the
    id in the path), Cartesia (voice {mode: id}) and Deepgram (model): the same audio (seeded), another
    voice's differs."""
    a, b = voices
    url, ws = base_server.url, base_server.url.replace("http", "ws")

    async def elevenlabs(http, voice_id):
        async with http.ws_connect(f"{ws}/v1/text-to-speech/{voice_id}/stream-input?output_format=pcm_24000",
                                   headers={"xi-api-key": KEY}) as sock:
            await sock.send_json({"text": TEXT, "flush": True})
            await sock.send_json({"text": ""})
            pcm = b""
            while not (m := await sock.receive_json(timeout=60)).get("isFinal"):
                assert "error" not in m, m
                pcm += base64.b64decode(m["audio"] or "")
            return s16(pcm)

    async def cartesia(http, voice_id):
        async with http.ws_connect(f"{ws}/tts/websocket", headers={"X-API-Key": KEY}) as sock:
            await sock.send_json({"context_id": "k", "transcript": TEXT, "continue": False,
                                  "voice": {"mode": "id", "id": voice_id},
                                  "output_format": {"container": "raw", "encoding": "pcm_f32le", "sample_rate": 24000}})
            pcm = b""
            while (m := await sock.receive_json(timeout=60))["type"] != "done":
                assert m["type"] != "error", m
                pcm += base64.b64decode(m.get("data") or "")
            return np.frombuffer(pcm, np.float32)

    async def deepgram(http, model):
        async with http.ws_connect(f"{ws}/v1/speak?model={model}&encoding=linear16&sample_rate=24000",
                                   headers={"Authorization": f"Token {KEY}"}) as sock:
            assert (await sock.receive_json())["type"] == "Metadata"
            await sock.send_json({"type": "Speak", "text": TEXT})
            await sock.send_json({"type": "Close"})
            pcm = b""
            async for m in sock:
                if m.type == aiohttp.WSMsgType.BINARY:
                    pcm += m.data
            assert sock.close_code == 1000, sock.close_code
            return s16(pcm)

    async def go():
        async with aiohttp.ClientSession() as http:
            by_id, done = await native(http, url, voice=a["id"], frames=None)
            assert done["type"] == "context.done", done
            by_name, _ = await native(http, url, voice="xavier", frames=None)
            other, _ = await native(http, url, voice=b["id"], frames=None)
            plain, _ = await native(http, url, frames=None)
            s1, named = await openai(http, url, voice="Xavier", fixed_frames=None)
            s2, as_id = await openai(http, url, voice={"id": a["id"]}, fixed_frames=None)
            assert s1 == s2 == 200
            return (by_id, by_name, other, plain, s16(named), s16(as_id), await elevenlabs(http, a["id"]),
                    await cartesia(http, a["id"]), await deepgram(http, a["id"]))
    by_id, by_name, other, plain, named, as_id, el, ca, dg = run(go())
    assert len(by_id) >= 1920
    np.testing.assert_array_equal(by_id, by_name)
    for pcm, tol in ((named, 1e-4), (as_id, 1e-4), (el, 1e-4), (ca, 1e-6), (dg, 1e-4)):
        assert len(pcm) == len(by_id)
        np.testing.assert_allclose(pcm, by_id, atol=tol)
    for different in (other, plain):
        n = min(len(different), len(by_id))
        assert np.abs(different[:n] - by_id[:n]).max() > 1e-3


def test_inline_reference_audio_equals_the_stored_voice(base_server, voices):
    """A context's own reference audio (native `ref_audio`, OpenAI `ref_audio` data URL, with `ref_text`) is
    made by the same engine command as a stored voice: the same file and words give the same audio."""
    _, b = voices
    mp3 = audio_file(3.0, 2, 24000, "MP3", "MPEG_LAYER_III")
    data_url = "data:audio/mpeg;base64," + base64.b64encode(mp3).decode()

    async def go():
        async with aiohttp.ClientSession() as http:
            stored, _ = await native(http, base_server.url, voice=b["id"])
            inline, done = await native(http, base_server.url, ref_audio=data_url, ref_text="Some words I said.")
            assert done["type"] == "context.done", done
            # OpenAI clients always send a voice: with ref_audio it is ignored
            status, body = await openai(http, base_server.url, voice="alloy", ref_audio=base64.b64encode(mp3).decode(),
                                        ref_text="Some words I said.")
            assert status == 200, body
            xvec, _ = await native(http, base_server.url, ref_audio=data_url)
            return stored, inline, s16(body), xvec
    stored, inline, http_inline, xvec = run(go())
    np.testing.assert_array_equal(inline, stored)
    np.testing.assert_allclose(http_inline, stored, atol=1e-4)
    assert np.abs(xvec - stored).max() > 1e-3          # without its words: an x-vector voice, another sound


def test_bad_uploads_store_nothing(base_server, voices):
    before = store_files(base_server.store)
    wav = audio_file(2.0)
    cases = [
        ("not audio", dict(name="A", audio=b"just some text, no sound at all" * 10), 400, "invalid_audio"),
        ("too short", dict(name="A", audio=audio_file(0.5)), 400, "audio_too_short"),
        ("too long", dict(name="A", audio=audio_file(31, rate=8000)), 400, "audio_too_long"),
        ("silent", dict(name="A", audio=audio_file(2.0) [:44] + bytes(96000)), 400, "audio_silent"),
        ("too large", dict(name="A", audio=bytes(10 * 1024 * 1024 + 10)), 413, "audio_too_large"),
        ("m4a", dict(name="A", audio=b"\x00\x00\x00\x18ftypM4A " + bytes(4000)), 415, "unsupported_audio_format"),
        ("no name", dict(name=None, audio=wav), 400, "invalid_name"),
        ("no consent", dict(name="A", audio=wav, consent=None), 400, "missing_consent"),
        ("no file", dict(name="A", audio=None), 400, "missing_audio"),
        ("ref_text over 2000 characters", dict(name="A", audio=wav, ref_text="w" * 2001), 400, "reference_text_too_long"),
        ("ref_text over 1024 tokens", dict(name="A", audio=wav, ref_text="1 " * 999), 400, "invalid_params"),
        ("a taken name", dict(name="xavier", audio=wav), 409, "voice_exists"),
        ("no key", dict(name="A", audio=wav, headers={}), 401, "unauthorized"),
    ]

    async def go():
        out = []
        async with aiohttp.ClientSession() as http:
            for what, kw, _, _ in cases:
                status, body = await upload(http, base_server.url, kw.pop("name"), kw.pop("audio"), **kw)
                out.append((what, status, body["error"]["code"], body["error"]["message"]))
            async with http.post(f"{base_server.url}/v1/audio/voices", headers=AUTH, json={"name": "A"}) as r:
                out.append(("JSON, not a form", r.status, (await r.json())["error"]["code"], ""))
        return out
    got = run(go())
    for (what, _, status, code), (_, got_status, got_code, message) in zip(cases, got):
        assert (got_status, got_code) == (status, code), (what, got_status, got_code, message)
    assert got[-1][1:3] == (415, "unsupported_media_type")
    assert "reference text is" in got[10][3] and "1024" in got[10][3]
    assert store_files(base_server.store) == before


def test_deleted_or_unknown_voice_is_a_clear_error_everywhere(base_server):
    url, ws = base_server.url, base_server.url.replace("http", "ws")

    async def go():
        async with aiohttp.ClientSession() as http:
            status, v = await upload(http, url, "Shortlived", audio_file(1.5, 9))
            assert status == 200
            async with http.delete(f"{url}/v1/audio/voices/{v['id']}", headers=AUTH) as r:
                assert r.status == 200
            _, native_err = await native(http, url, voice=v["id"])
            status, body = await openai(http, url, voice={"id": v["id"]})
            async with http.ws_connect(f"{ws}/v1/text-to-speech/{v['id']}/stream-input", headers={"xi-api-key": KEY}) as s:
                el = await s.receive_json(timeout=30)
            async with http.ws_connect(f"{ws}/tts/websocket", headers={"X-API-Key": KEY}) as s:
                await s.send_json({"context_id": "k", "transcript": TEXT, "continue": False,
                                   "voice": {"mode": "id", "id": v["id"]},
                                   "output_format": {"container": "raw", "encoding": "pcm_f32le", "sample_rate": 24000}})
                ca = await s.receive_json(timeout=30)
            async with http.ws_connect(f"{ws}/v1/speak?model={v['id']}", headers={"Authorization": f"Token {KEY}"}) as s:
                closing = await s.receive(timeout=30)
                dg = s.close_code, closing.extra
            async with http.get(f"{url}/v1/voices/{v['id']}", headers={"xi-api-key": KEY}) as r:
                el_get = r.status, await r.json()
            return v, native_err, (status, json.loads(body)), el, ca, dg, el_get
    v, native_err, http_err, el, ca, dg, el_get = run(go())
    message = f"no voice '{v['id']}': it was deleted, or never stored"
    assert native_err == {"type": "error", "code": "unknown_voice", "message": message, "context_id": "c", "fatal": False}
    assert http_err == (400, {"error": {"message": message, "type": "invalid_request_error", "code": "unknown_voice"}})
    assert el["error"] == "unknown_voice" and el["message"] == message
    assert ca["type"] == "error" and ca["error_code"] == "unknown_voice" and ca["message"] == message
    assert dg == (1008, f"unknown_voice: {message}")
    assert el_get == (404, {"detail": {"status": "voice_not_found",
                                       "message": f"A voice with voice_id '{v['id']}' was not found"}})


def test_concurrent_uploads_of_one_name(base_server):
    async def go():
        async with aiohttp.ClientSession() as http:
            return await asyncio.gather(*(upload(http, base_server.url, "Twin", audio_file(2.0, 20 + i))
                                          for i in range(4)))
    results = run(go())
    ok = [body for status, body in results if status == 200]
    assert len(ok) == 1 and sorted((s, b["error"]["code"]) for s, b in results if s != 200) == [(409, "voice_exists")] * 3
    assert sum(1 for f in store_files(base_server.store)["voices"] if f.startswith(ok[0]["id"])) == 1


def test_a_second_server_on_the_store_sees_voices_at_once(base_server, tiny_base_checkpoint, voices):
    """Two servers (processes) on one store: what one stores the other speaks at once, what one deletes the
    other refuses at once; the second one's start is a restart: it finds the voices already there."""
    a, _ = voices
    with TalkgateServer(tiny_base_checkpoint, "--api-key", KEY, "--voice-store", str(base_server.store), "--seed", "1") as other:
        async def go():
            async with aiohttp.ClientSession() as http:
                here, _ = await native(http, base_server.url, voice=a["id"])
                there, _ = await native(http, other.url, voice=a["id"])
                status, v = await upload(http, other.url, "Fresh", audio_file(2.0, 30))
                assert status == 200
                fresh, done = await native(http, base_server.url, voice="fresh")
                async with http.delete(f"{base_server.url}/v1/audio/voices/{v['id']}", headers=AUTH) as r:
                    assert r.status == 200
                _, err = await native(http, other.url, voice=v["id"])
                return here, there, fresh, done, err
        here, there, fresh, done, err = run(go())
    np.testing.assert_array_equal(here, there)
    assert done["type"] == "context.done" and len(fresh) > 0 and err["code"] == "unknown_voice"


def test_vendor_listings_include_stored_voices(base_server, voices):
    a, b = voices

    async def go():
        out = {}
        async with aiohttp.ClientSession() as http:
            for path, headers in (("/v1/voices", {"xi-api-key": KEY}), ("/v2/voices?page_size=1", {"xi-api-key": KEY}),
                                  ("/v2/voices?search=isl", {"xi-api-key": KEY}), ("/voices?limit=100", AUTH),
                                  (f"/voices?limit=1&starting_after={a['id']}", AUTH),
                                  ("/v1/models", {"Authorization": f"Token {KEY}"}),
                                  ("/v1/voices", {})):
                async with http.get(base_server.url + path, headers=headers) as r:
                    out[path + str(bool(headers))] = (r.status, await r.json())
        return out
    out = run(go())
    status, v1 = out["/v1/voicesTrue"]
    assert status == 200 and {a["id"], b["id"]} <= {v["voice_id"] for v in v1["voices"]}
    assert next(v for v in v1["voices"] if v["voice_id"] == a["id"])["category"] == "cloned"
    _, page = out["/v2/voices?page_size=1True"]
    assert len(page["voices"]) == 1 and page["has_more"] and page["next_page_token"] == "1"
    _, found = out["/v2/voices?search=islTrue"]
    assert [v["voice_id"] for v in found["voices"]] == [b["id"]]
    _, cartesia = out["/voices?limit=100True"]
    ids = [v["id"] for v in cartesia["data"]]
    assert a["id"] in ids and cartesia["has_more"] is False
    _, after = out[f"/voices?limit=1&starting_after={a['id']}True"]
    assert [v["id"] for v in after["data"]] == ids[ids.index(a["id"]) + 1:ids.index(a["id"]) + 2]
    _, models = out["/v1/modelsTrue"]
    assert a["id"] in {m["name"] for m in models["tts"]}
    assert out["/v1/voicesFalse"] == (401, {"detail": {"status": "unauthorized", "message": "a valid API key is required"}})


def test_upload_form_bounds(base_server):
    """A form's fields and parts are bounded; a file part needs no particular field name when it has a file name."""
    async def go():
        async with aiohttp.ClientSession() as http:
            out = []
            form = voice_form("Field", audio_file(1.5, 40), description="x" * 20000)
            async with http.post(f"{base_server.url}/v1/audio/voices", data=form, headers=AUTH) as r:
                out.append((r.status, (await r.json())["error"]["code"]))
            form = voice_form("Parts", audio_file(1.5, 41), **{f"f{i}": "x" for i in range(20)})
            async with http.post(f"{base_server.url}/v1/audio/voices", data=form, headers=AUTH) as r:
                out.append((r.status, (await r.json())["error"]["code"]))
            form = voice_form("Any field name", audio_file(1.5, 42), file_field="upload")
            async with http.post(f"{base_server.url}/v1/audio/voices", data=form, headers=AUTH) as r:
                body = await r.json()
                out.append((r.status, body.get("name")))
            async with http.delete(f"{base_server.url}/v1/audio/voices/{body['id']}", headers=AUTH) as r:
                out.append(r.status)
            return out
    assert run(go()) == [(400, "field_too_long"), (400, "invalid_body"), (200, "Any field name"), 200]
