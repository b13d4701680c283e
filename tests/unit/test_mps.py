"""CUDA MPS for engine processes that share a GPU (processes/mps.py): which GPUs get a daemon, what --mps auto and on
do where none can be started, and an engine's environment. A daemon itself is started in tests/gpu/test_mps.py."""
from __future__ import annotations

import dataclasses
import logging

import pytest

from talkgate.cli.models_file import ModelSpec
from talkgate.cli.serve import engine_plan
from talkgate.processes import mps
from talkgate.processes.supervisor import Child, Plan, Supervisor, engine_processes


def plan(specs, mode="auto", engines=1, ids=("0", "1")):
    return Plan(host="127.0.0.1", port=0, models=[(s.name, s.path) for s in specs], workers=1, mps=mode,
                engines=engine_plan(specs, "cuda", None, engines, None, list(ids)))


def test_a_daemon_only_for_gpus_that_several_engine_processes_share():
    a, b = ModelSpec("a", "/a"), ModelSpec("b", "/b", gpus="1")
    assert mps.shared_gpus(plan([a]).engines) == []
    assert mps.shared_gpus(plan([a, b]).engines) == ["1"]
    assert mps.shared_gpus(plan([a], engines=2).engines) == ["0", "1"]
    cpu = engine_plan([a, ModelSpec("c", "/c")], "cpu", None, 2, None)
    assert mps.shared_gpus(cpu) == []


def test_colocated_engines_are_one_process_a_gpu_and_start_no_daemon(no_control):
    """`serve --colocate`: the engines of one GPU (or of the CPU) in one engine process, whose argv carries each
    engine's own; no MPS daemon for a GPU that one process has, even with --mps on."""
    a, b, c = ModelSpec("a", "/a"), ModelSpec("b", "/b"), ModelSpec("c", "/c", gpus="1")
    p = plan([a, b, c], mode="on")
    p.colocate = True
    gpus = [e["cuda_visible"] for e in p.engines]          # a and b on both GPUs, c on GPU 1
    assert gpus == ["0", "1", "0", "1", "1"]
    assert engine_processes(p) == [[0, 2], [1, 3, 4]]
    assert engine_processes(dataclasses.replace(p, colocate=False)) == [[0], [1], [2], [3], [4]]
    cpu = Plan(host="127.0.0.1", port=0, models=[("a", "/a"), ("b", "/b")], workers=1, colocate=True,
               engines=engine_plan([a, b], "cpu", None, 1, None))
    assert engine_processes(cpu) == [[0, 1]]
    sup = Supervisor(p)
    sup._start_mps("/nonexistent")          # --mps on would raise where a daemon were wanted and cannot be had
    assert sup.mps == {}


@pytest.fixture
def no_control(tmp_path, monkeypatch):
    """A PATH without nvidia-cuda-mps-control, and no daemon of the system's."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "none"))
    return tmp_path


def test_mps_on_refuses_to_start_where_no_daemon_can_be_had(no_control):
    sup = Supervisor(plan([ModelSpec("a", "/a"), ModelSpec("b", "/b")], mode="on"))
    with pytest.raises(mps.MpsError, match="nvidia-cuda-mps-control is not on PATH"):
        sup._start_mps(str(no_control))


def test_mps_auto_says_why_and_serves_without(no_control, caplog):
    sup = Supervisor(plan([ModelSpec("a", "/a"), ModelSpec("b", "/b")], mode="auto"))
    with caplog.at_level(logging.WARNING, "talkgate.supervisor"):
        sup._start_mps(str(no_control))
    assert sup.mps == {}
    said = [r.getMessage() for r in caplog.records]
    assert any(s.startswith("GPU 0: its engine processes run without CUDA MPS") and "not on PATH" in s for s in said)
    assert any(s.startswith("GPU 1: its engine processes run without CUDA MPS") for s in said)


def test_mps_off_warns_that_the_engines_take_turns(no_control, caplog):
    sup = Supervisor(plan([ModelSpec("a", "/a"), ModelSpec("b", "/b", gpus="0")], mode="off"))
    with caplog.at_level(logging.WARNING, "talkgate.supervisor"):
        sup._start_mps(str(no_control))
    assert sup.mps == {} and "GPU(s) 0: several engine processes each, without CUDA MPS" in caplog.text


def test_a_daemon_of_the_system_is_used_as_it_is(tmp_path, monkeypatch, caplog):
    (tmp_path / "control").touch()
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    sup = Supervisor(plan([ModelSpec("a", "/a"), ModelSpec("b", "/b")], mode="on"))
    with caplog.at_level(logging.INFO, "talkgate.supervisor"):
        sup._start_mps(str(tmp_path))
    assert sup.mps == {} and f"clients of the MPS daemon at {tmp_path}" in caplog.text


def test_an_engine_is_an_mps_client_only_while_its_daemon_lives(tmp_path):
    import subprocess
    import sys

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        daemon = mps.Daemon("1", str(tmp_path), live)
        sup = Supervisor(plan([ModelSpec("a", "/a")]))
        sup.mps["1"] = daemon
        engine = Child("engine 1", [], {"CUDA_VISIBLE_DEVICES": "1", "HOME": "/h"}, gpu="1")
        other = Child("engine 0", [], {"CUDA_VISIBLE_DEVICES": "0"}, gpu="0")
        assert sup._engine_env(engine) == {"HOME": "/h", "CUDA_MPS_PIPE_DIRECTORY": f"{tmp_path}/pipe",
                                           "CUDA_MPS_LOG_DIRECTORY": f"{tmp_path}/log"}
        assert sup._engine_env(other) == {"CUDA_VISIBLE_DEVICES": "0"}
        live.kill()
        live.wait()
        # its daemon gone: it would see every GPU as an MPS client that reaches none, so it gets its GPU back
        assert sup._engine_env(engine) == {"CUDA_VISIBLE_DEVICES": "1", "HOME": "/h"} and daemon.exit_said
    finally:
        live.kill()
        live.wait()
