"""Start a real `talkgate serve` process on a free port for tests, and stop it.

    with TalkgateServer(model_dir) as srv:
        srv.url        # http://127.0.0.1:PORT
        srv.ws_url     # ws://127.0.0.1:PORT
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

READY = re.compile(r"talkgate: ready on (http://[\d.]+:(\d+))")


class TalkgateServer:
    def __init__(self, model_dir: str | Path, *extra_args: str, timeout_s: float = 180.0, env: dict | None = None):
        self.args = [sys.executable, "-m", "talkgate.gateway.cli", "serve", "--model", str(model_dir),
                     "--port", "0", "--device", "cpu", *extra_args]
        self.timeout_s = timeout_s
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.url = self.ws_url = ""
        self.port = 0
        self.output: list[str] = []

    def __enter__(self) -> "TalkgateServer":
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=self.env, start_new_session=True)
        ready = threading.Event()

        def pump():
            for line in self.proc.stdout:
                self.output.append(line)
                m = READY.search(line)
                if m and not ready.is_set():
                    self.url, self.port = m.group(1), int(m.group(2))
                    self.ws_url = self.url.replace("http://", "ws://")
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + self.timeout_s
        while not ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("talkgate serve did not become ready:\n" + "".join(self.output[-60:]))
        return self

    def log(self) -> str:
        return "".join(self.output)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()

    def __exit__(self, *exc) -> None:
        self.stop()
