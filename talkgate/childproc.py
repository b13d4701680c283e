"""What a child process of talkgate's does first: die with the process that started it (the supervisor's
engines and workers, an engine's compile helpers), so that no child outlives a parent killed with SIGKILL."""
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
