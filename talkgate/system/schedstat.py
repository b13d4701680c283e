"""Where a thread's time went, as Linux's scheduler counts it for that thread: time on a CPU, and time ready to run
but waiting for one (/proc/thread-self/schedstat: run time, run-queue wait, time slices).

A real-time loop can be late for reasons that step times and loop lag cannot tell apart: its own work, other
processes holding the cores it could run on (a load generator on the same box, more busy processes than cores), or
time it was not running at all, by its own choice (blocked) or a hypervisor's (steal: where the guest kernel
accounts for steal, time stolen while the thread runs is left out of its run time). The engine process's loop
thread and each worker's event-loop thread export their wait for a CPU (/metrics), and the engine's slow turns are
logged with all three. Linux only, and only where the kernel keeps schedstat (CONFIG_SCHED_INFO): elsewhere `read`
returns None and the series are left out.
"""
from __future__ import annotations

import os

SCHEDSTAT = "/proc/thread-self/schedstat"


class SchedStat:
    """The figures of the thread that made this object (its file is opened once; a read is one pread)."""

    def __init__(self, path: str = SCHEDSTAT):
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self) -> tuple[float, float] | None:
        """(seconds on a CPU, seconds waiting for one) since the thread started; None where the kernel does not say."""
        if self._fd is None:
            return None
        try:
            ran, waited = os.pread(self._fd, 128, 0).split()[:2]
            return int(ran) / 1e9, int(waited) / 1e9
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
