"""The fuzz and fault suite (docs/reliability.md): real `talkgate serve` processes (tiny checkpoint, CPU)
driven only from outside, a canary session streaming throughout.

Each test is one phase against a campaign server; every phase ends with the same checks (harness.py):
the server lives, the canary never gapped over 500 ms, no ERROR or traceback in the server log, its
connections, contexts and engine slots are back, internal_error never counted, every error a client
was answered with is counted in /metrics. The last test of each server checks its gauges against the
baseline and its RSS against the baseline + 10%.

    pytest tests/system/test_fuzz.py                                   # the CI size (a few minutes, 2 cores)
    TALKGATE_FUZZ_SCALE=release pytest tests/system/test_fuzz.py       # 10^5 messages, 30 minutes of mixed load
    TALKGATE_FUZZ_SEED=7 ...                                    # another seed
"""
from __future__ import annotations

import asyncio
import random
import time

import aiohttp
import pytest

from tests.fuzz import access, cases, faults, vendor_http, workers
from tests.fuzz.endpoints import (
    EL_SINGLE, WS_ENDPOINTS, cartesia_session, dashscope_session, deepgram_session, deepgram_v2_session,
    elevenlabs_session, http_speech, native_session, twilio_session,
)
from tests.fuzz.harness import ENGINE_SLOTS, MAX_GAP_MS, Campaign, Scale

SCALE = Scale.from_env()
MAX_BACKLOG_MS = 3000
IDLE_S = 10        # longer than any wait of the suite's well-behaved clients
LIMIT_CONTEXTS = 4
UNSPACED_MAX_GAP_MS = 200.0
COMMON = ["--max-message-bytes", "16384", "--max-contexts-per-connection", str(LIMIT_CONTEXTS),
          "--max-backlog-ms", str(MAX_BACKLOG_MS), "--shutdown-deadline", "5"]
OPEN_ARGS = COMMON + ["--idle-timeout", str(IDLE_S)]
GUARDED_ARGS = COMMON + ["--idle-timeout", "60", "--api-key", access.KEY, "--allow-origin", access.ORIGIN]
PHASE_LIMIT_S = 600 if SCALE.name == "ci" else 4 * 3600
pytestmark = pytest.mark.timeout(PHASE_LIMIT_S + 300)      # the server's start and the phase's checks too


@pytest.fixture(scope="module")
def open_server(tiny_checkpoint):
    with Campaign(tiny_checkpoint, *OPEN_ARGS) as camp:
        yield camp


@pytest.fixture(scope="module")
def guarded_server(tiny_checkpoint):
    with Campaign(tiny_checkpoint, *GUARDED_ARGS, api_key=access.KEY) as camp:
        yield camp


def run_phase(camp: Campaign, name: str, body, slot_probe: bool = True, max_gap_ms: float = MAX_GAP_MS):
    """Run `body(phase)` (a coroutine function) as one phase, then the checks every phase must pass."""
    phase = camp.begin(name, max_gap_ms)
    t0 = time.monotonic()
    try:
        asyncio.run(asyncio.wait_for(body(phase), PHASE_LIMIT_S))
    except asyncio.TimeoutError:
        phase.fail("phase timeout", f"did not end within {PHASE_LIMIT_S} s")
    camp.end(phase, slot_probe)
    phase.counts["seconds"] = round(time.monotonic() - t0)
    print(f"\n{name}: {dict(phase.counts)}; canary {phase.canary}")
    return phase


def rng(salt: str) -> random.Random:
    return random.Random(f"{SCALE.seed}:{salt}")


# ----- the open server: no key, short idle timeout -----
def test_adversarial_messages_every_endpoint(open_server):
    """Every kind of input issue 21 lists, on every WebSocket endpoint: invalid JSON, JSON nested 1000
    deep, lone surrogates, 401-digit numbers, NaN and Infinity, wrong types, non-ASCII keys in the
    first message, unknown fields and types, oversized messages, binary frames, Unicode digits in
    numeric query parameters, encodings the native transport cannot carry, contexts after `close`,
    out-of-range seeds, unknown format keys, Cartesia voice {}: each answered with the protocol's
    error; control-token text spoken like any text."""
    camp = open_server

    async def body(phase):
        await cases.run_cases(camp, phase, cases.all_message_cases(camp.max_message_bytes))
        await cases.control_token_text(camp, phase)
        await cases.contexts_after_close(camp, phase)
        await cases.query_cases(camp, phase)

    phase = run_phase(camp, "adversarial messages", body)
    assert not phase.failures, phase.summary()


def test_mutation_fuzz_every_endpoint(open_server):
    """Seeded structure-aware mutations of valid scripts of every WebSocket protocol. The endpoints take
    turns, beside ElevenLabs stream-input (which mostly waits for audio): hostile content, not the
    test's own CPU, is what this phase puts on the server (the mixed-load phase adds the load)."""
    camp = open_server

    def n(ep):
        return max(20, int(SCALE.ws_messages * workers.SHARE[ep]))

    async def in_turn(phase):
        for ep in WS_ENDPOINTS:
            if ep is not EL_SINGLE:
                await workers.fuzz_endpoint(camp, phase, ep, n(ep), rng(ep.name))

    async def body(phase):
        await asyncio.gather(in_turn(phase),
                             workers.fuzz_endpoint(camp, phase, EL_SINGLE, n(EL_SINGLE), rng(EL_SINGLE.name)))

    phase = run_phase(camp, "mutation fuzz", body)
    assert not phase.failures, phase.summary()


def test_unspaced_text_deltas_do_not_stall_others(open_server):
    """2,000 ten-character deltas without whitespace (a URL; Chinese without punctuation) on two sockets:
    the canary never waits (the cost of a delta is bounded by the delta, and a worker reads a socket's
    burst in turns with its other sockets: read at once, 2,000 buffered deltas held the worker's loop
    250-515 ms on 2 cores, so this phase's limit is 200 ms; in turns the gap is 45-75 ms)."""
    phase = run_phase(open_server, "unspaced text", lambda phase: faults.unspaced_text(open_server, phase),
                      max_gap_ms=UNSPACED_MAX_GAP_MS)
    assert not phase.failures, phase.summary()


def test_disconnect_and_cancel_storm(open_server):
    """Sockets of every endpoint dropped mid-stream every way a client can vanish, and cancels racing
    audio: nothing leaks, nothing is logged as an error, no audio follows a cancel's answer."""
    camp = open_server

    async def body(phase):
        await asyncio.gather(faults.disconnect_storm(camp, phase, SCALE.storm_sockets, rng("storm")),
                             faults.cancel_races(camp, phase, SCALE.cancel_races, rng("races")))

    phase = run_phase(camp, "disconnect and cancel storm", body)
    assert not phase.failures, phase.summary()


def test_slow_readers_are_cancelled_by_unsent_audio_time(open_server):
    """Clients that stop reading (small receive buffers) are cancelled once the audio they have not
    taken passes --max-backlog-ms, counted with what waits in the server's socket buffer."""
    phase = run_phase(open_server, "slow readers", lambda phase: faults.slow_readers(open_server, phase, MAX_BACKLOG_MS))
    assert not phase.failures, phase.summary()


def test_idle_clients_are_closed_with_or_without_open_contexts(open_server):
    phase = run_phase(open_server, "idle clients", lambda phase: faults.idle_clients(open_server, phase, IDLE_S))
    assert not phase.failures, phase.summary()


def test_contexts_per_connection_are_bounded_on_every_protocol(open_server):
    extra = 20_000 if SCALE.name == "release" else 200
    phase = run_phase(open_server, "contexts per connection",
                      lambda phase: faults.contexts_per_connection(open_server, phase, LIMIT_CONTEXTS, extra))
    assert not phase.failures, phase.summary()


def test_message_floods(open_server):
    n = 20_000 if SCALE.name == "release" else 2_000
    phase = run_phase(open_server, "floods", lambda phase: faults.floods(open_server, phase, n))
    assert not phase.failures, phase.summary()


def test_formats_and_reasons_agree_with_docs_and_schema(open_server):
    """The sample rates docs/protocol.md gives per encoding are exactly what the server accepts and what
    the schema allows; the context.done reasons of the docs, the schema and the server are the same."""
    phase = run_phase(open_server, "formats and docs", lambda phase: cases.formats_agree(open_server, phase),
                      slot_probe=False)
    assert not phase.failures, phase.summary()


def test_mixed_load(open_server):
    """Everything at once for TALKGATE_FUZZ_SCALE's mixed-load time (20 s in CI, 30 minutes for a
    release): mutation fuzz on every endpoint, disconnect storms, cancel races, and well-behaved clients
    of every protocol, each of which must be served normally throughout."""
    phase = run_phase(open_server, "mixed load", lambda phase: mixed_load(open_server, phase, SCALE.mixed_load_s))
    assert not phase.failures, phase.summary()


def test_vendor_http_bodies(open_server):
    """Each vendor HTTP speech endpoint (ElevenLabs' four text-to-speech routes, Cartesia /tts/bytes and /tts/sse,
    Deepgram POST /v1/speak, DashScope's Qwen TTS streamed and not): a valid request served with audio, then
    hostile bodies (invalid JSON and UTF-8, empty, a list or a scalar, nested 1000 and 100000 deep, NaN,
    Infinity, 1e400 and 401-digit numbers, wrong types in every documented field, absurd formats and rates, lone
    surrogates, text over the limit, Content-Encoding lies, a body over the client's maximum): each refused 4xx
    in the vendor's own error shape, never 5xx; unknown fields, gzip and control tokens in the text served."""
    phase = run_phase(open_server, "vendor HTTP bodies", lambda phase: vendor_http.fuzz_vendor_http(open_server, phase))
    assert not phase.failures, phase.summary()


def test_open_server_returns_to_baseline(open_server):
    """After every phase above: the canary stopped, every gauge at its baseline (contexts, connections,
    engine batch and queue, engine slots), RSS within 10% of the baseline taken after the warm-up."""
    phase = open_server.begin("baseline")
    open_server.final_checks(phase)
    print(f"\nRSS baseline {open_server.rss_baseline_mb:.0f} MB, now {open_server.server.rss_mb():.0f} MB")
    assert not phase.failures, phase.summary()


# ----- the guarded server: --api-key and --allow-origin -----
def test_keys_and_origins_on_every_endpoint(guarded_server):
    """Every documented way to present the key is served (the auth scheme in any case); no key, a wrong
    key, a non-ASCII key (header bytes, query, first message), a key after junk, another origin: refused
    with the protocol's error (never an HTTP 500 inside the upgraded stream, never a silent close)."""
    camp = guarded_server

    async def body(phase):
        await access.ws_access(camp, phase)
        await access.auth_after_junk(camp, phase)
        shapes: dict = {}
        await access.http_access(camp, phase, shapes)
        workers.judge_shapes(phase, shapes)

    phase = run_phase(camp, "keys and origins", body)
    assert not phase.failures, phase.summary()


def test_http_mutation_fuzz(guarded_server):
    """Seeded mutations of valid POST /v1/audio/speech requests: body, headers (type, charset, encoding),
    method and path. Client mistakes get a 4xx in one JSON shape, never a 500."""
    camp = guarded_server

    async def body(phase):
        shapes: dict = {}
        await workers.fuzz_http(camp, phase, SCALE.http_requests, rng("http"), shapes)
        workers.judge_shapes(phase, shapes)

    phase = run_phase(camp, "HTTP mutation fuzz", body)
    assert not phase.failures, phase.summary()


def test_http_adversarial_requests_and_routes(guarded_server):
    """The HTTP inputs issue 21 lists (a lone surrogate in `input` more times than there are engine
    slots, then a valid request; deep JSON, bad charset, bad gzip, oversized bodies; every route with the
    wrong method, and the WebSocket routes without an upgrade): 4xx JSON of one shape, no slot held; on the
    vendors' routes, of that vendor's shape."""
    camp = guarded_server

    async def body(phase):
        shapes: dict = {}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), auto_decompress=False) as s:
            for req in access.http_cases(ENGINE_SLOTS, 4 * camp.max_message_bytes):
                status, ctype, data = await workers.send_http(s, camp.server.url, req, camp.auth_headers)
                workers.judge_http(req, status, ctype, data, phase, shapes)
                phase.counts["http cases"] += 1
                if req.what == "a valid request after them" and status != 200:
                    phase.fail("slots held", f"a valid request after the surrogate requests: {status} {data[:120]!r}")
            vendors: dict = {}                              # each vendor's error keys, apart
            for req, shape in vendor_http.route_cases():
                status, ctype, data = await workers.send_http(s, camp.server.url, req, camp.auth_headers)
                workers.judge_http(req, status, ctype, data, phase, vendors.setdefault(shape, {}), shape)
                phase.counts["http cases"] += 1
        for each in (shapes, *vendors.values()):
            workers.judge_shapes(phase, each)
        await cases.malformed_http(camp, phase)

    phase = run_phase(camp, "HTTP adversarial", body)
    assert not phase.failures, phase.summary()


def test_guarded_server_returns_to_baseline(guarded_server):
    phase = guarded_server.begin("baseline")
    guarded_server.final_checks(phase)
    assert not phase.failures, phase.summary()


# ----- helpers -----
async def mixed_load(camp: Campaign, phase, seconds: float) -> None:
    """Every generator at once for `seconds`: mutation fuzz on every endpoint, disconnect storms, cancel
    races, and well-behaved clients of every protocol (tests/fuzz/rss_soak.py runs it too)."""
    deadline = time.monotonic() + seconds
    big = 10 ** 9
    jobs = [workers.fuzz_endpoint(camp, phase, ep, big, rng("mixed" + ep.name), deadline) for ep in WS_ENDPOINTS]
    jobs += [_until(deadline, lambda: faults.disconnect_storm(camp, phase, 8, rng("mixed-storm"), wave=4)),
             _until(deadline, lambda: faults.cancel_races(camp, phase, 4, rng("mixed-races"))),
             _until(deadline, lambda: _well_behaved(camp, phase))]
    await asyncio.gather(*jobs)


async def _until(deadline: float, make) -> None:
    while time.monotonic() < deadline:
        await make()


async def _well_behaved(camp: Campaign, phase) -> None:
    """One session of each protocol, as its real clients run them: each must simply work."""
    ws, url, h = camp.server.ws_url, camp.server.url, camp.auth_headers
    async with aiohttp.ClientSession() as s:
        for name, make in (("native", lambda: native_session(s, ws, h)), ("twilio", lambda: twilio_session(s, ws, h)),
                           ("elevenlabs", lambda: elevenlabs_session(s, ws, True, h)),
                           ("cartesia", lambda: cartesia_session(s, ws, h)), ("deepgram", lambda: deepgram_session(s, ws, h)),
                           ("deepgram v2", lambda: deepgram_v2_session(s, ws, h)),
                           ("dashscope", lambda: dashscope_session(s, ws, h)), ("http", lambda: _http_ok(s, url, h))):
            try:
                await asyncio.wait_for(make(), 60)
                phase.counts["well-behaved sessions"] += 1
            except (AssertionError, asyncio.TimeoutError, aiohttp.ClientError) as e:
                phase.fail("well-behaved client failed", f"{name}: {str(e)[:300] or type(e).__name__}")


async def _http_ok(s, url, h) -> None:
    status, body = await http_speech(s, url, {"input": "Still fine.", "response_format": "pcm", "fixed_frames": 3}, h)
    assert status == 200, (status, body[:200])
