"""An engine process: one per GPU (or one on the CPU). It owns the model, scheduler, runner and step loop and
nothing else; gateway workers reach it with the messages of ipc/wire.py, each over a local socket of its own
(ipc/channel.py).

EngineServer is that loop around one started Engine; processes/engine_process.py is the process's main.
One thread, the main one, runs the loop (vLLM's EngineCore shape): take the workers' messages (commands go to
Engine.submit), one turn of the engine (Engine.turn: a step, whose deliver sends each worker its step's events
as one STEP message, or a pending graph capture no context would notice), check the workers' backlogs,
publish stats every STATS_INTERVAL_S; while nothing is ready it waits in poll() on the listening socket and the
workers' sockets, so a command that arrives wakes this thread and no other. Warm-up (compiles and the
first-audio graphs: minutes on a GPU without the compile cache) runs on the main thread first while a second
thread answers HELLOs and publishes stats (state "warming"), so workers learn the model at once, and a third
ends the process if the warm-up stalls (system/warmup_watchdog.py). Nothing is collected while the
model loads; what is alive once it is loaded, after warm-up, and again once every graph is captured, is frozen
out of the garbage collector (system/heap.py).

The engine never waits for a worker. A message goes straight into the worker's socket; what the socket cannot take
at once waits in the connection's queue, which a Flusher thread writes out as the worker reads (channel.py). The
engine counts what each worker has not acknowledged yet. A worker that falls behind (its oldest unacknowledged STEP over
WORKER_LAG_LIMIT_S old, or MAX_UNACKED_BYTES of PCM unacknowledged) gets every open context of its own failed
with code `worker_behind` (those events still reach it, after its backlog), so the queue held for it stays
bounded and the other workers' contexts are not touched; a worker that goes away (its connection closed: a read
finds its end, or a write fails) is disconnected from the engine, which frees its contexts' slots before the next
step. A HELLO from a worker index already known (a restarted worker) replaces the old connection the same way.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import socket
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field

from talkgate.ipc import channel, wire
from talkgate.synth.api import EngineError
from talkgate.system import heap
from talkgate.system.schedstat import SchedStat
from talkgate.system.warmup_watchdog import DEFAULT_STALL_S, WarmupWatchdog

log = logging.getLogger("talkgate.engine_process")
WORKER_LAG_LIMIT_S = 2.0        # a worker this far behind the engine has its contexts failed (worker_behind)
MAX_UNACKED_BYTES = 256 << 20   # ... or with this much of its PCM unacknowledged (about 5 s of 512 streams)
MAX_MESSAGES_PER_TURN = 1000    # messages taken from the sockets between two steps (about: whole reads)
# a worker's lateness is judged on acknowledgements read at most this long ago: the engine thread itself may have
# been held for seconds (a graph capture, up to ~3 s after warm-up; the OS), while its workers acknowledged in time
FRESH_ACKS_S = 0.1
LINGER_S = 1.0                  # at close, how long the last messages may take to leave
# A STEP up to this size is written to its worker's socket by the engine thread itself (a first frame leaves at
# once); a larger one by the Flusher thread beside it (at 256 rows 2 MB a step: the copy would be the engine
# thread's, bench/ipc.py)
DIRECT_BYTES = 64 << 10
SEND_BUFFER = 4 << 20           # a worker socket's send buffer asked for (capped by net.core.wmem_max)
# A turn this long can make a new context's second frame late: at 25 text tokens a second its text id comes 40 ms
# after the first frame's while its audio is due 80 ms after the first frame's, so frame 1 has about 40 ms to
# spare (docs/benchmarks.md, 2026-11-28). Such turns are counted and logged, with where their time went.
SLOW_TURN_S = 0.04
SLOW_TURN_LOG_S = 5.0           # slow turns are summed up in one log line at most this often


@dataclass(eq=False)
class Conn:
    """One accepted connection; its worker's Peer once it said HELLO."""
    sock: socket.socket
    out: channel.Outgoing
    reader: channel.Reader = field(default_factory=channel.Reader)
    peer: "Peer | None" = None


@dataclass(eq=False)
class Peer:
    """One connected gateway worker."""
    conn: Conn
    worker: int
    pid: int
    client: int = 0                                   # its Engine client
    seq: int = 0                                      # STEP messages sent
    unacked: collections.deque = field(default_factory=collections.deque)   # (seq, monotonic sent, bytes)
    unacked_bytes: int = 0
    gone: bool = False
    behind: bool = False


class SlowTurns:
    """The engine loop's turns over SLOW_TURN_S: counted (/metrics), and summed by where their time went in one
    log line at most every SLOW_TURN_LOG_S, so that a stall's cause (the GPU, the cores, the loop's own work) is in
    the log without a line per turn."""

    def __init__(self, engine: int):
        self.engine, self.count = engine, 0            # count: since the process started
        self._logged_at = float("-inf")
        self._clear()

    def _clear(self) -> None:
        self.turns, self.seconds, self.longest = 0, 0.0, 0.0       # since the last log line
        self.receive = self.step = self.gpu_wait = self.ran = self.waited = 0.0
        self.known = True                                           # the thread's schedstat figures, every turn

    def add(self, receive: float, step: float, peers: float, gpu_wait: float,
            thread: tuple[float, float] | None) -> None:
        """One slow turn: its phases (receive, Engine.turn, peers and stats), the time blocked on the GPU in it, and
        the loop thread's (time on a CPU, time waiting for one) in it, None where the kernel does not say."""
        total = receive + step + peers
        self.count += 1
        self.turns += 1
        self.seconds += total
        self.longest = max(self.longest, total)
        self.receive += receive
        self.step += step
        self.gpu_wait += gpu_wait
        if thread is None:
            self.known = False
        else:
            self.ran += thread[0]
            self.waited += thread[1]

    def report(self, now: float) -> None:
        if not self.turns or now - self._logged_at < SLOW_TURN_LOG_S:
            return
        ms = lambda seconds: f"{1000 * seconds:.1f}"
        thread = (f"on a CPU {ms(self.ran)}, waiting for one (other processes on its cores) {ms(self.waited)}, "
                  f"neither (asleep, or stolen by the hypervisor) {ms(self.seconds - self.ran - self.waited)}"
                  if self.known else "unknown (no schedstat)")
        log.warning("engine %d: %d turn(s) over %.0f ms since the last of these lines, the longest %s ms, %s ms in "
                    "all: receiving %s, stepping %s (blocked on the GPU %s of it); its thread %s", self.engine,
                    self.turns, 1000 * SLOW_TURN_S, ms(self.longest), ms(self.seconds), ms(self.receive),
                    ms(self.step), ms(self.gpu_wait), thread)
        self._logged_at = now
        self._clear()


class EngineServer:
    def __init__(self, engine, endpoint: str, index: int, checkpoint: str, warmup_stall_s: float = DEFAULT_STALL_S,
                 poller=None):
        """poller: a select.poll shared with the other EngineServers of its thread (ipc/engine_group.py), else its
        own."""
        self.engine, self.endpoint, self.index, self.checkpoint = engine, endpoint, index, checkpoint
        self.warmup_stall_s = warmup_stall_s
        self.incarnation = os.getpid()
        self.listener = channel.listen(endpoint)      # a dead predecessor's socket file is replaced
        self.flusher = channel.Flusher(f"talkgate-flusher-{index}")
        self.poller = poller if poller is not None else select.poll()
        self.poller.register(self.listener, select.POLLIN)
        self.conns: dict[int, Conn] = {}              # by file descriptor
        self.peers: dict[Conn, Peer] = {}
        self.state = "warming"
        self.step_buckets = [0] * (len(wire.STEP_BUCKETS) + 1)
        self.step_sum = 0.0
        # where the loop's time goes (LOOP_PHASES): which part saturates the engine process under load
        self.loop_s = dict.fromkeys(wire.LOOP_PHASES, 0.0)
        self.schedstat = SchedStat()                  # of this thread, the one that runs the loop (main())
        self.slow_turns = SlowTurns(index)
        engine.on_step = self._on_step
        engine.poll = self._poll
        self._next_stats = 0.0
        self.gc = heap.GcPauses()
        self._graphs_pending = True
        self._idle_from = time.perf_counter()          # the last turn's end (its idle time runs from there)
        self._received_at = time.monotonic()           # the last receive(): acknowledgements read up to then

    # ----- the loop -----
    def warm_up(self, every_graph: bool = False) -> None:
        """Warm the engine up on this thread while a helper thread greets workers and publishes stats."""
        done = threading.Event()

        def greet():
            while not done.is_set():
                self.turn(step=False)
                self.poller.poll(self.idle_ms())
        helper = threading.Thread(target=greet, name="talkgate-greeter", daemon=True)
        helper.start()
        try:
            self.warm_engine(every_graph)
        finally:
            done.set()
            helper.join()            # the socket is this thread's from here on
        self.ready()

    def warm_engine(self, every_graph: bool = False) -> None:
        """The engine's warm-up, ended by its watchdog if it stalls (another thread answers the workers meanwhile)."""
        with WarmupWatchdog(self.engine.runner, self.warmup_stall_s, f"engine {self.index}"):
            self.engine.warm_up(every_graph)

    def ready(self) -> None:
        """After the warm-up: serving from here on (the heap as it is now frozen, collections timed)."""
        heap.freeze(f"engine {self.index} warm")
        self.gc.install()
        self.state = "ready"
        self._next_stats = 0.0
        log.info("engine %d ready (%d slots, steps of at most %d rows)", self.index, self.engine.runner.num_slots,
                 self.engine.runner.max_batch)

    def serve(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if not self.turn(step=True):            # nothing to do: until a command, or the stats
                self.poller.poll(self.idle_ms())
                self.waited()

    def close(self) -> None:
        """Stop: open contexts fail with engine_stopped (sent to their workers, LINGER_S at most to leave), then the
        sockets close."""
        self.state = "stopping"
        self.engine.stop()
        self._publish()
        deadline = time.monotonic() + LINGER_S
        while not self.flusher.idle() and time.monotonic() < deadline:
            time.sleep(0.005)
        self.flusher.close()
        for conn in list(self.conns.values()):
            self._drop(conn)
        self.poller.unregister(self.listener)
        self.listener.close()
        with contextlib.suppress(OSError):
            os.unlink(channel.path_of(self.endpoint))

    def idle_ms(self) -> int:
        """How long an idle loop may wait for its sockets: until the next stats, or once serving until a context that
        sits out for its lead is due (Engine.idle_s), whichever comes first."""
        wait = self._next_stats - time.monotonic()
        if self.state == "ready":
            wait = min(wait, self.engine.idle_s())
        return max(1, int(1000 * wait))

    def turn(self, step: bool) -> bool:
        """Read the workers' messages, a turn of the engine (`step`: after the warm-up), the peers and the stats; True
        where the engine had something to do (the caller waits on the poller when no turn had)."""
        t0 = time.perf_counter()
        if step:
            runner = self.engine.runner
            thread, gpu_wait, captures = self.schedstat.read(), runner.gpu_wait_s, len(runner.capture_ms)
        self.receive()
        t1 = time.perf_counter()
        busy = step and self.engine.turn()
        if self._graphs_pending and step and not self.engine.runner.pending:
            self._graphs_pending = False
            heap.freeze(f"engine {self.index}, every graph captured", serving=True)
        t2 = time.perf_counter()
        self._check_peers()
        now = time.monotonic()
        if now >= self._next_stats:
            self._publish()
            self.slow_turns.report(now)
            self._next_stats = now + wire.STATS_INTERVAL_S
        t3 = time.perf_counter()
        # a graph capture runs only where no context would notice it (Engine.turn): not a slow step
        if step and t3 - t0 > SLOW_TURN_S and len(runner.capture_ms) == captures:
            after = self.schedstat.read()
            in_turn = None if thread is None or after is None else (after[0] - thread[0], after[1] - thread[1])
            self.slow_turns.add(t1 - t0, t2 - t1, t3 - t2, runner.gpu_wait_s - gpu_wait, in_turn)
        loop = self.loop_s
        loop["receive"] += t1 - t0
        loop["turn"] += t2 - t1
        loop["peers"] += t3 - t2
        self._idle_from = t3
        return busy

    def waited(self) -> None:
        """The caller's wait on the poller after a turn that did nothing has ended: the loop's idle time."""
        self.loop_s["idle"] += time.perf_counter() - self._idle_from

    # ----- worker -> engine -----
    def _poll(self) -> None:
        """Engine.poll: the messages that arrived while the engine thread waits for a step beside the first-frame lane
        (a new context's open takes the lane at once, synth/lane.py)."""
        if self.poller.poll(0):
            self.receive()

    def receive(self) -> None:
        """The connections and messages that arrived (nothing waits here)."""
        while (sock := channel.accept(self.listener, SEND_BUFFER)) is not None:
            self.conns[sock.fileno()] = Conn(sock, channel.Outgoing(sock, self.flusher.watch, DIRECT_BYTES))
            self.poller.register(sock, select.POLLIN)
        taken = 0
        for conn in list(self.conns.values()):
            while taken < MAX_MESSAGES_PER_TURN:
                try:
                    if not channel.receive(conn.sock, conn.reader):
                        break
                    messages = conn.reader.messages()
                except (channel.Closed, channel.ProtocolError) as e:
                    self._drop(conn, str(e))
                    break
                taken += len(messages)
                for parts in messages:
                    try:
                        self._handle(conn, parts)
                    except Exception:                       # a malformed message never stops the engine
                        log.exception("bad message from %s", self._who(conn))
        self._received_at = time.monotonic()

    def _handle(self, conn: Conn, parts: list) -> None:
        kind = bytes(parts[0])
        if kind == wire.HELLO:
            worker, pid = wire.decode(parts[1])
            self._hello(conn, worker, pid)
            return
        peer = conn.peer
        if peer is None:
            return                                          # a connection that has not said HELLO
        if kind == wire.COMMANDS:
            ack, commands = wire.decode(parts[1])
            self._ack(peer, ack)
            self.engine.submit(peer.client, [wire.command_from_wire(c) for c in commands])
        elif kind == wire.ACK:
            self._ack(peer, wire.decode(parts[1]))

    def _hello(self, conn: Conn, worker: int, pid: int) -> None:
        for old in [p for p in self.peers.values() if p.worker == worker or p.conn is conn]:
            self.engine.disconnect(old.client)
            del self.peers[old.conn]
            if old.conn is not conn:
                self._drop(old.conn)
            log.info("worker %d reconnected (pid %d, was %d): its contexts here are cancelled", worker, pid, old.pid)
        peer = conn.peer = Peer(conn, worker, pid)
        peer.client = self.engine.connect(lambda events, peer=peer: self._deliver(peer, events))
        self.peers[conn] = peer
        self._send(peer, wire.welcome_message(self.index, self.incarnation, self.engine.info, self.checkpoint,
                                              self._stats()))

    def _drop(self, conn: Conn, why: str = "") -> None:
        """Close a connection; its worker's Peer (if any) is gone, disconnected at the next _check_peers."""
        if self.conns.pop(conn.sock.fileno(), None) is None:
            return
        self.poller.unregister(conn.sock)
        if conn.peer is not None and not conn.peer.gone:
            if why:
                log.warning("%s is gone (%s): cancelling its contexts", self._who(conn), why)
            conn.peer.gone = True
        conn.out.close()
        conn.sock.close()

    @staticmethod
    def _who(conn: Conn) -> str:
        p = conn.peer
        return "a connection that has not said HELLO" if p is None else f"worker {p.worker} (pid {p.pid})"

    def _ack(self, peer: Peer, ack: int) -> None:
        while peer.unacked and peer.unacked[0][0] <= ack:
            peer.unacked_bytes -= peer.unacked.popleft()[2]

    # ----- engine -> worker -----
    def _deliver(self, peer: Peer, events: list) -> None:
        """Engine.run_once's deliver for one worker (engine thread, under the engine's lock)."""
        if peer.gone:
            return
        peer.seq += 1
        frames = wire.step_message(peer.seq, self.engine.free_slots, events)
        if self._send(peer, frames):
            nbytes = frames[2].nbytes
            peer.unacked.append((peer.seq, time.monotonic(), nbytes))
            peer.unacked_bytes += nbytes

    def _send(self, peer: Peer, frames: list) -> bool:
        if peer.conn.out.send(frames):
            return True
        if not peer.gone:
            log.warning("worker %d (pid %d) is gone (%s): cancelling its contexts", peer.worker, peer.pid,
                        peer.conn.out.broken)
        peer.gone = True
        return False

    def _check_peers(self) -> None:
        if time.monotonic() - self._received_at > FRESH_ACKS_S:
            self.receive()
        now = time.monotonic()
        for conn, peer in list(self.peers.items()):
            if peer.gone or conn.out.broken is not None:
                self.engine.disconnect(peer.client)
                del self.peers[conn]
                self._drop(conn)
                continue
            late = peer.unacked and (now - peer.unacked[0][1] > WORKER_LAG_LIMIT_S
                                     or peer.unacked_bytes > MAX_UNACKED_BYTES)
            if late:
                if not peer.behind:
                    log.warning("worker %d is %.1f s behind (%d MB unacknowledged): failing its contexts",
                                peer.worker, now - peer.unacked[0][1], peer.unacked_bytes >> 20)
                self.engine.fail_client(peer.client, EngineError(
                    f"the gateway worker serving this connection fell over {WORKER_LAG_LIMIT_S:g} s behind the "
                    "engine", "worker_behind"))
            peer.behind = bool(late)

    def _on_step(self, ms: float, batch: int) -> None:
        self.step_buckets[bisect_left(wire.STEP_BUCKETS, ms / 1000)] += 1
        self.step_sum += ms / 1000

    def _stats(self) -> dict:
        thread = self.schedstat.read()
        return {**self.engine.stats(), "engine": self.index, "incarnation": self.incarnation, "state": self.state,
                "step_buckets": self.step_buckets, "step_sum": self.step_sum, "cpu_s": time.process_time(),
                "loop_s": self.loop_s, "cpu_wait_s": None if thread is None else thread[1],
                "slow_turns": self.slow_turns.count,
                **self.gc.stats(),
                "workers_behind": sum(p.behind for p in self.peers.values())}

    def _publish(self) -> None:
        message = wire.stats_message(self._stats())
        for peer in list(self.peers.values()):
            self._send(peer, message)
