"""The fuzz and fault campaign around one real `talkgate serve` process, driven only from outside
(sockets, /metrics, /health, its log, /proc/PID/status), so it holds whatever runs behind the port.

    with Campaign(checkpoint, server_args) as camp:       # server up, warm-up, baseline, canary started
        phase = camp.begin("storm")
        ... drive the server, phase.fail("what went wrong") for each finding ...
        camp.end(phase)                                   # the checks every phase must pass
        assert not phase.failures, phase.summary()

Every phase ends with the same checks: the process lives and /health answers; the canary streamed
with no gap over 500 ms and no error; the server logged no ERROR and no traceback; its connections go
back to the canary's one, its contexts to the canary's at most two, and every engine slot but the
canary's two can be taken (the slot probe: a leaked slot refuses one); `internal_error` was never
counted; and the errors the clients were answered with are counted in /metrics errors_total.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import select
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tests.serverproc import TalkgateServer

ROOT = Path(__file__).resolve().parent.parent.parent
MAX_GAP_MS = 500.0
CANARY_CONTEXTS = 2           # the canary keeps at most this many contexts in flight
ENGINE_SLOTS = 24             # --max-contexts of the campaign servers
RSS_TOLERANCE = 0.10
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|\bERROR\b")


# ----- scale -----
@dataclass(frozen=True)
class Scale:
    """How much of everything one run does. TALKGATE_FUZZ_SCALE picks it: `ci` (default, a few
    minutes on 2 cores), `release` (10^5 WebSocket messages, 30 minutes of mixed load), or a number
    that multiplies the ci amounts. TALKGATE_FUZZ_SEED picks the seed (default 1)."""
    name: str
    ws_messages: int          # mutated WebSocket messages, over every endpoint
    http_requests: int        # mutated HTTP requests
    storm_sockets: int        # sockets opened and dropped in the disconnect storm
    cancel_races: int         # start/cancel rounds racing audio
    mixed_load_s: float       # seconds of everything at once
    seed: int

    @classmethod
    def from_env(cls) -> "Scale":
        name = os.environ.get("TALKGATE_FUZZ_SCALE", "ci").strip().lower()
        seed = int(os.environ.get("TALKGATE_FUZZ_SEED", "1"))
        if name == "release":
            return cls("release", 100_000, 5_000, 2_000, 2_000, 1800.0, seed)
        factor = 1.0 if name == "ci" else float(name)
        return cls(name, int(6000 * factor), int(150 * factor), int(60 * factor), int(40 * factor),
                   20.0 * factor, seed)


# ----- what the server exposes -----
def parse_metrics(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)", line)
        if not m:
            continue
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


@dataclass
class MetricsView:
    values: dict[tuple[str, frozenset], float]

    def get(self, name: str, **labels) -> float | None:
        return self.values.get((name, frozenset((k, str(v)) for k, v in labels.items())))

    def total(self, name: str) -> float:
        return sum(v for (n, _), v in self.values.items() if n == name)

    def summed(self, name: str) -> float | None:
        """A gauge over all its series (per engine process, per worker), None when it has none."""
        values = [v for (n, _), v in self.values.items() if n == name]
        return sum(values) if values else None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        return {dict(ls).get(label, ""): v for (n, ls), v in self.values.items() if n == name}


def children(pid: int) -> list[int]:
    """The direct children of a process (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


class Server:
    """One `talkgate serve` process and what can be read about it from outside."""

    def __init__(self, checkpoint, *args: str):
        self.proc_server = TalkgateServer(checkpoint, "--max-contexts", str(ENGINE_SLOTS), *args)
        self.args = args

    def __enter__(self) -> "Server":
        self.proc_server.__enter__()
        self.url, self.ws_url, self.port = self.proc_server.url, self.proc_server.ws_url, self.proc_server.port
        self.pid = self.proc_server.proc.pid
        return self

    def __exit__(self, *exc) -> None:
        self.proc_server.__exit__(*exc)

    def alive(self) -> bool:
        return self.proc_server.proc.poll() is None

    def rss_mb(self) -> float:
        """The server's resident memory: its process and its children (engine processes, workers)."""
        kb = 0
        for pid in [self.pid, *children(self.pid)]:
            try:
                with open(f"/proc/{pid}/status") as f:
                    kb += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
            except (OSError, StopIteration):        # gone meanwhile
                pass
        return kb / 1024

    def log_lines(self, start: int = 0) -> list[str]:
        return self.proc_server.output[start:]

    def log_mark(self) -> int:
        return len(self.proc_server.output)

    async def metrics(self, session) -> MetricsView:
        async with session.get(self.url + "/metrics") as r:
            return MetricsView(parse_metrics(await r.text()))

    async def health(self, session) -> int:
        try:
            async with session.get(self.url + "/health", timeout=_timeout(5)) as r:
                return r.status
        except Exception as e:   # noqa: BLE001 (any failure is the answer: not healthy)
            return -1 if not isinstance(e, asyncio.TimeoutError) else -2


def _timeout(s: float):
    import aiohttp
    return aiohttp.ClientTimeout(total=s)


# ----- the canary process -----
class CanaryProcess:
    def __init__(self, ws_url: str, api_key: str | None = None):
        args = [sys.executable, "-m", "tests.fuzz.canary", ws_url] + (["--api-key", api_key] if api_key else [])
        path = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                     env={**os.environ, "PYTHONPATH": os.pathsep.join(path)})
        first = self._line(60)
        if not first.get("ready"):      # not left running (and unwaited) by the failed fixture
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the canary did not start: {first}")

    def _line(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return {"error": f"the canary did not answer within {timeout} s"}
        line = self.proc.stdout.readline()
        if not line:
            return {"error": f"the canary exited with {self.proc.wait()}"}
        return json.loads(line)

    def mark(self) -> dict:
        """What the canary saw since the previous mark."""
        if self.proc.poll() is not None:
            return {"error": f"the canary exited with {self.proc.returncode}"}
        self.proc.stdin.write("mark\n")
        self.proc.stdin.flush()
        return self._line(30)

    def stop(self) -> dict:
        if self.proc.poll() is not None:
            return {"error": f"the canary exited with {self.proc.returncode}"}
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        report = self._line(30)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return report


# ----- phases -----
@dataclass
class Phase:
    name: str
    log_start: int
    errors_before: float
    internal_before: float
    failures: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    canary: dict = field(default_factory=dict)
    errors_answered: int = 0       # client inputs the server answered with an error (any protocol's form)
    max_gap_ms: float = MAX_GAP_MS  # the canary's limit in this phase

    def fail(self, kind: str, detail: str) -> None:
        self.failures.append(f"[{kind}] {detail}")

    def write_report(self) -> None:
        """Every failure of the phase, in full, to $TALKGATE_FUZZ_REPORT/<phase>.txt when that is set."""
        out = os.environ.get("TALKGATE_FUZZ_REPORT")
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            name = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")
            (Path(out) / f"{name}.txt").write_text("\n".join(self.failures) + "\n")

    def summary(self, limit: int = 12) -> str:
        """Failures grouped by kind, a few examples each."""
        groups: dict[str, list[str]] = defaultdict(list)
        for f in self.failures:
            kind, _, detail = f.partition("] ")
            groups[kind + "]"].append(detail)
        lines = [f"phase {self.name!r}: {len(self.failures)} failures"]
        for kind, details in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"{kind} x{len(details)}")
            lines += [f"    {d[:400]}" for d in details[:limit]]
        return "\n".join(lines)


class Campaign:
    """A server, its baseline and its canary, for one test module."""

    def __init__(self, checkpoint, *server_args: str, api_key: str | None = None):
        self.server = Server(checkpoint, *server_args)
        self.api_key = api_key
        args = list(server_args)
        self.max_message_bytes = int(args[args.index("--max-message-bytes") + 1]) \
            if "--max-message-bytes" in args else 64 * 1024
        self.canary: CanaryProcess | None = None
        self.baseline: MetricsView | None = None
        self.rss_baseline_mb = 0.0

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def __enter__(self) -> "Campaign":
        self.server.__enter__()
        try:
            asyncio.run(self._warm_up())
            self.baseline = asyncio.run(self._metrics())
            self.rss_baseline_mb = self.server.rss_mb()
            self.canary = CanaryProcess(self.server.ws_url, self.api_key)
        except BaseException:
            self.server.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.canary is not None and self.canary.proc.poll() is None:
            self.canary.stop()
        self.server.__exit__(*exc)

    async def _metrics(self) -> MetricsView:
        import aiohttp
        async with aiohttp.ClientSession() as s:
            return await self.server.metrics(s)

    async def _warm_up(self) -> None:
        """Every protocol and audio format once, so that what is allocated once per process (codec
        libraries, tokenizer and allocator pools) is in the RSS baseline, not counted as growth."""
        from tests.fuzz.endpoints import warm_up
        await warm_up(self)

    # ----- phases -----
    def begin(self, name: str, max_gap_ms: float = MAX_GAP_MS) -> Phase:
        asyncio.run(self._quiet())
        m = asyncio.run(self._metrics())
        if self.canary is not None:
            self.canary.mark()       # the phase's window starts now
        return Phase(name, self.server.log_mark(), m.total("talkgate_errors_total"),
                     m.get("talkgate_errors_total", code="internal_error") or 0.0, max_gap_ms=max_gap_ms)

    async def _quiet(self, timeout_s: float = 60.0) -> None:
        """Wait until the server answers promptly again, so that a stall an earlier phase caused is not
        counted against the next one (the earlier phase has failed for it already)."""
        import aiohttp
        deadline, prompt = time.monotonic() + timeout_s, 0
        async with aiohttp.ClientSession() as s:
            while prompt < 3 and time.monotonic() < deadline:
                t = time.monotonic()
                status = await self.server.health(s)
                prompt = prompt + 1 if status == 200 and time.monotonic() - t < 0.5 else 0
                await asyncio.sleep(0.2)

    def end(self, phase: Phase, slot_probe: bool = True) -> Phase:
        asyncio.run(self._end_checks(phase, slot_probe))
        phase.write_report()
        return phase

    async def _end_checks(self, phase: Phase, slot_probe: bool) -> None:
        import aiohttp

        if self.canary is not None:
            phase.canary = c = self.canary.mark()
            if "error" in c:
                phase.fail("canary", c["error"])
            else:
                if c["max_gap_ms"] > phase.max_gap_ms:
                    phase.fail("canary gap", f"largest gap between the canary's audio frames {c['max_gap_ms']:.0f} ms "
                               f"(limit {phase.max_gap_ms:.0f}), {c['worst_gap_at_s']} s into the phase")
                if c["frames"] == 0 and c["window_s"] >= 2:
                    phase.fail("canary", "the canary received no audio during the phase")
                for e in c["errors"]:
                    phase.fail("canary error", json.dumps(e)[:300])
                if c["closed"]:
                    phase.fail("canary", f"the canary's connection ended: {c['closed']}")
        if not self.server.alive():
            phase.fail("server died", f"exit status {self.server.proc_server.proc.returncode}")
            return
        async with aiohttp.ClientSession() as s:
            status = await self.server.health(s)
            if status != 200:
                phase.fail("health", f"/health answered {status}")
            await self._settle(phase, s)
            if slot_probe:
                await self._slot_probe(phase, s)
            m = await self.server.metrics(s)
        internal = (m.get("talkgate_errors_total", code="internal_error") or 0.0) - phase.internal_before
        if internal:
            phase.fail("internal_error counted", f"talkgate_errors_total{{code=\"internal_error\"}} rose by {internal:g}")
        counted = m.total("talkgate_errors_total") - phase.errors_before
        if counted < phase.errors_answered:
            phase.fail("errors not counted", f"clients were answered with {phase.errors_answered} errors, "
                       f"/metrics talkgate_errors_total rose by {counted:g}")
        bad = [line.rstrip() for line in self.server.log_lines(phase.log_start) if TRACEBACK.search(line)]
        if bad:
            phase.fail("server log", f"{len(bad)} ERROR/traceback lines, first: " + " | ".join(bad[:3]))

    async def _settle(self, phase: Phase, s, timeout_s: float = 15.0) -> None:
        """Connections back to the canary's one, contexts to at most the canary's (cleanup may take a moment)."""
        canary_conns = 1 if self.canary is not None else 0
        deadline = time.monotonic() + timeout_s
        while True:
            m = await self.server.metrics(s)
            conns = {k: v for k, v in m.by_label("talkgate_connections", "protocol").items() if v}
            extra = {k: v - (canary_conns if k == "native" else 0) for k, v in conns.items()}
            extra = {k: v for k, v in extra.items() if v}
            contexts = m.get("talkgate_contexts_active") or 0.0
            ok = not extra and contexts <= (CANARY_CONTEXTS if self.canary else 0)
            if ok or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)
        if extra:
            phase.fail("connections leaked", f"talkgate_connections beyond the canary's: {extra} "
                       f"{timeout_s:g} s after the phase")
        if contexts > (CANARY_CONTEXTS if self.canary else 0):
            phase.fail("contexts leaked", f"talkgate_contexts_active = {contexts:g} {timeout_s:g} s after the phase "
                       f"(the canary holds at most {CANARY_CONTEXTS})")

    async def _slot_probe(self, phase: Phase, s, timeout_s: float = 10.0) -> None:
        """Take every engine slot the canary does not hold; a leaked slot makes one start fail."""
        from tests.fuzz.endpoints import slot_probe
        want = ENGINE_SLOTS - (CANARY_CONTEXTS if self.canary else 0)
        deadline = time.monotonic() + timeout_s
        while True:
            got, refusals = await slot_probe(self, s, want)
            if got >= want or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        if got < want:
            phase.fail("slots leaked", f"only {got} of the {want} engine slots not held by the canary could be "
                       f"taken; refusals: {refusals[:3]}")

    # ----- the end of a campaign -----
    def final_checks(self, phase: Phase, settle_s: float = 30.0) -> None:
        """After the canary stopped: every gauge at its baseline, RSS within 10% of its baseline."""
        if self.canary is not None:
            last = self.canary.stop()
            self.canary = None
            if "error" in last:
                phase.fail("canary", last["error"])
        asyncio.run(self._final(phase, settle_s))
        phase.write_report()

    async def _final(self, phase: Phase, settle_s: float) -> None:
        import aiohttp

        deadline = time.monotonic() + settle_s
        rss = []
        async with aiohttp.ClientSession() as s:
            while True:
                m = await self.server.metrics(s)
                rss.append(round(self.server.rss_mb(), 1))
                diffs = self._gauge_diffs(m)
                rss_ok = rss[-1] <= self.rss_baseline_mb * (1 + RSS_TOLERANCE)
                if (not diffs and rss_ok) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(1.0)
        for d in diffs:
            phase.fail("metrics not at baseline", d)
        bad = [line.rstrip() for line in self.server.log_lines(phase.log_start) if TRACEBACK.search(line)]
        if bad:
            phase.fail("server log", f"{len(bad)} ERROR/traceback lines, first: " + " | ".join(bad[:3]))
        if not rss_ok:
            phase.fail("memory", f"RSS {rss[-1]:.0f} MB after {settle_s:g} s of settling, baseline "
                       f"{self.rss_baseline_mb:.0f} MB (+{100 * (rss[-1] / self.rss_baseline_mb - 1):.0f}%, limit "
                       f"+{100 * RSS_TOLERANCE:.0f}%); samples {rss[:3]} ... {rss[-3:]}")

    def _gauge_diffs(self, m: MetricsView) -> list[str]:
        b = self.baseline
        out = []
        for name in ("talkgate_contexts_active", "talkgate_engine_running", "talkgate_engine_waiting"):
            if m.summed(name) != b.summed(name):
                out.append(f"{name} = {m.summed(name)}, baseline {b.summed(name)}")
        conns = {k: v for k, v in m.by_label("talkgate_connections", "protocol").items() if v}
        if conns:
            out.append(f"talkgate_connections = {conns}, baseline none")
        free, total = m.summed("talkgate_engine_slots_free"), m.summed("talkgate_engine_slots")
        if free is None or total is None:
            out.append("the server must expose the gauges talkgate_engine_slots (engine context slots) and "
                       "talkgate_engine_slots_free (slots not held by a context)")
        elif free != total:
            out.append(f"talkgate_engine_slots_free = {free:g} of talkgate_engine_slots = {total:g}")
        return out
