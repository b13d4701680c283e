"""CUDA MPS for the engine processes that share a GPU.

Without it the CUDA contexts of several processes on one GPU take turns (time slices): nothing of one runs while
another's kernels do, so each engine's step lasts as long as all of theirs together (three 1.7B models at 20 req/s
each: steps of 32 ms where one alone takes 6-10, first audio p95 93 ms against 22; docs/benchmarks.md "Several
models"). Under MPS their kernels run side by side in one server context.

The supervisor starts one control daemon per shared GPU (`nvidia-cuda-mps-control -f`, as this user, a private
pipe folder in the run folder, that GPU alone visible to it), starts its server (`start_server`) to prove it works
before any engine depends on it, and gives the engine processes of that GPU the daemon's pipe folder in place of
CUDA_VISIBLE_DEVICES (an MPS client sees the daemon's GPUs, as NVIDIA's guide says to start one). It quits the
daemons after the engines have stopped. A GPU's settings (compute mode) are left as they are. An engine started
again after its GPU's daemon died gets its CUDA_VISIBLE_DEVICES back and runs without MPS (a client that cannot
reach a daemon runs without one, and would then see every GPU).
"""
from __future__ import annotations

import collections
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass

from talkgate.system.childproc import die_with_parent

log = logging.getLogger("talkgate.mps")
CONTROL = "nvidia-cuda-mps-control"
MODES = ("auto", "on", "off")
READY_S = 15.0                 # for the daemon's control pipe and then its server to come up
QUIT_S = 10.0                  # for a daemon to quit once asked


class MpsError(Exception):
    """MPS was asked for (--mps on) and cannot be had: the reason."""


def shared_gpus(engines: list[dict]) -> list[str]:
    """The GPUs (their CUDA_VISIBLE_DEVICES ids) that several engine processes of a plan share, in plan order."""
    counts = collections.Counter(e["cuda_visible"] for e in engines
                                 if e["device"] == "cuda" and e.get("cuda_visible") is not None)
    return [gpu for gpu, n in counts.items() if n > 1]


def _mps_env(folder: str) -> dict:
    """The pipe and log folders of the daemon whose folder is `folder`, as its clients and itself name them."""
    return {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(folder, "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": os.path.join(folder, "log")}


def system_daemon() -> str | None:
    """Where an MPS daemon already serves this process's CUDA clients (CUDA_MPS_PIPE_DIRECTORY, or the default
    /tmp/nvidia-mps), else None: then the engines are its clients already and no daemon of ours is started."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    return pipe if os.path.exists(os.path.join(pipe, "control")) else None


@dataclass
class Daemon:
    gpu: str
    folder: str                 # its pipe and log folders are in here
    proc: subprocess.Popen
    exit_said: bool = False

    def client_env(self, env: dict) -> dict:
        """`env` of an engine process of this GPU made an MPS client of this daemon."""
        return {**{k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}, **_mps_env(self.folder)}

    def ask(self, command: str) -> str:
        """One control command (`get_server_list`, `quit` ...): its answer."""
        done = subprocess.run([CONTROL], input=command + "\n", env={**os.environ, **_mps_env(self.folder)},
                              capture_output=True, text=True, timeout=QUIT_S)
        return done.stdout.strip()


def start(gpu: str, folder: str) -> Daemon:
    """A control daemon for GPU `gpu` with its server running, or MpsError saying why not."""
    if shutil.which(CONTROL) is None:
        raise MpsError(f"{CONTROL} is not on PATH (it comes with the NVIDIA driver's utilities)")
    own = _mps_env(folder)
    for sub in own.values():
        os.makedirs(sub, exist_ok=True)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu, **own}
    # -f logs to stdout, not to its log folder; it dies with the supervisor (set before exec), even a killed one
    with open(os.path.join(own["CUDA_MPS_LOG_DIRECTORY"], "control.log"), "ab") as logfile:
        proc = subprocess.Popen([CONTROL, "-f"], env=env, stdin=subprocess.DEVNULL, stdout=logfile,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent)
    daemon = Daemon(gpu, folder, proc)
    end = time.monotonic() + READY_S
    try:
        while not os.path.exists(os.path.join(own["CUDA_MPS_PIPE_DIRECTORY"], "control")):
            if proc.poll() is not None:
                raise MpsError(f"{CONTROL} exited with status {proc.returncode} at start ({_why(folder)})")
            if time.monotonic() > end:
                raise MpsError(f"{CONTROL} made no control pipe in {READY_S:g} s")
            time.sleep(0.05)
        daemon.ask(f"start_server -uid {os.getuid()}")
        while not daemon.ask("get_server_list"):
            if time.monotonic() > end:
                raise MpsError(f"the MPS server did not start in {READY_S:g} s ({_why(folder)})")
            time.sleep(0.1)
    except MpsError:
        stop(daemon)
        raise
    except (OSError, subprocess.SubprocessError) as e:
        stop(daemon)
        raise MpsError(f"{CONTROL}: {e}") from None
    return daemon


def _why(folder: str) -> str:
    """The daemon's last log line, which says why it failed."""
    try:
        with open(os.path.join(folder, "log", "control.log")) as f:
            lines = f.read().strip().splitlines()
        return lines[-1] if lines else "its log is empty"
    except OSError:
        return "no log"


def stop(daemon: Daemon) -> None:
    """Quit the daemon (and with it its server); killed if it does not go."""
    if daemon.proc.poll() is None:
        try:
            daemon.ask("quit")
            daemon.proc.wait(QUIT_S)
        except (OSError, subprocess.SubprocessError):
            log.warning("GPU %s: the MPS daemon did not quit in %g s: killing it", daemon.gpu, QUIT_S)
            daemon.proc.kill()
            daemon.proc.wait()
