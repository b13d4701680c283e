"""`talkgate serve` with worker processes: the supervisor starts one engine process per GPU (one on the CPU
where there is none) and N gateway worker processes sharing the port, restarts any that dies, and on
SIGTERM/SIGINT drains the workers, then stops the engines.

    supervisor (this process: no model, no sockets of its own but the port's, which it hands to every worker)
    ├── engine 0  (processes/engine_process.py; CUDA_VISIBLE_DEVICES = its GPU)   ipc://RUN/engine-0.ipc
    ├── engine 1 ...   (one set per served model: each runs one model's checkpoint; with --colocate the models of
    │                   one GPU share one process: ipc/engine_group.py)
    ├── worker 0  (processes/worker.py: aiohttp accepting from PORT's socket, DEALER to every engine)
    └── worker 1 ...

cli/serve.py binds the port first and holds it, so that it stays reserved while workers come and go (port 0 picks
a free one); every worker gets its socket (pass_fds) and accepts from it once it listens: a new connection goes to
a worker whose loop is free to take it. RUN is a private temporary folder holding the engines' ipc sockets and
the workers' Prometheus files (PROMETHEUS_MULTIPROC_DIR); it is removed at exit. Each worker reports
"listening" / "ready" / "not_ready" on a status pipe; this process prints `talkgate: ready on URL` once
every worker is ready. A child that exits unexpectedly is started again, at once the first time and after
a back-off (1 s doubling to 30 s) while it keeps dying within RESTART_WINDOW_S of its start; the others
carry on (an engine's death fails only its contexts, a worker's closes only its connections).
Children die with the supervisor (talkgate/system/childproc.py), even when it is killed.
"""
from __future__ import annotations

import json
import logging
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from talkgate.processes import mps

log = logging.getLogger("talkgate.supervisor")
RESTART_WINDOW_S = 10.0       # a child that dies sooner after its start is restarted after a back-off
BACKOFF_S = (1.0, 30.0)       # first and longest back-off
WORKER_CAP_SLACK = 1.5        # a worker takes at most this share above an even split of --max-connections
ENGINE_STOP_S = 15.0          # after the workers: how long engines get to stop before SIGKILL


def say(line: str) -> None:
    """One line to stdout in one write: the children write to the same stream."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def worker_cap(max_connections: int, workers: int) -> int:
    """Connections one worker accepts: an even share of the server's limit plus WORKER_CAP_SLACK, since the
    workers share the port's socket and whichever is free takes a connection (a full one leaves it to the others:
    server/acceptor.py), so the split is uneven."""
    return max_connections if workers <= 1 else min(max_connections, math.ceil(WORKER_CAP_SLACK * max_connections / workers))


@dataclass(eq=False)
class Child:
    name: str
    argv: list[str]
    env: dict
    status: bool = False                       # gets a status pipe (workers)
    proc: subprocess.Popen | None = None
    status_r: int | None = None
    started: float = 0.0
    backoff: float = 0.0
    restart_at: float | None = None
    state: str = "starting"                    # the last status line
    exits: int = 0
    model: int | None = None                   # an engine's: the index of its model in Plan.models
    gpu: str | None = None                     # an engine's: its GPU's CUDA_VISIBLE_DEVICES id


@dataclass
class Plan:
    """What to start: built by cli/serve.py from the command line."""
    host: str
    port: int                                  # reserved by serve.py
    models: list[tuple[str, str]]              # (name, checkpoint) of each served model, the default first
    engines: list[dict]                        # per engine: {"device", "cuda_visible", "model": its index in models,
                                               # "args": its model's own engine flags (a models file's max_contexts),
                                               # "memory_share": its share of the GPU's memory, where it has one}
    workers: int
    mps: str = "auto"                          # CUDA MPS for GPUs that several engine processes share: auto|on|off
    engine_args: list[str] = field(default_factory=list)     # --dtype, --max-contexts, --seed ...
    aliases: dict = field(default_factory=dict)              # model name -> its other names (a models file's)
    server: dict = field(default_factory=dict)              # dataclasses.asdict(ServerConfig) (limits: the server's)
    colocate: bool = False                     # the engines of one GPU (or of the CPU) in one engine process
    sockets: list = field(default_factory=list)              # the port's (serve.py's, bound): handed to each worker

    @property
    def listen_fds(self) -> list[int]:
        return [s.fileno() for s in self.sockets]


def engine_processes(plan: Plan) -> list[list[int]]:
    """The engines (their indices in plan.engines) each engine process runs: one each, or with `colocate` those of
    one GPU (or of the CPU) together, in plan order."""
    if not plan.colocate:
        return [[i] for i in range(len(plan.engines))]
    groups: dict = {}
    for i, e in enumerate(plan.engines):
        groups.setdefault((e["device"], e.get("cuda_visible")), []).append(i)
    return list(groups.values())


ENGINE_MAIN = [sys.executable, "-m", "talkgate.processes.engine_process"]


def engine_flags(plan: Plan, i: int, endpoint: str) -> list[str]:
    """The flags of engine `i` of `plan`: the server's engine flags, then its model's own, then its share of the GPU's
    memory and whether other engine processes share its GPU (colocated, its process is its GPU's only one: the other
    models' steps take turns with its own on one thread)."""
    e = plan.engines[i]
    share = ["--memory-share", str(e["memory_share"])] if e.get("memory_share") else []
    others = not plan.colocate and e.get("cuda_visible") in mps.shared_gpus(plan.engines)
    shared = ["--shared-gpu"] if others else []
    return ["--index", str(i), "--endpoint", endpoint, "--model", plan.models[e["model"]][1], "--device", e["device"],
            *plan.engine_args, *e.get("args", ()), *share, *shared]


def engine_argv(plan: Plan, i: int, endpoint: str) -> list[str]:
    """The command line of an engine process that runs engine `i` of `plan` alone."""
    return [*ENGINE_MAIN, *engine_flags(plan, i, endpoint)]


class Supervisor:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.stopping = False
        self.children: list[Child] = []
        self.sel = selectors.DefaultSelector()
        self.announced = {"listening": False, "ready": False}
        self.mps: dict[str, mps.Daemon] = {}       # GPU id -> the MPS daemon its engine processes are clients of

    def run(self) -> int:
        """Start everything, supervise until SIGTERM/SIGINT, drain the workers, stop the engines. -> exit status."""
        plan = self.plan
        host = f"[{plan.host}]" if ":" in plan.host else plan.host
        scheme = "https" if plan.server["ssl_certfile"] else "http"
        self.url = f"{scheme}://{host}:{plan.port}"
        run_dir = tempfile.mkdtemp(prefix="talkgate-")
        metrics_dir = os.path.join(run_dir, "metrics")
        os.mkdir(metrics_dir)
        endpoints = [f"ipc://{run_dir}/engine-{i}.ipc" for i in range(len(plan.engines))]
        base_env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        for group in engine_processes(plan):
            e = plan.engines[group[0]]
            env = dict(base_env)
            if e.get("cuda_visible") is not None:
                env["CUDA_VISIBLE_DEVICES"] = e["cuda_visible"]
            if len(group) == 1:
                i = group[0]
                argv = engine_argv(plan, i, endpoints[i])
                # the model named only where there are several: a one-model server's log reads as it always has
                name = f"engine {i} ({plan.models[e['model']][0]})" if len(plan.models) > 1 else f"engine {i}"
                self.children.append(Child(name, argv, env, model=e["model"], gpu=e.get("cuda_visible")))
                continue
            argv = [*ENGINE_MAIN, "--group", json.dumps([engine_flags(plan, i, endpoints[i]) for i in group])]
            name = "engines " + ", ".join(f"{i} ({plan.models[plan.engines[i]['model']][0]})" for i in group)
            self.children.append(Child(name, argv, env, gpu=e.get("cuda_visible")))
        limits = plan.server["limits"]
        server = {**plan.server, "limits": {**limits, "max_connections": worker_cap(limits["max_connections"],
                                                                                   plan.workers)},
                  "key_limit_share": plan.workers, "audio_dir": os.path.join(run_dir, "audio")}
        models = [{"name": name, "aliases": list(plan.aliases.get(name, ())),
                   "engines": [endpoints[i] for i, e in enumerate(plan.engines) if e["model"] == m]}
                  for m, (name, _) in enumerate(plan.models)]
        for w in range(plan.workers):
            cfg = {"index": w, "host": plan.host, "port": plan.port, "listen_fds": plan.listen_fds,
                   "models": models, "server": server}
            env = {**base_env, "PROMETHEUS_MULTIPROC_DIR": metrics_dir, "TALKGATE_WORKER": json.dumps(cfg)}
            self.children.append(Child(f"worker {w}", [sys.executable, "-m", "talkgate.processes.worker"], env, True))
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGUSR1, self._on_drain)
        signal.signal(signal.SIGHUP, self._on_reload)
        self.sel.register(wake_r, selectors.EVENT_READ, None)
        log.info("supervisor (pid %d): %d engine process(es), %d worker(s), port %d, run folder %s", os.getpid(),
                 len(plan.engines), plan.workers, plan.port, run_dir)
        try:
            self._start_mps(run_dir)
            for child in self.children:
                self._start(child)
            while not self.stopping:
                self._turn(wake_r)
            say("talkgate: shutting down")
            self._shutdown()
        finally:
            signal.set_wakeup_fd(-1)
            for child in self.children:
                if child.proc is not None and child.proc.poll() is None:
                    child.proc.kill()
                    child.proc.wait()
            for daemon in self.mps.values():
                mps.stop(daemon)
            shutil.rmtree(run_dir, ignore_errors=True)
        say("talkgate: stopped")
        return 0

    def _on_drain(self, signum, frame) -> None:
        """A worker asked for the whole server's drain (POST /admin/drain): every worker drains and stays up."""
        for c in self.children:
            if c.status and c.proc is not None and c.proc.poll() is None:
                c.proc.send_signal(signal.SIGUSR1)

    def _on_reload(self, signum, frame) -> None:
        """SIGHUP: every worker reloads the keys file (server/keys.py); nothing stops."""
        for c in self.children:
            if c.status and c.proc is not None and c.proc.poll() is None:
                c.proc.send_signal(signal.SIGHUP)

    def _on_signal(self, signum, frame) -> None:
        if self.stopping:                   # a second signal: the workers cut their drain short
            for c in self.children:
                if c.status and c.proc is not None and c.proc.poll() is None:
                    c.proc.send_signal(signal.SIGTERM)
        self.stopping = True

    def _start_mps(self, run_dir: str) -> None:
        """A CUDA MPS daemon for each GPU that several engine processes share (processes/mps.py), as --mps says:
        auto starts one where it can and says where it cannot; on stops the start (MpsError) where it cannot."""
        gpus = [] if self.plan.colocate else mps.shared_gpus(self.plan.engines)   # colocated: one process a GPU
        if not gpus:
            return
        if self.plan.mps == "off":
            log.warning("GPU(s) %s: several engine processes each, without CUDA MPS (--mps off): their GPU work "
                        "takes turns", ", ".join(gpus))
            return
        outside = mps.system_daemon()
        if outside is not None:
            log.info("GPU(s) %s: several engine processes each, clients of the MPS daemon at %s",
                     ", ".join(gpus), outside)
            return
        for gpu in gpus:
            try:
                self.mps[gpu] = mps.start(gpu, os.path.join(run_dir, f"mps-{gpu}"))
            except mps.MpsError as e:
                if self.plan.mps == "on":
                    raise
                log.warning("GPU %s: its engine processes run without CUDA MPS, their GPU work taking turns: %s",
                            gpu, e)
                continue
            n = sum(1 for c in self.children if c.gpu == gpu)
            log.info("GPU %s: its %d engine processes are clients of a CUDA MPS daemon (pid %d)", gpu, n,
                     self.mps[gpu].proc.pid)

    def _engine_env(self, child: Child) -> dict:
        """A child's environment: an MPS client's for an engine whose GPU has a live daemon."""
        daemon = self.mps.get(child.gpu)
        if daemon is None:
            return child.env
        if daemon.proc.poll() is None:
            return daemon.client_env(child.env)
        if not daemon.exit_said:
            daemon.exit_said = True
            log.warning("GPU %s: its MPS daemon exited with status %s: engine processes started from now on run "
                        "without MPS", daemon.gpu, daemon.proc.returncode)
        return child.env

    # ----- children -----
    def _start(self, child: Child) -> None:
        pass_fds = ()
        if child.status:
            r, w = os.pipe()
            child.env["TALKGATE_WORKER"] = json.dumps({**json.loads(child.env["TALKGATE_WORKER"]), "status_fd": w})
            pass_fds = (w, *self.plan.listen_fds)
        argv = child.argv
        if self._sibling_serves(child):
            # a restart while another engine carries the model: no context needs this one soon, so it captures
            # every graph first instead of between steps under load (each capture holds its thread up to ~1 s)
            argv = [*argv, "--every-graph"]
        # a session of its own: a terminal's Ctrl-C reaches the supervisor alone, which stops workers first
        child.proc = subprocess.Popen(argv, env=self._engine_env(child), pass_fds=pass_fds, start_new_session=True)
        child.started, child.restart_at, child.state = time.monotonic(), None, "starting"
        if child.status:
            os.close(w)
            child.status_r = r
            self.sel.register(r, selectors.EVENT_READ, child)

    def _sibling_serves(self, child: Child) -> bool:
        """An engine started again while another engine process of its model runs."""
        return child.model is not None and child.exits > 0 and any(
            c is not child and c.model == child.model and c.proc is not None and c.proc.poll() is None
            for c in self.children)

    def _turn(self, wake_r: int) -> None:
        for key, _ in self.sel.select(timeout=0.2):
            if key.data is None:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
                continue
            self._status(key.data)
        now = time.monotonic()
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at and not self.stopping:
                    self._start(child)
            elif child.proc.poll() is not None:
                self._exited(child, now)

    def _status(self, child: Child) -> None:
        try:
            data = os.read(child.status_r, 4096)
        except OSError:
            data = b""
        if not data:                                      # the child closed it (exited)
            self.sel.unregister(child.status_r)
            os.close(child.status_r)
            child.status_r = None
            return
        said = data.decode().split()            # one read may hold several lines: "listening", then "not_ready"
        child.state = said[-1]
        workers = [c for c in self.children if c.status]
        url = self.url
        if not self.announced["listening"] and "listening" in said:
            self.announced["listening"] = True
            say(f"talkgate: listening on {url} (warming up)")
        if not self.announced["ready"] and all(c.state == "ready" for c in workers):
            self.announced["ready"] = True
            say(f"talkgate: ready on {url}")

    def _exited(self, child: Child, now: float) -> None:
        code = child.proc.returncode
        child.exits += 1
        if child.status_r is not None:
            self._status(child)                            # read what it said last, close the pipe
        if child.status:
            from prometheus_client import multiprocess
            multiprocess.mark_process_dead(child.proc.pid, child.env["PROMETHEUS_MULTIPROC_DIR"])
        if self.stopping:
            return
        how = f"signal {-code}" if code < 0 else f"status {code}"
        quick = now - child.started < RESTART_WINDOW_S
        child.backoff = min(BACKOFF_S[1], max(BACKOFF_S[0], 2 * child.backoff)) if quick else 0.0
        child.restart_at = now + child.backoff
        say(f"talkgate: {child.name} (pid {child.proc.pid}) exited with {how}: restarting"
            + (f" in {child.backoff:g} s" if child.backoff else ""))

    def _shutdown(self) -> None:
        """SIGTERM the workers (each drains: contexts finish up to the shutdown deadline, then 1001), wait;
        then the engines."""
        deadline_s = self.plan.server["shutdown_deadline_s"] + 10.0
        workers = [c for c in self.children if c.status]
        engines = [c for c in self.children if not c.status]
        for group, wait_s in ((workers, deadline_s), (engines, ENGINE_STOP_S)):
            live = [c for c in group if c.proc is not None and c.proc.poll() is None]
            for c in live:
                c.proc.send_signal(signal.SIGTERM)
            end = time.monotonic() + wait_s
            for c in live:
                try:
                    c.proc.wait(max(0.1, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop in %g s: killing it", c.name, wait_s)
                    c.proc.kill()
                    c.proc.wait()
            if group is workers:            # the port closes with the last worker: refused, not queued, from here on
                for sock in self.plan.sockets:
                    sock.close()

