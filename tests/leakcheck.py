"""The session's leak check (a pytest plugin; tests/conftest.py takes its hooks): no test may leave a thread, a child
process or a socket behind. After the last fixture's teardown the run fails, and its terminal summary says what was
left, when anything is:

- threads: every live Python thread but the main thread and those alive before the first test (a baseline taken once
  collection has imported every test module: the interpreter's, pytest's and the libraries' own, started at import).
  A thread running talkgate's or the tests' own code is never part of the baseline, whenever it started. Each is
  named with the test that was running when it started and where it was started from (a pool's idle worker shows
  only the pool's own frames when it is found, not who made the pool).
- child processes of this process (/proc/self/task/*/children), running or exited and never waited for (a zombie).
  No baseline: nothing may be a child before the first test either.
- sockets: descriptors of this process that are sockets (/proc/self/fd), beyond those open before the first test.
- and what was left to the garbage collector during the run: a socket or a running child process whose object was
  dropped unclosed (Python warns then: ResourceWarning "unclosed <socket", "subprocess N is still running"). It is a
  leak whether or not a collection happened to come before the end, so the check does not depend on the collector's
  timing; the warning names the test during which it was collected, the one that left it or a later one.

Left out, each for its reason (nothing that runs talkgate's or the tests' own code):
- tqdm's monitor thread (tqdm._monitor.TMonitor): a progress-bar class starts it at its first bar, and a disabled bar
  leaves it running for good (tqdm/std.py takes the bar out of its instances without stopping the monitor); the
  libraries' loaders make such bars (torch's compiler, the reference model's). A daemon of tqdm's that wakes every
  10 s, for the life of the process.
- torch's compiler's thread pool (torch/_inductor/async_compile.py): the first compile in a process that loads a
  compiled kernel starts it (AsyncCompile.pool, cached for the process), and it waits for work for the life of the
  process; tests that compile in this process (tests/system/test_warmup.py) start it. Known by the stack that
  started the thread, not by its name, which is any executor's. Where the machine has cores enough (a GPU machine:
  16), the compiler uses worker processes instead (torch/_inductor/compile_worker/), a child process and the
  threads that read it and time it, kept for the process's life as well: left out alike, the child known by its
  command line.
- multiprocessing's resource tracker (a child process): one per process, started by the first process spawned (the
  clients of talkgate bench's load generator) and meant to outlive them all, to reclaim what a crashed one left;
  it exits with this process.

The check never runs the garbage collector itself: it does not depend on the collector's timing (see above), and a
finalizer the collector would run can do anything, at whatever point the collection happens to come.

What was left may still be ending (a reader thread that sees its server's EOF a moment after the server exited):
the check waits up to GRACE_S for threads to end and children to exit before it counts them.
"""
from __future__ import annotations

import os
import re
import sys
import threading
import time
import traceback
import warnings
import weakref
from pathlib import Path

import pytest

GRACE_S = 10.0
TORCH_COMPILE_WORKERS = os.path.join("torch", "_inductor", "compile_worker") + os.sep   # a child and its threads
TORCH_COMPILE_POOLS = (os.path.join("torch", "_inductor", "async_compile.py"), TORCH_COMPILE_WORKERS)
STARTED_FROM_FRAMES = 8     # of the stack that started a thread, named in the report
ROOT = Path(__file__).resolve().parent.parent
OWN = tuple(str(ROOT / d) + os.sep for d in ("talkgate", "tests"))     # code whose threads are never baseline
# the ResourceWarnings of objects closed by their finalizers: what each is counted as, the messages' beginnings
LEFT_TO_COLLECTOR = {"sockets": ("unclosed <socket.socket", "unclosed <ssl.SSLSocket"),
                     "child processes": ("subprocess ",)}                             # "... N is still running"
TCP_STATES = {"01": "established", "06": "time-wait", "07": "closed", "08": "close-wait", "0A": "listening"}


class _Check:
    def __init__(self):
        self.threads: set[int] = set()      # thread idents of the baseline
        self.test = "collection"            # the test running now (what a thread started now is said to start in)
        self.started = weakref.WeakKeyDictionary()     # thread -> "started during <test>, from <where>"
        self.library_pools = weakref.WeakSet()          # threads of torch's compile pool (left out: see above)
        self.sockets: set[str] = set()      # socket inodes of the baseline
        self.collected: dict[str, list[str]] = {kind: [] for kind in LEFT_TO_COLLECTOR}    # the warnings, by kind
        self.report: list[str] = []         # what the summary prints, empty when nothing was left
        self.counts: dict[str, int] = {}


_check = _Check()


def pytest_configure(config):
    _record_thread_starts()
    # Python's default filters ignore ResourceWarning: shown, pytest records these and pytest_warning_recorded counts
    for beginnings in LEFT_TO_COLLECTOR.values():
        for beginning in beginnings:
            warnings.filterwarnings("always", message=re.escape(beginning), category=ResourceWarning)


def pytest_collection_finish(session):
    """The baseline: what is alive once every test module is imported, before the first test runs."""
    _check.threads = {t.ident for t in _other_threads() if not _runs_own_code(t)}
    _check.sockets = set(_sockets().values())


def pytest_runtest_logstart(nodeid, location):
    _check.test = nodeid


def _record_thread_starts():
    start = threading.Thread.start
    if getattr(start, "_leakcheck", False):          # configured twice in one process (pytester)
        return

    def recording_start(thread, *args, **kwargs):
        frames = traceback.extract_stack(sys._getframe(1), limit=STARTED_FROM_FRAMES)
        where = "; ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
        _check.started[thread] = f"started during {_check.test}, from {where}"
        if any(pool in f.filename for f in frames for pool in TORCH_COMPILE_POOLS):
            _check.library_pools.add(thread)
        return start(thread, *args, **kwargs)

    recording_start._leakcheck = True
    threading.Thread.start = recording_start


def pytest_warning_recorded(warning_message, when, nodeid, location):
    if not issubclass(warning_message.category, ResourceWarning):
        return
    message = str(warning_message.message)
    for kind, beginnings in LEFT_TO_COLLECTOR.items():
        if message.startswith(beginnings):
            _check.collected[kind].append(f"{message} (left to the garbage collector, which closed it during "
                                          f"{nodeid or when}: the test that left it ran then or earlier)")


@pytest.hookimpl(trylast=True)      # after the runner's own sessionfinish, which tears down what -x or ^C left set up
def pytest_sessionfinish(session, exitstatus):
    leaks = find_leaks()
    if not any(leaks.values()):
        return
    _check.counts = {kind: len(items) for kind, items in leaks.items() if items}
    _check.report = [f"{kind}: {len(items)}" + "".join(f"\n  {item}" for item in items)
                     for kind, items in leaks.items() if items]
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if session.config.pluginmanager.get_plugin("terminalreporter") is None:
        print("LEAK CHECK FAILED: the session left\n" + "\n".join(_check.report), file=sys.stderr)


def pytest_terminal_summary(terminalreporter):
    if not _check.report:
        return
    terminalreporter.section("leak check: what the tests left behind", sep="=", red=True, bold=True)
    for block in _check.report:
        terminalreporter.write_line(block)
    terminalreporter.write_line("LEAK CHECK FAILED: the run fails (tests/leakcheck.py)", red=True, bold=True)
    # and the last line counts them ("N passed, 2 leaked threads in ...")
    for kind, n in _check.counts.items():
        terminalreporter.stats.setdefault(f"leaked {kind}", []).extend([kind] * n)


# ----- what is left -----
def find_leaks(grace_s: float = GRACE_S) -> dict[str, list[str]]:
    deadline = time.monotonic() + grace_s
    while True:
        threads = [t for t in _other_threads() if t.ident not in _check.threads]
        children = _children()
        if not (threads or children) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    sockets = {fd: inode for fd, inode in _sockets().items() if inode not in _check.sockets}
    return {"threads": [_describe_thread(t) for t in threads],
            "child processes": [_describe_process(pid) for pid in children] + _check.collected["child processes"],
            "sockets": [f"fd {fd}: {_describe_socket(inode)}" for fd, inode in sorted(sockets.items())]
                       + _check.collected["sockets"]}


def _other_threads() -> list[threading.Thread]:
    tqdm = sys.modules.get("tqdm._monitor")
    return [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()
            and not (tqdm and isinstance(t, tqdm.TMonitor)) and t not in _check.library_pools]


def _stack(thread: threading.Thread) -> list[traceback.FrameSummary]:
    frame = sys._current_frames().get(thread.ident)
    return traceback.extract_stack(frame) if frame is not None else []


def _runs_own_code(thread: threading.Thread) -> bool:
    target = getattr(thread, "_target", None)
    code = getattr(target, "__code__", None)
    files = [f.filename for f in _stack(thread)] + ([code.co_filename] if code else [])
    return any(f.startswith(OWN) for f in files)


def _describe_thread(t: threading.Thread) -> str:
    target = getattr(t, "_target", None)
    top = "; ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(_stack(t)[-4:]))
    started = _check.started.get(t, "started before the check was configured")
    return (f"{t.name!r} ({'daemon' if t.daemon else 'not daemon'}, target "
            f"{getattr(target, '__qualname__', target)!r}): {top or 'no Python frame'}\n    {started}")


def _children() -> list[int]:
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    left_out = getattr(getattr(tracker, "_resource_tracker", None), "_pid", None)
    pids = []
    for task in Path("/proc/self/task").iterdir():
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:          # the task ended meanwhile
            pass
    return sorted(pid for pid in set(pids) - {left_out} if TORCH_COMPILE_WORKERS not in _cmdline(pid))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:          # gone meanwhile
        return ""


def _describe_process(pid: int) -> str:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return f"pid {pid} (gone meanwhile)"
    if state == "Z":
        return f"pid {pid}: exited, never waited for (zombie)"
    return f"pid {pid} (state {state}): {_cmdline(pid)[:300]}"


def _sockets() -> dict[int, str]:
    """fd -> socket inode, for every descriptor of this process that is a socket."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:          # closed meanwhile (or listdir's own descriptor)
            continue
        if target.startswith("socket:["):
            out[int(fd)] = target[8:-1]
    return out


def _describe_socket(inode: str) -> str:
    """The socket's kind and addresses, from /proc/net (hex addresses as the kernel writes them)."""
    for table in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[9] == inode:
                state = TCP_STATES.get(f[3], f[3]) if table.startswith("tcp") else f[3]
                return f"{table} local {_addr(f[1])} remote {_addr(f[2])} {state} (inode {inode})"
    try:
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            f = line.split()
            if len(f) > 6 and f[6] == inode:
                return f"unix {f[7] if len(f) > 7 else '(unnamed)'} (inode {inode})"
    except OSError:
        pass
    return f"socket inode {inode}"


def _addr(hexaddr: str) -> str:
    host, port = hexaddr.split(":")
    if len(host) == 8:
        host = ".".join(str(int(host[i:i + 2], 16)) for i in (6, 4, 2, 0))
    return f"{host}:{int(port, 16)}"
