"""README.md's first requests and commands, run as written there (subprocesses of the console command).

Every ```python block of the README runs with `python`, and every line of a ```sh block that starts
with `curl` or `.venv/bin/talkgate` runs as a shell would split it, in a scratch directory. What is changed on the
way, and only that: the README's `.venv/bin/` is this interpreter's bin directory, its address
127.0.0.1:8080 is a test server's (tiny checkpoint), `/tmp/` is the scratch directory, and the
`serve` command's port is 0. The `make` lines are what CI itself runs.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import wave
from pathlib import Path

import pytest

from tests.serverproc import READY, TalkgateServer

README = Path(__file__).resolve().parents[2] / "README.md"
BIN = Path(sys.executable).parent


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), flags=re.M | re.S)


def commands() -> list[str]:
    lines = [line for block in blocks("sh") for line in block.replace("\\\n", " ").splitlines()]
    return [line.split("  #")[0].strip() for line in lines if line.startswith(("curl ", ".venv/bin/talkgate "))]


def localize(text: str, url: str, scratch: Path, bin_dir: Path = BIN) -> str:
    # The README's /tmp/ paths first, while the text is only the README's: the interpreter's directory put in
    # after them may itself lie under /tmp/ (a clone in /tmp/x), and its path is not the README's to rewrite.
    text = text.replace("/tmp/", f"{scratch}/")
    return (text.replace(".venv/bin/", f"{bin_dir}/").replace("http://127.0.0.1:8080", url)
            .replace("ws://127.0.0.1:8080", url.replace("http://", "ws://")))


def wav_seconds(path: Path) -> float:
    with wave.open(str(path)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        return w.getnframes() / 24000


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    with TalkgateServer(tiny_checkpoint) as srv:
        yield srv


def test_readme_shows_what_is_tested_here():
    assert len(blocks("python")) == 2
    shown = commands()
    assert [c.split()[0] for c in shown] == ["curl"] + [".venv/bin/talkgate"] * 3, shown
    assert "make serve" in README.read_text() and "make test" in README.read_text()


def test_only_the_readmes_own_tmp_paths_are_rewritten():
    """A checkout under /tmp/ (a fresh clone in /tmp/x): its interpreter's path stays as it is."""
    command = commands()[1]
    assert command.startswith(".venv/bin/talkgate ") and " /tmp/" in command
    local = localize(command, "", Path("/tmp/pytest-of-x/scratch"), bin_dir=Path("/tmp/x/.venv/bin"))
    program, *args = shlex.split(local)
    paths = [a for a in args if a.startswith("/tmp/")]
    assert program == "/tmp/x/.venv/bin/talkgate" and paths, (program, args)
    assert all(p.startswith("/tmp/pytest-of-x/scratch/") for p in paths), paths


def test_first_requests(server, tmp_path):
    if shutil.which("curl") is None:
        pytest.fail("curl is needed: the README's first request uses it")
    curl = localize(commands()[0], server.url, tmp_path)
    subprocess.run(shlex.split(curl), cwd=tmp_path, check=True, timeout=120)
    assert wav_seconds(tmp_path / "hello.wav") > 0
    for code, out in zip(blocks("python"), ["hello-openai.wav", "hello-ws.wav"]):
        done = subprocess.run([sys.executable, "-c", localize(code, server.url, tmp_path)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert wav_seconds(tmp_path / out) > 0
    assert "untrained" in done.stdout and '"type":"context.done"' in done.stdout.replace(" ", "")


def test_checkpoint_synthesize_and_serve_commands(tmp_path):
    create, synthesize, serve = (localize(c, "", tmp_path) for c in commands()[1:])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for command in (create, synthesize):
        done = subprocess.run(shlex.split(command), cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              env=env)
        assert done.returncode == 0, done.stderr
    frames = int(re.search(r"--max-frames (\d+)", synthesize).group(1))
    assert 0 < wav_seconds(tmp_path / "hello-offline.wav") <= frames * 0.08
    serve = re.sub(r"--port \d+", "--port 0", serve)
    proc = subprocess.Popen(shlex.split(serve), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)
    try:
        for line in proc.stdout:
            if READY.search(line):
                break
        else:
            pytest.fail("talkgate serve ended before it was ready")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
