"""talkgate's child processes: how many the cores allow (workers, compile helpers, bytecode compilers), and what
each does first: die with the process that started it (the supervisor's engines and workers, an engine's compile
helpers), so that no child outlives a parent killed with SIGKILL."""
from __future__ import annotations

import ctypes
import os
import signal


def die_with_parent() -> None:
    """SIGTERM to this process when its parent goes away, even by SIGKILL (Linux PR_SET_PDEATHSIG; a no-op
    elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)           # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:                      # the parent died before the call
        os.kill(os.getpid(), signal.SIGTERM)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, a container's cpuset; all of them where the platform
    has no affinity)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
