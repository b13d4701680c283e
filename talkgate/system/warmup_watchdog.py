"""A bound on an engine's warm-up: a process whose warm-up makes no progress for `stall_s` seconds ends itself,
so that its supervisor (or the operator's) starts it again instead of /ready answering 503 for ever.

Progress is one more step of Runner.warmup done (its warmup_profile grows: one compile, one eager run at the
largest batch, one graph captured). A fresh 1.7B warm-up on an H100 has steps of up to a minute (a Triton
compile of the persistent kernel for a new row count, 41 s); a hung one has been seen to wait for ever on one
of Inductor's parallel Triton compiles (no CPU, no GPU: docs/benchmarks.md, issue 22). What it was waiting
for goes to stderr (every thread's stack) before the exit. The compile cache keeps what was compiled before
the stall, so the next start goes faster.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time

log = logging.getLogger("talkgate.warmup")
DEFAULT_STALL_S = 600.0
STALLED_EXIT = 75             # EX_TEMPFAIL: try again


class WarmupWatchdog:
    """with WarmupWatchdog(runner, stall_s, name): ...warm-up...  (the check runs on a thread of its own)."""

    def __init__(self, runner, stall_s: float, name: str):
        self.runner, self.stall_s, self.name = runner, stall_s, name
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="talkgate-warmup-watchdog", daemon=True)

    def __enter__(self) -> WarmupWatchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        steps, since = len(self.runner.warmup_profile), time.monotonic()
        while not self._done.wait(min(5.0, self.stall_s / 4)):
            now, done = time.monotonic(), len(self.runner.warmup_profile)
            if done != steps:
                steps, since = done, now
            elif now - since >= self.stall_s:
                last = self.runner.warmup_profile[-1][0] if steps else "none yet"
                log.critical("%s: warm-up made no progress for %.3g s (steps done: %d, the last: %s): exiting with "
                             "status %d so that it is started again; every thread's stack follows", self.name,
                             now - since, steps, last, STALLED_EXIT)
                for h in logging.getLogger().handlers:
                    h.flush()
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                os._exit(STALLED_EXIT)
