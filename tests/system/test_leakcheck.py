"""The session's leak check (tests/leakcheck.py) itself, so that it cannot stop working unseen: tiny test files run
by a pytest of their own with the check as a plugin. One leaking each kind fails the run and names each leak; one
that cleans up after itself, also in session fixtures torn down after an interrupted run, passes."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_pytest(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_tiny.py").write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.leakcheck", *args,
                           "test_tiny.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})


def test_a_leak_of_each_kind_fails_the_run_and_is_named(tmp_path):
    done = run_pytest(tmp_path, """
        import socket, subprocess, sys, threading

        def test_leaks_one_of_each():
            global kept
            stop = threading.Event()
            threading.Thread(target=stop.wait, name="leaked-thread", daemon=True).start()
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            # ends when this pytest process does (its stdin's writer is gone)
            child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()  # leaked-child"],
                                     stdin=subprocess.PIPE)
            kept = (stop, listener, child)

        def test_leaves_a_socket_to_the_collector():
            socket.socket()
    """)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "2 passed" in out and "LEAK CHECK FAILED" in out, out
    assert "threads: 1\n  'leaked-thread' (daemon, target 'Event.wait')" in out, out
    assert "started during test_tiny.py::test_leaks_one_of_each, from test_tiny.py:" in out, out
    assert "child processes: 1\n" in out and "# leaked-child" in out, out
    assert "sockets: 2\n" in out and "127.0.0.1:" in out and "listening" in out, out
    collected = "(left to the garbage collector, which closed it during " \
                "test_tiny.py::test_leaves_a_socket_to_the_collector:"
    assert re.search(r"\n  unclosed <socket.socket .*" + re.escape(collected), out), out
    assert "1 leaked threads, 1 leaked child processes, 2 leaked sockets in " in out, out


def test_what_ends_in_time_or_in_teardown_is_not_a_leak(tmp_path):
    """A thread that ends within the check's grace, and session fixtures (a thread, a child, a socket) torn down after
    the tests: also when the run is interrupted (^C) mid-test, which leaves them set up until pytest's own
    sessionfinish tears them down (the check runs after it). What the check leaves out, tqdm's monitor thread,
    multiprocessing's resource tracker and torch's compile worker processes, is not counted."""
    body = """
        import os, socket, subprocess, sys, threading, time
        import pytest

        @pytest.fixture(scope="session")
        def held():
            stop = threading.Event()
            thread = threading.Thread(target=stop.wait, name="fixture-thread")
            thread.start()
            child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
            sock = socket.socket()
            yield
            stop.set()
            thread.join()
            child.stdin.close()
            child.wait()
            sock.close()

        def test_uses_them(held):
            threading.Thread(target=time.sleep, args=(1,), name="ending-soon").start()
            FAIL

        def test_after(held):
            import multiprocessing, tqdm
            tqdm.tqdm(range(1), disable=True)       # leaves tqdm's monitor thread running: left out
            child = multiprocessing.get_context("spawn").Process(target=print)
            child.start()                           # and multiprocessing's resource tracker with it: left out
            child.join()
            os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "2"
            from torch._inductor.async_compile import AsyncCompile
            AsyncCompile.process_pool()             # torch's compile workers (a GPU machine's): left out
    """
    clean = run_pytest(tmp_path, body.replace("FAIL", "pass"))
    assert clean.returncode == 0 and "2 passed" in clean.stdout and "leak" not in clean.stdout, clean.stdout
    stopped = run_pytest(tmp_path, body.replace("FAIL", "raise KeyboardInterrupt"))
    assert stopped.returncode == 2 and "KeyboardInterrupt" in stopped.stdout, stopped.stdout
    assert "leak" not in stopped.stdout.lower(), stopped.stdout
