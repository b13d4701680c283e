"""talkgate/system/descriptors.py: a process makes room for its sockets at start (its descriptor table grown, its open-file
limit raised), so that no accept() or socket() mid-run grows the table and waits for an RCU grace period."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")


def fd_size(pid: int | str = "self") -> int:
    """The size of a process's descriptor table (FDSize in /proc/PID/status)."""
    return int(re.search(r"^FDSize:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M).group(1))


def in_process(body: str) -> subprocess.CompletedProcess:
    """Run `body` in a fresh interpreter with logging on and a second thread alive (the table is shared, as in a
    server)."""
    code = "import logging, resource, threading, time\nfrom talkgate.system import descriptors\n" \
           "from tests.unit.test_descriptors import fd_size\nlogging.basicConfig()\n" \
           "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)


def test_reserve_grows_the_table_once_at_start():
    before, after, room = in_process("""
        print(fd_size())
        room = descriptors.reserve(1000)
        print(fd_size(), room)
    """).stdout.split()
    assert int(before) < 1000                  # a fresh process's table is small: it would grow mid-run
    assert int(after) >= 1000 and int(room) == 1000


def test_reserve_raises_a_low_soft_limit_up_to_the_hard_one():
    soft, size, room = in_process("""
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
        room = descriptors.reserve(600)
        print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], fd_size(), room)
    """).stdout.split()
    assert (int(soft), int(room)) == (600, 600) and int(size) >= 600


def test_reserve_stops_at_the_hard_limit_and_says_so():
    out = in_process("""
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 300))
        print(descriptors.reserve(600), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    """)
    assert out.stdout.split() == ["300", "300"]
    assert "room for 300 open files, fewer than the 600 wanted" in out.stderr
