"""Mutation fuzzing: one worker per endpoint sends seeded mutated scripts and judges every answer.

Connections are reused until the server ends one; after each script the worker stops what the script
started (cancel, Clear, close_socket), so fuzz contexts never pile up in the engine: together the
workers hold at most about a dozen slots, the canary's two stay free.
"""
from __future__ import annotations

import asyncio
import gzip
import json
import random
import time

import aiohttp

from tests.fuzz import mutate as M
from tests.fuzz.endpoints import (
    CARTESIA, DASHSCOPE, DEEPGRAM, DEEPGRAM_V2, EL_MULTI, EL_SINGLE, NATIVE, SERVER_FAULT_CODES, TWILIO, Conn,
    Endpoint, Reply, judge, strict_json,
)

SERVER_FAULTS = SERVER_FAULT_CODES | {"ServiceUnavailable"}     # DashScope's name for shutting_down
PROTOCOLS = {NATIVE: M.NATIVE_PROTOCOL, TWILIO: M.TWILIO_PROTOCOL, EL_MULTI: M.EL_MULTI_PROTOCOL,
             EL_SINGLE: M.EL_SINGLE_PROTOCOL, CARTESIA: M.CARTESIA_PROTOCOL, DEEPGRAM: M.DEEPGRAM_PROTOCOL,
             DEEPGRAM_V2: M.DEEPGRAM_V2_PROTOCOL, DASHSCOPE: M.DASHSCOPE_PROTOCOL}
# how the messages of a run are shared out; ElevenLabs stream-input (one socket per script, whose audio
# it waits for) is about a hundred times slower per message than the others, so it gets a little
SHARE = {NATIVE: 0.2, TWILIO: 0.12, EL_MULTI: 0.14, EL_SINGLE: 0.0125, CARTESIA: 0.18, DEEPGRAM: 0.13,
         DEEPGRAM_V2: 0.11, DASHSCOPE: 0.11}


def _cleanup(ep: Endpoint, ids: list[str]) -> list[str]:
    """Messages that stop whatever a script started."""
    if ep in (NATIVE, TWILIO):
        return [json.dumps({"type": "cancel"})]
    if ep is CARTESIA:
        return [json.dumps({"context_id": i, "cancel": True}) for i in ids]
    if ep is DEEPGRAM:
        return [json.dumps({"type": "Clear"})]
    if ep is DEEPGRAM_V2:
        return [json.dumps({"type": "Interrupt"})]
    if ep is DASHSCOPE:
        return [json.dumps({"type": "response.cancel"})]
    if ep is EL_MULTI:
        return [json.dumps({"close_socket": True})]
    return []


async def fuzz_endpoint(camp, phase, ep: Endpoint, n_messages: int, rng: random.Random,
                        deadline: float | None = None) -> int:
    """Send about `n_messages` mutated messages (or until `deadline`); -> how many were sent."""
    if ep is EL_SINGLE:
        return await _fuzz_single(camp, phase, n_messages, rng, deadline)
    mut = M.Mutator(rng, PROTOCOLS[ep], camp.max_message_bytes)
    sent = 0
    conn, reply = None, Reply()
    async with aiohttp.ClientSession() as s:
        try:
            while sent < n_messages and (deadline is None or time.monotonic() < deadline):
                if conn is None or conn.closed is not None:
                    conn, greet = await Conn.open(ep, s, camp.server.ws_url, headers=camp.auth_headers)
                    ending = False          # an input asked the server to end this connection
                    if ep.greeting is not None and not greet.answered:
                        phase.fail("no greeting", f"{ep.name}: {greet.brief()}")
                        return sent
                inputs, ids = mut.mutated_script()
                for inp in inputs:
                    reply = await conn.exchange(inp.data)
                    sent += 1
                    phase.counts[ep.name] += 1
                    judge(ep, inp.what, reply, phase, inp.known_bad, ending or inp.normal_end, after_end=ending)
                    ending = ending or inp.normal_end
                    if conn.closed is not None or reply.timed_out:
                        break
                if reply.timed_out:
                    await conn.close()
                    conn = None
                    continue
                for m in _cleanup(ep, ids):
                    if conn.closed is not None:
                        break
                    reply = await conn.exchange(m)
                    judge(ep, "cleanup " + m[:80], reply, phase, False, normal_end=ending or ep is EL_MULTI)
        finally:
            if conn is not None:
                await conn.close()
    return sent


async def _fuzz_single(camp, phase, n_messages: int, rng: random.Random, deadline: float | None) -> int:
    """ElevenLabs stream-input: one utterance per socket, so one socket per script, judged as a whole
    (no probe exists): a script with a bad message must be answered with an error before the end."""
    mut = M.Mutator(rng, M.EL_SINGLE_PROTOCOL, camp.max_message_bytes)
    sent = 0
    async with aiohttp.ClientSession() as s:
        while sent < n_messages and (deadline is None or time.monotonic() < deadline):
            inputs, _ = mut.mutated_script()
            conn, _ = await Conn.open(EL_SINGLE, s, camp.server.ws_url, headers=camp.auth_headers)
            reply = Reply()
            for inp in inputs:
                part = await conn.exchange(inp.data, window=0.05)
                reply.items += part.items
                sent += 1
                phase.counts[EL_SINGLE.name] += 1
                if conn.closed is not None:
                    break
            bad = any(i.known_bad for i in inputs)
            ended = any(i.normal_end for i in inputs)
            if conn.closed is None and (bad or rng.random() < 0.2):
                await conn.send(json.dumps({"text": ""}))        # end of input: isFinal, then close
                ended = True
                rest = await conn.until_closed()
                reply.items += rest.items
                reply.timed_out = rest.timed_out
            elif conn.closed is None:
                part = await conn.drain(0.3)
                reply.items += part.items
            reply.close, reply.abrupt = conn.closed, conn.abrupt
            what = " / ".join(i.what for i in inputs)
            judge(EL_SINGLE, what, reply, phase, bad, normal_end=ended)
            await conn.close()
    return sent


# ----- HTTP -----
HTTP_PROTOCOL = M.Protocol("http", [[b] for b in M.HTTP_SEEDS], {"body": M.HTTP_CONTRACT}, lambda m: "body",
                           needs=lambda m: isinstance(m.get("input"), str) and not m["input"].strip())


class HttpRequest:
    def __init__(self, what: str, known_bad: bool, body: bytes, method: str = "POST", path: str = "/v1/audio/speech",
                 headers: dict | None = None):
        self.what, self.known_bad, self.body, self.method, self.path = what, known_bad, body, method, path
        self.headers = {"Content-Type": "application/json", **(headers or {})}


def http_mutation(rng: random.Random, mut: M.Mutator, client_max: int) -> HttpRequest:
    """One mutated request to POST /v1/audio/speech: its body (structure-aware, as the WebSocket
    messages), its headers (type, charset, encoding) or its method and path."""
    body = rng.choice(M.HTTP_SEEDS)
    r = rng.random()
    if r < 0.6:
        inp = mut.mutate(body)
        if isinstance(inp.data, bytes):       # "as a binary frame" has no HTTP meaning: the same JSON
            return HttpRequest("the same JSON", False, inp.data)
        return HttpRequest(inp.what, inp.known_bad, inp.data.encode("utf-8", "surrogatepass"))
    raw = json.dumps(body).encode()
    if r < 0.8:
        kind = rng.choice(["gzip", "gzip-bad", "deflate-bad", "br", "xyz", "gzip-bomb", "gzip-gzip"])
        if kind == "gzip":
            return HttpRequest("gzip body", False, gzip.compress(raw), headers={"Content-Encoding": "gzip"})
        if kind == "gzip-bad":
            return HttpRequest("Content-Encoding gzip, body not gzip", True, raw, headers={"Content-Encoding": "gzip"})
        if kind == "deflate-bad":
            return HttpRequest("Content-Encoding deflate, body not deflate", True, b"\x00" + raw,
                               headers={"Content-Encoding": "deflate"})
        if kind == "br":
            return HttpRequest("Content-Encoding br, body not brotli", True, raw, headers={"Content-Encoding": "br"})
        if kind == "gzip-bomb":
            return HttpRequest(f"gzip body inflating past {client_max} bytes", True,
                               gzip.compress(raw[:-1] + b" " * (client_max + 10) + b"}"), headers={"Content-Encoding": "gzip"})
        if kind == "gzip-gzip":
            return HttpRequest("gzip twice, declared once", True, gzip.compress(gzip.compress(raw)),
                               headers={"Content-Encoding": "gzip"})
        return HttpRequest("unknown Content-Encoding xyz", False, raw, headers={"Content-Encoding": "xyz"})
    if r < 0.92:
        kind = rng.choice(["charset-bogus", "charset-utf16", "utf16-body", "bad-utf8", "latin1", "no-type", "text-plain"])
        if kind == "charset-bogus":
            return HttpRequest("charset=bogus", True, raw, headers={"Content-Type": "application/json; charset=bogus"})
        if kind == "charset-utf16":
            return HttpRequest("charset=utf-16, body UTF-8", True, raw,
                               headers={"Content-Type": "application/json; charset=utf-16"})
        if kind == "utf16-body":
            return HttpRequest("body in UTF-16, no charset", True, json.dumps(body).encode("utf-16"))
        if kind == "bad-utf8":
            return HttpRequest("invalid UTF-8 in input", True,
                               raw.replace(b'"input": "', b'"input": "\xff\xfe\xc0\x80', 1))
        if kind == "latin1":
            return HttpRequest("charset=latin-1", False, raw,
                               headers={"Content-Type": "application/json; charset=latin-1"})
        if kind == "no-type":
            return HttpRequest("no Content-Type", False, raw, headers={"Content-Type": ""})
        return HttpRequest("Content-Type text/plain", False, raw, headers={"Content-Type": "text/plain"})
    kind = rng.choice(["method", "path", "empty"])
    if kind == "method":
        m = rng.choice(["GET", "PUT", "DELETE", "PATCH"])
        return HttpRequest(f"{m} /v1/audio/speech", True, raw, method=m)
    if kind == "path":
        p = rng.choice(["/v1/audio/speech/", "/v1/audio/Speech", "/v1/audio/speech%00", "//v1/audio/speech",
                        "/v1/audio/speech/../voices", "/v1/audio/speech;x", "/v2/audio/speech"])
        return HttpRequest(f"POST {p}", True, raw, path=p)
    return HttpRequest("empty body", True, b"")


async def send_http(session, base: str, req: HttpRequest, auth: dict, timeout: float = 60.0):
    """-> (status, content type, body bytes); status -1 when no response came."""
    headers = {**auth, **req.headers}
    headers = {k: v for k, v in headers.items() if v != ""}
    try:
        async with session.request(req.method, base + req.path, data=req.body, headers=headers,
                                   skip_auto_headers=("Content-Type",) if "Content-Type" not in headers else (),
                                   timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            return r.status, r.headers.get("Content-Type", ""), await r.read()
    except asyncio.TimeoutError:
        return -2, "", b"timeout"
    except (aiohttp.ClientError, ConnectionError) as e:
        return -1, "", repr(e).encode()


def openai_error(doc, status: int) -> str | None:
    """The code of an error in OpenAI's shape (talkgate's own): {"error": {"code", "message", ...}}, else None."""
    error = doc.get("error") if isinstance(doc, dict) and set(doc) == {"error"} else None
    if isinstance(error, dict) and isinstance(error.get("code"), str) and isinstance(error.get("message"), str):
        return error["code"]
    return None


def _outline(doc) -> tuple:
    """An error body's keys, a nested object's with them: what must be the same for every error of an API."""
    return tuple((k, _outline(v)) if isinstance(v, dict) else k for k, v in sorted(doc.items()))


def judge_http(req: HttpRequest, status: int, ctype: str, body: bytes, phase, shapes: dict,
               shape=openai_error) -> None:
    """The rules for an HTTP answer: an answer always; never 5xx for a client's mistake; every error
    JSON in the API's shape (`shape(doc, status)` -> its code, None when the body is not in that shape;
    OpenAI's by default), with the same keys (`shapes`); a known-bad request never accepted."""
    where = f"{req.method} {req.path[:100]} {req.what[:200]}"
    if status < 0:
        phase.fail("HTTP no answer", f"{where} -> {body[:120]!r}")
        return
    if status >= 400:
        phase.errors_answered += 1
        code = None
        if not ctype.startswith("application/json"):
            phase.fail("HTTP error not JSON", f"{where} -> {status} {ctype} {body[:100]!r}")
        else:
            try:
                doc = strict_json(body.decode())
            except (ValueError, UnicodeDecodeError):
                doc = None
            code = shape(doc, status)
            if code is None:
                phase.fail("HTTP error shape", f"{where} -> {status} {body[:160]!r}")
            else:
                shapes.setdefault(_outline(doc), f"{status} {where[:80]}")
        if status >= 500 and not (status == 503 and code in SERVER_FAULTS):
            phase.fail("HTTP 5xx for a client's request", f"{where} -> {status} {body[:160]!r}")
    elif req.known_bad:
        phase.fail("HTTP bad request accepted", f"{where} -> {status} {ctype} ({len(body)} bytes)")
    elif ctype.startswith("text/event-stream"):
        for line in body.decode(errors="replace").split("\n\n"):
            if line.startswith("data: "):
                try:
                    ev = strict_json(line[6:])
                except ValueError:
                    phase.fail("not strict JSON", f"{where} -> SSE {line[:100]!r}")
                    continue
                if ev.get("type") == "error":
                    phase.fail("HTTP stream error", f"{where} -> {line[:160]}")


def judge_shapes(phase, shapes: dict) -> None:
    if len(shapes) > 1:
        phase.fail("HTTP error shapes differ", "; ".join(f"{keys} e.g. {eg}" for keys, eg in shapes.items()))


async def fuzz_http(camp, phase, n: int, rng: random.Random, shapes: dict, deadline: float | None = None) -> int:
    client_max = 4 * camp.max_message_bytes      # aiohttp's client_max_size on this server
    mut = M.Mutator(rng, HTTP_PROTOCOL, client_max)
    done = 0
    conn = aiohttp.TCPConnector(force_close=True)        # one request per connection: no pool races
    async with aiohttp.ClientSession(connector=conn, auto_decompress=False) as s:
        while done < n and (deadline is None or time.monotonic() < deadline):
            req = http_mutation(rng, mut, client_max)
            status, ctype, body = await send_http(s, camp.server.url, req, camp.auth_headers)
            judge_http(req, status, ctype, body, phase, shapes)
            done += 1
            phase.counts["http"] += 1
    return done

