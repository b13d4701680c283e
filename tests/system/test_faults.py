"""Faults of a real `talkgate serve` (supervisor, engine processes, gateway workers; tiny checkpoint, CPU, real
sockets): a process killed mid-stream takes down only what it held, the others keep streaming the audio they
would have streamed anyway, and the supervisor restarts it."""
from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import aiohttp
import numpy as np

from talkgate.processes.supervisor import worker_cap
from tests.serverproc import TalkgateServer
from tests.system.test_gateway import GREEDY, connect, pcm16

TEXT = "Streaming on while another process goes down."
FRAMES = 120


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 240))


async def metrics(s, srv) -> dict:
    from talkgate.loadgen.measure import parse_prometheus
    async with s.get(srv.url + "/metrics") as r:
        return parse_prometheus(await r.text())


def series(values: dict, name: str, **labels) -> float | None:
    return values.get((name, tuple(sorted(labels.items()))))


async def start(c, cid: str) -> None:
    await c.send(type="context.start", context_id=cid, sampling=GREEDY, fixed_frames=FRAMES)
    await c.send(type="text", context_id=cid, text=TEXT)
    await c.send(type="flush", context_id=cid)


async def finish(c, cid: str) -> dict | None:
    """The context's last event (context.done or error), or None when the connection closed."""
    try:
        return await c.until(lambda e: e["type"] in ("context.done", "error") and e.get("context_id") == cid, 120)
    except (AssertionError, aiohttp.ClientError, ConnectionError):
        return None


def pids(srv, kind: str) -> dict[int, int]:
    """Index -> pid of the live engine or worker processes, from their log lines (the latest wins)."""
    pattern = {"engine": r"engine (\d+): .* \(pid (\d+)\)", "worker": r"worker (\d+) \(pid (\d+)\) listening"}[kind]
    return {int(i): int(p) for i, p in re.findall(pattern, srv.log())}


async def wait_for(pred, timeout=90.0, step=0.2):
    deadline = time.monotonic() + timeout
    while not await pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(step)


async def reference(s, srv) -> np.ndarray:
    c = await connect(s, srv)
    await start(c, "ref")
    done = await finish(c, "ref")
    assert done["type"] == "context.done" and done["frames"] == FRAMES
    await c.ws.close()
    return pcm16(next(iter(c.audio.values())))


def same_audio(c, ref) -> bool:
    got = pcm16(next(iter(c.audio.values())))
    return got.shape == ref.shape and np.abs(got - ref).max() <= 2 / 32768


def test_killed_engine_fails_only_its_contexts_and_is_restarted(tiny_checkpoint):
    with TalkgateServer(tiny_checkpoint, "--engines", "2", "--workers", "2", "--max-contexts", "4",
                        "--decoder-dtype", "float32") as srv:
        async def go():
            async with aiohttp.ClientSession() as s:
                ref = await reference(s, srv)
                clients = [await connect(s, srv) for _ in range(4)]
                for i, c in enumerate(clients):
                    await start(c, f"c{i}")
                for c in clients:
                    await c.until(lambda e: e["type"] == "timing")          # audio is flowing
                before = await metrics(s, srv)
                used = (series(before, "talkgate_engine_slots", engine="0")
                        - series(before, "talkgate_engine_slots_free", engine="0"))
                os.kill(pids(srv, "engine")[0], signal.SIGKILL)

                # readiness: engine 0 is down, read at once (on a slow machine its restart can be done before
                # the other contexts end)
                async def down():
                    return series(await metrics(s, srv), "talkgate_engine_ready", engine="0") == 0.0
                await wait_for(down, timeout=10.0)
                ends = [await finish(c, f"c{i}") for i, c in enumerate(clients)]
                failed = [e for e in ends if e["type"] == "error"]
                assert all(e["code"] == "engine_failed" and e["fatal"] for e in failed), failed
                assert len(failed) == used and 0 < used < 4
                for c, e in zip(clients, ends):
                    if e["type"] == "context.done":
                        assert e["frames"] == FRAMES and same_audio(c, ref)
                # the server stays up on engine 1 while engine 0 restarts
                async with s.get(srv.url + "/health") as r:
                    assert r.status == 200

                async def back():             # each of 3 scrapes (any worker answers) sees it ready again
                    return all([series(await metrics(s, srv), "talkgate_engine_ready", engine="0") == 1.0
                                for _ in range(3)])
                await wait_for(back)
                # restarted beside engine 1, engine 0 captures every graph before it is ready (none of its
                # captures then stalls a context); engine 1 was a first start
                argv = {i: open(f"/proc/{p}/cmdline").read().split("\0") for i, p in pids(srv, "engine").items()}
                assert "--every-graph" in argv[0] and "--every-graph" not in argv[1], argv
                assert all(a[a.index("--decoder-dtype") + 1] == "float32" for a in argv.values()), argv  # serve's flag
                again = [await connect(s, srv) for _ in range(4)]
                for i, c in enumerate(again):
                    await start(c, f"d{i}")
                ends = [await finish(c, f"d{i}") for i, c in enumerate(again)]
                assert all(e["type"] == "context.done" and same_audio(c, ref) for c, e in zip(again, ends)), [e.get("message") for e in ends]
                after = await metrics(s, srv)
                return after

        after = run(go())
        assert "talkgate: engine 0" in srv.log() and "restarting" in srv.log()
        assert series(after, "talkgate_errors_total", code="engine_failed") >= 1


def test_killed_worker_closes_only_its_connections_and_is_restarted(tiny_checkpoint):
    # Every client connected below opens a context. Whichever worker's loop reaches the shared socket first takes a
    # connection, and on a busy build machine one worker took 32 in a row: --max-connections 8 caps each worker at 6,
    # so that by the 7th a full worker leaves the next to the other (server/acceptor.py); the bound leaves a gauge
    # that comes late room up to the server's 12.
    cap, slots = worker_cap(8, 2), 16
    with TalkgateServer(tiny_checkpoint, "--workers", "2", "--max-contexts", str(slots),
                        "--max-connections", "8") as srv:
        async def go():
            async with aiohttp.ClientSession() as s:
                ref = await reference(s, srv)
                clients = []

                async def both_workers_hold_one():
                    assert len(clients) < 2 * cap, f"{len(clients)} connections and one worker still holds none"
                    clients.append(await connect(s, srv))
                    await asyncio.sleep(0.6)            # workers sample their gauges every 0.5 s
                    m = await metrics(s, srv)
                    return all((series(m, "talkgate_worker_connections", worker=str(w)) or 0) >= 1 for w in (0, 1))
                await wait_for(both_workers_hold_one, step=0)
                held = series(await metrics(s, srv), "talkgate_worker_connections", worker="0")
                for i, c in enumerate(clients):
                    await start(c, f"c{i}")
                for c in clients:
                    await c.until(lambda e: e["type"] == "timing")
                os.kill(pids(srv, "worker")[0], signal.SIGKILL)
                ends = [await finish(c, f"c{i}") for i, c in enumerate(clients)]
                closed = sum(e is None for e in ends)
                assert closed == held, (ends, held)
                for c, e in zip(clients, ends):
                    if e is not None:
                        assert e["type"] == "context.done" and e["frames"] == FRAMES and same_audio(c, ref), e

                async def restarted():
                    return len(re.findall(r"worker 0 \(pid \d+\) listening", srv.log())) == 2
                await wait_for(restarted)
                again = [await connect(s, srv) for _ in range(6)]
                for i, c in enumerate(again):
                    await start(c, f"d{i}")
                ends = [await finish(c, f"d{i}") for i, c in enumerate(again)]
                assert all(e["type"] == "context.done" for e in ends), ends
                return await metrics(s, srv)

        after = run(go())
        assert series(after, "talkgate_contexts_active") == 0.0
        assert "talkgate: worker 0" in srv.log()


def test_a_worker_whose_loop_is_stopped_leaves_new_connections_to_the_others(tiny_checkpoint):
    """The workers accept from one socket (server/listen.py shared): a connection goes to a worker free to take it.
    With a socket each (SO_REUSEPORT) the kernel would queue about half of them behind the stopped worker."""
    with TalkgateServer(tiny_checkpoint, "--workers", "2", "--max-contexts", "16") as srv:
        stopped = pids(srv, "worker")[0]

        async def go():
            async with aiohttp.ClientSession() as s:
                await (await connect(s, srv)).ws.close()
                os.kill(stopped, signal.SIGSTOP)
                try:
                    clients = [await asyncio.wait_for(connect(s, srv), 5) for _ in range(12)]
                    await start(clients[0], "c0")
                    done = await finish(clients[0], "c0")
                    assert done is not None and done["type"] == "context.done", done
                finally:
                    os.kill(stopped, signal.SIGCONT)
                for c in clients:
                    await c.ws.close()
        run(go())


def test_a_full_worker_leaves_new_connections_to_the_others(tiny_checkpoint):
    """--max-connections 4 over two workers: each takes 3 at most (supervisor.worker_cap). Six connections all open
    (a full worker leaves the next to the other, server/acceptor.py); the seventh is refused with 1013 at once."""
    with TalkgateServer(tiny_checkpoint, "--workers", "2", "--max-contexts", "16", "--max-connections", "4") as srv:
        async def go():
            async with aiohttp.ClientSession() as s:
                clients = [await asyncio.wait_for(connect(s, srv), 5) for _ in range(6)]
                await asyncio.sleep(0.6)            # workers sample their gauges every 0.5 s
                m = await metrics(s, srv)
                assert [series(m, "talkgate_worker_connections", worker=str(w)) for w in (0, 1)] == [3, 3]
                t0 = time.monotonic()
                ws = await s.ws_connect(srv.ws_url + "/v1/ws")
                msg = await asyncio.wait_for(ws.receive(), 5)
                while msg.type == aiohttp.WSMsgType.TEXT:       # the protocol's error event, then the close
                    msg = await asyncio.wait_for(ws.receive(), 5)
                assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED) and ws.close_code == 1013, msg
                assert time.monotonic() - t0 < 2
                for c in clients:
                    await c.ws.close()
        run(go())


def test_a_stalled_warm_up_ends_the_engine_process_which_is_started_again(tiny_checkpoint):
    # --warmup-stall far below one warm-up step: every warm-up "stalls", as a hung compile does on a GPU
    with TalkgateServer(tiny_checkpoint, "--workers", "1", "--warmup-stall", "0.002", wait=None) as srv:
        said = srv.wait_output("warm-up made no progress for", 120)
        assert "engine 0: " in said and "exiting with status 75" in said
        srv.wait_output("most recent call first", 30)                # every thread's stack, for the operator
        deadline = time.monotonic() + 120
        while srv.log().count("engine 0 (pid") < 2:                  # restarted, it stalls again: still up
            assert time.monotonic() < deadline, srv.log()[-3000:]
            time.sleep(0.2)
        assert re.findall(r"engine 0 \(pid \d+\) exited with status 75: restarting", srv.log())
        assert srv.proc.poll() is None and "talkgate: ready" not in srv.log()
        assert srv.stop() == 0


def test_a_stalled_warm_up_ends_a_single_process_server_with_status_75(tiny_checkpoint):
    with TalkgateServer(tiny_checkpoint, "--workers", "0", "--warmup-stall", "0.002", wait="listening") as srv:
        assert srv.proc.wait(120) == 75
        assert "engine: warm-up made no progress for" in srv.log() and "talkgate: ready" not in srv.log()
