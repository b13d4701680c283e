"""Start a real `talkgate serve` process on a free port for tests, and stop it.

    with TalkgateServer(model_dir) as srv:
        srv.url        # http://127.0.0.1:PORT (https:// when served with --ssl-certfile)
        srv.ws_url     # ws://127.0.0.1:PORT (wss://)

`wait="listening"` returns as soon as the server answers HTTP, before its warm-up is over; `wait=None` as soon
as the process is started (no URL).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

READY = re.compile(r"talkgate: ready on (https?://[\d.]+:(\d+))")
LISTENING = re.compile(r"talkgate: listening on (https?://[\d.]+:(\d+))")


class TalkgateServer:
    def __init__(self, model_dir: str | Path, *extra_args: str, timeout_s: float = 180.0, env: dict | None = None,
                 wait: str | None = "ready"):
        # model_dir None: no --model (the extra args give the models: --models FILE)
        self.args = [sys.executable, "-m", "talkgate", "serve", *(("--model", str(model_dir)) if model_dir else ()),
                     "--port", "0", "--device", "cpu", *extra_args]
        self.timeout_s = timeout_s
        self.wait = {"ready": READY, "listening": LISTENING, None: None}[wait]
        # the default voice store lives under TALKGATE_DATA: one of its own (removed at the end), never the user's
        self.data = tempfile.mkdtemp(prefix="talkgate-data-")
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "TALKGATE_DATA": self.data, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.url = self.ws_url = ""
        self.port = 0
        self.output: list[str] = []
        self._line = threading.Condition()
        self._pump: threading.Thread | None = None

    def __enter__(self) -> "TalkgateServer":
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=self.env, start_new_session=True)
        ready = threading.Event()

        def pump():
            for line in self.proc.stdout:
                with self._line:
                    self.output.append(line)
                    self._line.notify_all()
                m = self.wait and self.wait.search(line)
                if m and not ready.is_set():
                    self.url, self.port = m.group(1), int(m.group(2))
                    self.ws_url = self.url.replace("http", "ws", 1)
                    ready.set()

        self._pump = threading.Thread(target=pump, name="talkgate-serve-output", daemon=True)
        self._pump.start()
        if self.wait is None:
            return self
        deadline = time.monotonic() + self.timeout_s
        while not ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)         # no `with` calls it when __enter__ raises
                raise RuntimeError("talkgate serve did not become ready:\n" + "".join(self.output[-60:]))
        return self

    def log(self) -> str:
        return "".join(self.output)

    def wait_output(self, text: str, timeout_s: float = 30.0) -> str:
        """The first output line containing `text`, waiting up to timeout_s for it."""
        deadline = time.monotonic() + timeout_s
        with self._line:
            while (hit := next((line for line in self.output if text in line), None)) is None:
                if time.monotonic() > deadline:
                    raise AssertionError(f"no output line with {text!r}:\n" + "".join(self.output[-40:]))
                self._line.wait(0.2)
        return hit

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()

    def kill(self) -> None:
        """SIGKILL the server and every process it started, at once, as when its host or container dies (a
        supervisor killed alone takes its children down gracefully: they get SIGTERM and drain)."""
        os.kill(self.proc.pid, signal.SIGSTOP)            # no restarts while its children go
        for pid in descendants(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.kill()
        self.proc.wait()

    def __exit__(self, *exc) -> None:
        self.stop()
        # The output's reader sees EOF once every process of the server has exited; then this end of the pipe is
        # closed here, not left to the garbage collector. A reader still blocked is left (closing the pipe under it
        # would wait for its read): the session's leak check names it, and the server process that holds the pipe.
        self._pump.join(30)
        if not self._pump.is_alive():
            self.proc.stdout.close()
        shutil.rmtree(self.data, ignore_errors=True)


def descendants(pid: int) -> list[int]:
    """Every live process below pid, from /proc (children before their own children)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(0), [])
        found += kids
        todo += kids
    return found
