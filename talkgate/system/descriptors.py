"""Room for a process's sockets, made when it starts rather than in the middle of serving.

Linux grows a process's descriptor table by doubling it (64, 128, 256, ... entries) the first time it hands out a
descriptor number past the table's end. When the process has more than one thread, the socket(), accept() or
open() call that does so waits for an RCU grace period (expand_fdtable calls synchronize_rcu): 18-56 ms on the
GPU machines, an event loop stalled with every stream on it. In the 512-stream benchmark every client process
stalled like that as it passed 64 and 128 sockets, and most underruns of the ramp came from it (docs/benchmarks.md,
2026-11-28). A table never shrinks, so one grown at the start holds for the process's life: a gateway worker
(whose table starts at 256) or a single-process server that holds more connections than that would otherwise stall
at 256, 512, ... Linux only; elsewhere `reserve` just returns.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger("talkgate.descriptors")

SPARE = 256     # descriptors beside the connections: files, pipes, the engines' sockets, the log


def reserve(count: int) -> int:
    """Room for `count` descriptors: raise this process's soft limit (RLIMIT_NOFILE) to `count` where the hard
    limit allows, and grow its descriptor table to hold that many now. -> the descriptors it has room for
    (less than `count` where the hard limit is lower, which is logged)."""
    try:
        import fcntl
        import resource
    except ImportError:                 # not a Unix
        return count
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = count if hard == resource.RLIM_INFINITY else min(count, hard)
    if soft != resource.RLIM_INFINITY and soft < room:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (room, hard))
            soft = room
        except (ValueError, OSError) as e:
            log.warning("the open-file limit stays at %d (raising it to %d failed: %s)", soft, room, e)
    if soft != resource.RLIM_INFINITY:
        room = min(room, soft)
    if room < count:
        log.warning("room for %d open files, fewer than the %d wanted: raise the hard limit (ulimit -Hn)",
                    room, count)
    try:
        fd = os.open(os.devnull, os.O_RDONLY)
        try:
            os.close(fcntl.fcntl(fd, fcntl.F_DUPFD, room - 1))   # the lowest free number >= room - 1
        finally:
            os.close(fd)
    except OSError:                     # every number from room - 1 up is taken: the table is that large already
        pass
    return room
