"""talkgate/system/schedstat.py: a thread's time on a CPU and its time waiting for one (run queue), told apart."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from talkgate.system.schedstat import SchedStat

pytestmark = pytest.mark.skipif(not Path("/proc/thread-self/schedstat").exists(),
                                reason="reads /proc/thread-self/schedstat (Linux with schedstat)")

# Pinned to one CPU: work until this thread has run 0.3 s, then print what it ran and waited meanwhile; with
# `rivals`, that many busy processes share the CPU (the scheduler gives each its turn, so the thread waits).
MEASURE = """
    import os, subprocess, sys, time
    from talkgate.system.schedstat import SchedStat
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    # rivals that end by themselves too, should this process die first
    rival = "import time\\nt = time.time()\\nwhile time.time() - t < 10: pass"
    busy = [subprocess.Popen([sys.executable, "-c", rival]) for _ in range(RIVALS)]
    try:
        for p in busy:
            os.sched_setaffinity(p.pid, {cpu})
        time.sleep(0.2)                               # the rivals running
        stat = SchedStat()
        ran, waited = stat.read()
        start = time.thread_time()
        while time.thread_time() - start < 0.3:
            pass
        ran_after, waited_after = stat.read()
        print(ran_after - ran, waited_after - waited)
    finally:
        for p in busy:
            p.kill()
"""


def work(rivals: int) -> tuple[float, float]:
    code = textwrap.dedent(MEASURE).replace("RIVALS", str(rivals))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    ran, waited = map(float, out.stdout.split())
    return ran, waited


def test_a_thread_sharing_its_cpu_waits_and_one_alone_does_not():
    (ran_shared, shared), (ran_alone, alone) = work(rivals=2), work(rivals=0)
    assert 0.28 < ran_shared < 0.4 and 0.28 < ran_alone < 0.4     # the 0.3 s of work, as the thread's CPU clock says
    # two rivals on its CPU: the thread runs a third of the time, so its work waits about 0.6 s more than alone
    # (where other processes of the machine may still take that CPU for a while)
    assert shared - alone > 0.3


def test_the_figures_read_from_any_thread_are_those_of_the_thread_that_made_it():
    made = {}

    def make():
        made["stat"], made["tid"] = SchedStat(), threading.get_native_id()
    t = threading.Thread(target=make)
    t.start()
    t.join()
    opened = lambda stat: os.readlink(f"/proc/self/fd/{stat._fd}")
    assert opened(made["stat"]) == f"/proc/{os.getpid()}/task/{made['tid']}/schedstat"
    mine = SchedStat()
    assert opened(mine) == f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat"
    ran, waited = mine.read()
    assert ran > 0 and waited >= 0
    mine.close()
    assert mine.read() is None


def test_where_the_kernel_keeps_no_schedstat_the_figures_are_unknown(tmp_path):
    assert SchedStat(str(tmp_path / "missing")).read() is None
    (tmp_path / "odd").write_text("not numbers\n")
    assert SchedStat(str(tmp_path / "odd")).read() is None
