"""The container image (deploy/Containerfile), built as `make image` builds it (scripts/image.sh: buildah on a
Debian base made by mmdebstrap) and run with `buildah run`: its entrypoint serves the tiny checkpoint from a
read-only volume as the image's non-root user, answers /ready, an OpenAI request and a native WebSocket
utterance, its HEALTHCHECK command passes, and SIGTERM drains it (the utterance in flight finishes, the socket
closes 1001) and it exits 0. Minutes long: marked slow (docs/deploy.md has the build times and how to run it)."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import aiohttp
import pytest

from tests.nativeclient import NativeClient
from tests.serverproc import TalkgateServer, descendants

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]    # a cold build takes minutes on 2 cores

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "localhost/talkgate:cpu"
# as scripts/image.sh: vfs and chroot work without overlay mounts or user namespaces (inside a container)
ENV = {**os.environ, "STORAGE_DRIVER": os.environ.get("STORAGE_DRIVER", "vfs"),
       "BUILDAH_ISOLATION": os.environ.get("BUILDAH_ISOLATION", "chroot")}


def buildah(*args: str) -> str:
    return subprocess.run(["buildah", *args], env=ENV, check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def image():
    """The CPU image, built by the script behind `make image` (which installs buildah and mmdebstrap where
    they are missing); skipped only where they could not be installed."""
    build = subprocess.run([str(ROOT / "scripts" / "image.sh")], env={**ENV, "IMAGE": IMAGE}, cwd=ROOT,
                           capture_output=True, text=True, timeout=1500)
    tail = (build.stdout + build.stderr)[-3000:]
    if build.returncode and not (shutil.which("buildah") and shutil.which("mmdebstrap")):
        pytest.skip(f"buildah and mmdebstrap are not installed and scripts/image.sh could not install them:\n{tail}")
    assert build.returncode == 0, tail
    return json.loads(buildah("inspect", "--type", "image", IMAGE))["Docker"]["config"]


@pytest.fixture
def container(image):
    name = f"talkgate-test-{os.getpid()}"
    buildah("from", "--name", name, IMAGE)
    yield name
    buildah("rm", name)


def readable_copy(checkpoint: Path, to: Path) -> Path:
    """The checkpoint as files the image's user (not root) may read, as a model volume must be."""
    shutil.copytree(checkpoint, to)
    for path in [to, *to.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return to


def serve_pid(runner: int) -> int:
    """`talkgate serve` inside the container: buildah run -> chroot runtime -> its exec -> Python. SIGTERM goes to it,
    not to buildah run, which answers a signal by killing the container's process."""
    for pid in descendants(runner):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"python3") and argv[1].endswith(b"/talkgate") and argv[2] == b"serve":
            return pid
    raise AssertionError("no talkgate serve process under buildah run")


def test_image_serves_and_drains(image, container, tiny_checkpoint, tmp_path):
    assert image["User"] == "talkgate"
    assert {"/var/cache/talkgate", "/var/lib/talkgate"} <= set(image["Volumes"])
    assert {"TALKGATE_CACHE=/var/cache/talkgate", "TALKGATE_DATA=/var/lib/talkgate"} <= set(image["Env"])
    assert image["Entrypoint"] == ["talkgate", "serve", "--host", "0.0.0.0"]
    health = image["Healthcheck"]["Test"]
    assert health[0] == "CMD" and "127.0.0.1:8080/health" in health[-1]

    model = readable_copy(tiny_checkpoint, tmp_path / "tiny")
    srv = TalkgateServer(model)
    # the image's own entrypoint; the host's network, so that this test reaches it on 127.0.0.1
    srv.args = ["buildah", "run", "--network", "host", "--volume", f"{model}:/models/tiny:ro", container, "--",
                *image["Entrypoint"], "--model", "/models/tiny", "--port", "0", "--shutdown-deadline", "20"]
    srv.env = ENV
    with srv:
        url = srv.url.replace("0.0.0.0", "127.0.0.1")
        # the HEALTHCHECK's command, run in the container beside the server as Docker would; on the port this
        # server got (the image's 8080 may be taken on a shared host network)
        probe = subprocess.run(["buildah", "run", "--network", "host", container, "--",
                                *(a.replace(":8080/", f":{srv.port}/") for a in health[1:])], env=ENV,
                               capture_output=True, text=True, timeout=120)
        assert probe.returncode == 0, probe.stderr

        async def go():
            out = {}
            async with aiohttp.ClientSession() as http:
                async with http.get(url + "/ready") as r:
                    out["ready"] = r.status
                body = {"input": "Hello from the image.", "voice": "ryan", "response_format": "pcm",
                        "fixed_frames": 10}
                async with http.post(url + "/v1/audio/speech", json=body) as r:
                    out["openai"] = (r.status, len(await r.read()))
                c = NativeClient(await http.ws_connect(url.replace("http", "ws", 1) + "/v1/ws"))
                await c.until("session.ready")
                await c.send(type="context.start", context_id="u", fixed_frames=20)   # fixed: no eos by chance
                await c.send(type="text", context_id="u", text="An utterance in flight ")
                await c.until("timing")                     # audio flows, the text has not ended: then SIGTERM
                os.kill(serve_pid(srv.proc.pid), signal.SIGTERM)
                out["drain"] = srv.wait_output("draining for up to")
                await c.send(type="text", context_id="u", text="finishes during the drain.")
                await c.send(type="flush", context_id="u")
                out["done"] = await c.until("context.done")
                out["close"] = (await c.until("never"), c.ws.close_code, c.audio)
            return out

        out = asyncio.run(asyncio.wait_for(go(), 180))
        assert srv.proc.wait(60) == 0, srv.log()[-3000:]       # buildah run's status is the command's
        log = srv.log()
    assert out["ready"] == 200
    assert out["openai"] == (200, 10 * 1920 * 2)               # 10 frames of 80 ms, 24 kHz 16-bit PCM
    assert "1 context(s) in flight" in out["drain"]
    assert out["done"]["frames"] == 20 and out["close"][:2] == (None, 1001) and out["close"][2] > 0
    assert "talkgate: stopped" in log
