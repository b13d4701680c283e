"""A fresh start's compiles spread over helper processes (synth/parallel_compile.py): the plan, the bounds, and a
helper's command run for real on the CPU (the GPU test of the whole path is in test_engine_gpu.py)."""
import os
import subprocess
import sys
import threading
import time

import torch

from talkgate.synth import parallel_compile
from talkgate.synth.parallel_compile import LATE, TASKS, helper_count, plan
from talkgate.synth.runner_build import load_runner


def test_the_plan_gives_every_task_to_one_helper_longest_first_and_the_late_ones_a_helper_of_their_own():
    groups = plan(256, 4)
    tasks = [t for g in groups for t in g]
    assert sorted(tasks) == sorted(t.replace("@B", "@256") for t in TASKS)
    assert len(groups) == 5 and groups[-1] == list(LATE)   # the engine is ready without them
    early = {k: v for k, v in TASKS.items() if k not in LATE}
    assert groups[0][0] == max(early, key=early.get).replace("@B", "@256")     # the longest starts first
    loads = [sum(TASKS[t.replace("@256", "@B")] for t in g) for g in groups[:4]]
    assert max(loads) - min(loads) <= max(early.values())  # spread, not piled on one


def test_one_helper_per_task_at_most_and_fewer_where_cores_or_memory_are_short():
    gib = 1 << 30
    most = len(TASKS) - len(LATE)                         # the late tasks' helper comes on top
    assert helper_count(cores=128, free_gpu_bytes=1000 * gib, weight_bytes=4 * gib) == most
    assert helper_count(cores=16, free_gpu_bytes=1000 * gib, weight_bytes=4 * gib) == 8
    assert helper_count(cores=16, free_gpu_bytes=40 * gib, weight_bytes=4 * gib) == 4     # 5 fit, with the late one
    assert helper_count(cores=2, free_gpu_bytes=1000 * gib, weight_bytes=4 * gib) == 1
    assert len(plan(256, 20)) == most + 1


def test_a_finished_warm_up_skips_the_helpers(tmp_path, monkeypatch):
    marker = tmp_path / "warmed-prompt128"
    marker.touch()
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: (_ for _ in ()).throw(AssertionError("started")))
    assert parallel_compile.start(tmp_path, "cuda:0", torch.bfloat16, torch.float32, 128, 750, 256, marker) is None


def test_a_helper_runs_every_part_with_more_rows_than_slots(tiny_checkpoint):
    runner, *_ = load_runner(tiny_checkpoint, device="cpu", max_contexts=4)
    tasks = ["early_convs@8", "late_convs@8", "decode@8", "codes@2", "early_convs@1", "late_convs@1", "decode@1",
             "codes@8", "codes@1", "prefill@16", "prefill@32", "prefill@max", "talker@1", "talker@8", "talker@2"]
    cmd = [sys.executable, "-m", "talkgate.synth.parallel_compile", "--model", str(tiny_checkpoint), "--device", "cpu",
           "--dtype", "float32", "--decoder-dtype", "float32", "--max-prompt", str(runner.max_prompt),
           "--max-frames", "16", "--batch", "8", "--tasks", ",".join(tasks)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stderr.splitlines() if "compiled in" in line)
    for task in tasks:
        if not task.startswith("prefill"):
            assert f"{task} " in line                   # each part ran once, at 8 rows over 2 slots
    for T in runner.prefill_lens:                       # every prefill length once, over the three tasks
        assert line.count(f"prefill 4x{T} ") == 1 and line.count(f"prefill 1x{T} ") == 1


def test_one_process_per_cache_starts_helpers_and_the_lock_ends_with_its_holder(tmp_path):
    """The lock beside the warmed marker: held, another open sees it busy (another engine process on this cache
    waits instead of starting helpers of its own); a holder killed with SIGKILL releases it."""
    lock = tmp_path / "compile-helpers.lock"
    fd = parallel_compile.hold(lock)
    assert fd is not None and parallel_compile.hold(lock) is None
    os.close(fd)
    code = ("import time; from talkgate.synth.parallel_compile import hold; "
            f"assert hold({str(lock)!r}) is not None; print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert parallel_compile.hold(lock) is None
    finally:
        holder.kill()
        holder.wait()
    fd = parallel_compile.hold(lock)
    assert fd is not None
    os.close(fd)


def test_a_process_on_a_cache_being_filled_waits_for_the_other_s_helpers(tmp_path):
    """start() finds the lock held (another engine's helpers at work): it starts none (no GPU is asked about)
    and returns a waiter whose wait() ends when the holder lets go."""
    marker = tmp_path / "code" / "warmed-prompt128"
    marker.parent.mkdir()
    fd = parallel_compile.hold(marker.parent / "compile-helpers-cuda0.lock")
    waiter = parallel_compile.start(tmp_path, "cuda:0", torch.bfloat16, torch.float32, 128, 750, 256, marker)
    assert isinstance(waiter, parallel_compile.OtherProcessHelpers)
    threading.Timer(0.5, os.close, [fd]).start()
    t0 = time.perf_counter()
    waiter.wait()
    assert 0.4 < time.perf_counter() - t0 < 60      # the lock's wait, and the compiler's imports



def test_a_process_after_another_s_helpers_but_its_late_one_waits_for_that_one_only(tmp_path):
    """The other process's helpers have all ended but the LATE tasks' one (its first lock let go, its LATE lock
    held): wait() returns at once, late_done() is None until the LATE lock goes, then says whether the LATE_OK
    file was left (the helper compiled them), so that two rows take its kernels or keep the general kinds."""
    marker = tmp_path / "code" / "warmed-prompt128"
    marker.parent.mkdir()
    late = parallel_compile.hold(marker.parent / "compile-helpers-cuda0.late.lock")
    waiter = parallel_compile.start(tmp_path, "cuda:0", torch.bfloat16, torch.float32, 128, 750, 256, marker)
    assert isinstance(waiter, parallel_compile.OtherProcessHelpers)
    t0 = time.perf_counter()
    waiter.wait()
    assert time.perf_counter() - t0 < 30 and waiter.late_done() is None and waiter.late_done() is None
    (marker.parent / "compile-helpers-cuda0.late-ok").touch()
    os.close(late)
    assert waiter.late_done() is True and waiter.wait_late() is True
    # a holder that died (or whose helper failed) leaves no LATE_OK file: two rows keep the general kinds
    (marker.parent / "compile-helpers-cuda0.late-ok").unlink()
    assert waiter.late_done() is False


def test_a_cache_where_the_lock_cannot_be_written_starts_no_helpers_and_fails_nothing(tmp_path):
    """An OSError on the lock (a read-only cache; here its folder is a file, which fails for root too): warm-up
    compiles alone, as without helpers, and the start goes on."""
    code = tmp_path / "code"
    code.write_text("not a folder")
    assert parallel_compile.start(tmp_path, "cuda:0", torch.bfloat16, torch.float32, 128, 750, 256,
                                  code / "warmed-prompt128") is None


def test_wait_returns_before_the_late_helper_ends_and_each_lock_goes_when_its_helpers_have(tmp_path):
    """Helpers.wait() waits for all but the last (LATE) helper and lets the first lock go (another engine on this
    cache may load their kinds); late_done() is None while the LATE one runs, then whether it ended well, and the
    LATE lock is let go only then, the LATE_OK file left where it compiled its tasks."""
    def locked(name):
        paths = (tmp_path / f"{name}.lock", tmp_path / f"{name}.late.lock")
        return paths, [parallel_compile.hold(p) for p in paths], tmp_path / f"{name}.late-ok"

    sleeper = lambda s, code=0: subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({s}); exit({code})"])
    paths, fds, ok_path = locked("h")
    helpers = parallel_compile.Helpers([sleeper(0.2), sleeper(0.3), sleeper(3)], [["a"], ["b"], list(LATE)], *fds,
                                       ok_path)
    t0 = time.perf_counter()
    helpers.wait()
    assert time.perf_counter() - t0 < 2.5
    assert helpers.late_done() is None and parallel_compile.hold(paths[1]) is None and not ok_path.exists()
    first = parallel_compile.hold(paths[0])
    assert first is not None
    os.close(first)
    # the late helper ending first: wait() still waits for every other
    _, early_fds, early_ok = locked("e")
    early_late = parallel_compile.Helpers([sleeper(1.5), sleeper(0.1)], [["a"], list(LATE)], *early_fds, early_ok)
    early_late.wait()
    assert early_late.procs[0].poll() is not None
    assert helpers.wait_late() is True and helpers.late_done() is True and ok_path.exists()
    again = parallel_compile.hold(paths[1])
    assert again is not None
    os.close(again)
    _, failed_fds, failed_ok = locked("f")
    failed = parallel_compile.Helpers([sleeper(0.1), sleeper(0.2, code=1)], [["a"], list(LATE)], *failed_fds,
                                      failed_ok)
    failed.wait()
    assert failed.wait_late() is False and not failed_ok.exists()
    early_late.wait_late()
