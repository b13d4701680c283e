"""A CUDA MPS daemon of talkgate's own (processes/mps.py) on a real GPU: it starts with its server, a client of it
runs CUDA work on that GPU through it, and it quits when asked, leaving no process behind.

Skipped where there is no GPU or no nvidia-cuda-mps-control (CI); run on the GPU machine: pytest tests/gpu/test_mps.py
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from talkgate.processes import mps

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or shutil.which(mps.CONTROL) is None,
                                reason="needs a CUDA GPU and nvidia-cuda-mps-control (not on this machine)")

CLIENT = ("import torch; x = torch.ones(1 << 20, device='cuda'); torch.cuda.synchronize(); "
          "print(torch.cuda.device_count(), torch.cuda.get_device_properties(0).uuid, float(x.sum()))")


def test_an_engine_of_a_shared_gpu_runs_through_its_daemon(tmp_path):
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[-1]
    alone = subprocess.run([sys.executable, "-c", CLIENT], env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu},
                           capture_output=True, text=True, timeout=120)
    daemon = mps.start(gpu, str(tmp_path / "mps"))
    try:
        servers = daemon.ask("get_server_list").split()
        assert len(servers) == 1 and servers[0].isdigit()
        env = daemon.client_env({**os.environ, "CUDA_VISIBLE_DEVICES": gpu})
        assert "CUDA_VISIBLE_DEVICES" not in env
        client = subprocess.run([sys.executable, "-c", CLIENT], env=env, capture_output=True, text=True, timeout=120)
        assert client.returncode == 0, client.stderr
        # the same one GPU as without MPS, and the client was the server's
        assert client.stdout == alone.stdout and client.stdout.split()[0] == "1"
        log = (tmp_path / "mps" / "log" / "control.log").read_text()
        assert "client" in log.lower(), log[-2000:]
    finally:
        mps.stop(daemon)
    assert daemon.proc.returncode is not None
    # by process name (not command line: a shell running this test may name the tool)
    left = subprocess.run(["pgrep", "-u", str(os.getuid()), "nvidia-cuda-mps"], capture_output=True, text=True)
    assert left.stdout.strip() == ""
