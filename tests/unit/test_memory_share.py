"""Several engine processes on one GPU: each sizes its slots and KV pages from its share of the GPU's memory (docs/operations.md
"Several models"). The arithmetic, the shares the supervisor gives each engine process, the models file's key; the
sizing on a GPU itself runs on the GPU machine."""
from __future__ import annotations

import pytest
import torch

from talkgate.cli import models_file
from talkgate.cli.args import CommandError
from talkgate.cli.models_file import ModelSpec
from talkgate.cli.serve import engine_plan
from talkgate.processes.supervisor import Plan, engine_argv
from talkgate.synth.runner_build import default_max_batch, share_budget, size_within, warmup_bytes_per_row

GiB, MiB = 1 << 30, 1 << 20
# 0.6B and 1.7B alike (28 layers, 8 kv heads of 128, bf16): a KV page of 64 positions is 7 MiB, a slot's 878 positions
# (60 s) 14 pages; a context's other state (the codec decoder's, sampling) 2.5 MiB (docs/engine.md "Memory budget")
CONTEXT, PAGE, SLOT_PAGES = int(2.5 * MiB), 7 * MiB, 14


def sizes(budget, **kw):
    return size_within(budget, CONTEXT, PAGE, SLOT_PAGES, **kw)


def test_slots_and_kv_pages_from_a_share_of_the_gpu():
    # half of 100 GiB less 5 GiB held: 45 GiB; less 4 GiB + 10%: 36.5 GiB for slots of 2.5 MiB and two pages (16.5
    # MiB) and their warm-up rows (50 MiB each, 256 of them), then pages: two a slot
    assert share_budget(100 * GiB, 5 * GiB, 0.5) == 45 * GiB
    assert sizes(45 * GiB) == (1489, 2979)
    # a third of an H200's 141 GiB less 4 GiB held: 43 GiB, 34.7 GiB usable
    assert sizes(share_budget(141 * GiB, 4 * GiB, 1 / 3)) == (1377, 2755)
    # a share smaller than what the process holds still gets a slot, and the pages of one whole context
    assert share_budget(80 * GiB, 4 * GiB, 0.05) == 0 and sizes(0) == (1, SLOT_PAGES + 2)
    # pages past every slot's whole length (and the scratch page) would never be used
    assert sizes(131 * GiB, cap=100, max_batch=100) == (100, 1415)


def test_default_rows_of_a_step_from_the_engines_memory():
    # an H200 alone (139.8 GiB): 512 rows; with 131 GiB free after the weights, the cap's 2,048 slots and every byte
    # left in pages: 12,273 beside the float32 decoder's warm-up (50 MiB a row), 14,101 beside a half-precision one's
    # (17.4 MiB a row measured, budgeted 25): 6.9 pages (440 positions, 30 s) a context at 2,048 contexts
    assert default_max_batch(int(139.8 * GiB)) == 512
    assert sizes(131 * GiB, max_batch=512) == (2048, 12273)
    assert sizes(131 * GiB, max_batch=512, per_row=warmup_bytes_per_row(torch.float16)) == (2048, 14101)
    assert warmup_bytes_per_row(torch.float16) == 25 * MiB and warmup_bytes_per_row(torch.float32) == 50 * MiB
    # an 80-GB H100, a third of an H200 (three models), the CPU: 256 (a CPU engine's 16 slots are its rows)
    assert default_max_batch(int(79.1 * GiB)) == default_max_batch(int(139.8 * GiB / 3)) == default_max_batch(0) == 256
    assert sizes(75 * GiB) == (2048, 6729)


def argv_shares(specs, gpus=None, engines=1, max_contexts=None, ids=("0", "1")):
    """The --memory-share of each engine process's command line, by (GPU, model name); None: no share given."""
    plan = Plan(host="127.0.0.1", port=0, models=[(s.name, s.path) for s in specs], workers=1,
                engines=engine_plan(specs, "cuda", gpus, engines, max_contexts, list(ids)))
    shares = []
    for i, e in enumerate(plan.engines):
        argv = engine_argv(plan, i, f"ipc:///tmp/engine-{i}.ipc")
        share = float(argv[argv.index("--memory-share") + 1]) if "--memory-share" in argv else None
        shares.append((e["cuda_visible"], specs[e["model"]].name, share))
    return shares


def test_engine_processes_sharing_a_gpu_get_an_even_share_unless_a_model_states_its_own():
    a, b, c = ModelSpec("a", "/a"), ModelSpec("b", "/b", gpus="0"), ModelSpec("c", "/c", gpus="1", engines=2)
    # one engine process alone on each GPU: sized from free memory, as a server of one model always was
    assert argv_shares([a]) == [("0", "a", None), ("1", "a", None)]
    # a on both GPUs, b beside it on GPU 0, c's two beside it on GPU 1
    assert argv_shares([a, b, c]) == [("0", "a", 0.5), ("1", "a", 1 / 3), ("0", "b", 0.5), ("1", "c", 1 / 3),
                                      ("1", "c", 1 / 3)]
    assert argv_shares([a], engines=3, ids=("7",)) == [("7", "a", 1 / 3)] * 3
    # a stated share is each engine process's, alone on a GPU too; the others keep 1 / (engine processes there)
    big = ModelSpec("big", "/big", gpus="0", memory_share=0.6)
    assert argv_shares([big, ModelSpec("small", "/s", gpus="0", memory_share=0.25)]) == [("0", "big", 0.6),
                                                                                        ("0", "small", 0.25)]
    assert argv_shares([big]) == [("0", "big", 0.6)]
    # max_contexts wins: its engine processes get no share, but theirs still counts on the GPU
    fixed = ModelSpec("fixed", "/f", gpus="0", max_contexts=64)
    assert argv_shares([fixed, b]) == [("0", "fixed", None), ("0", "b", 0.5)]
    assert argv_shares([a, b], max_contexts=32) == [("0", "a", None), ("1", "a", None), ("0", "b", None)]
    # the CPU sizes no slots from memory
    assert [e.get("memory_share") for e in engine_plan([a, ModelSpec("d", "/d")], "cpu", None, 2, None)] == [None] * 4


def test_engine_processes_without_a_share_split_what_the_stated_ones_leave():
    big = ModelSpec("big", "/big", gpus="1", memory_share=0.6)
    rest = ModelSpec("rest", "/r", gpus="0,1")
    assert argv_shares([big, rest], ids=("0", "1")) == [("1", "big", 0.6), ("0", "rest", None),
                                                         ("1", "rest", pytest.approx(0.4))]
    two = ModelSpec("two", "/t", gpus="1", engines=2)
    assert argv_shares([big, two], ids=("0", "1")) == [("1", "big", 0.6), ("1", "two", pytest.approx(0.2)),
                                                        ("1", "two", pytest.approx(0.2))]


def test_shares_of_one_gpu_above_the_whole_are_refused_naming_the_gpu_and_the_models():
    with pytest.raises(CommandError) as e:
        engine_plan([ModelSpec("big", "/big", gpus="1", memory_share=0.7),
                     ModelSpec("more", "/m", gpus="1", memory_share=0.4)], "cuda", None, 1, None, ["0", "1"])
    assert str(e.value).startswith("GPU 1: the memory shares of its engine processes (big 1 x 0.7, more 1 x 0.4) add "
                                   "up to more than the GPU"), e.value
    with pytest.raises(CommandError, match=r"GPU 0: .*\(big 2 x 0.6\)"):
        engine_plan([ModelSpec("big", "/big", engines=2, memory_share=0.6)], "cuda", None, 1, None, ["0"])
    # a whole GPU stated leaves nothing for an engine process that states no share
    with pytest.raises(CommandError) as e:
        engine_plan([ModelSpec("all", "/a", gpus="0", memory_share=1), ModelSpec("rest", "/r", gpus="0")],
                    "cuda", None, 1, None, ["0"])
    assert str(e.value).startswith("GPU 0: the memory shares of its engine processes (all 1 x 1, rest 1 x unstated) "
                                   "leave nothing for those without one"), e.value
    thirds = ModelSpec("t", "/t", engines=3, memory_share=0.3333333)     # rounded down by whoever wrote it
    assert [e["memory_share"] for e in engine_plan([thirds], "cuda", None, 1, None, ["0"])] == [0.3333333] * 3


def test_models_file_memory_share(tmp_path):
    path = tmp_path / "models.jsonl"
    path.write_text('{"name": "a", "path": "/a", "memory_share": 0.25}\n{"name": "b", "path": "/b", "memory_share": 1}'
                    '\n{"name": "c", "path": "/c"}\n')
    assert [s.memory_share for s in models_file.read(str(path))] == [0.25, 1.0, None]
    for value in ("0", "1.5", "-0.5", "true", '"0.5"', "NaN"):
        path.write_text(f'{{"path": "/a"}}\n{{"name": "b", "path": "/b", "memory_share": {value}}}\n')
        with pytest.raises(CommandError) as e:
            models_file.read(str(path))
        assert str(e.value) == (f"--models {path} line 2: 'memory_share' is a fraction of a GPU's memory, above 0 "
                                "and at most 1"), value


def test_engine_processes_sharing_a_gpu_are_told_so():
    """--shared-gpu (no first frames launched apart: synth/engine.py) for each engine process whose GPU has others,
    whatever their shares; none for one alone on its GPU, nor on the CPU, nor where the engines of a GPU are one
    process (`serve --colocate`: their steps take turns on its thread)."""
    a, b = ModelSpec("a", "/a"), ModelSpec("b", "/b", gpus="0")

    def shared(specs, device="cuda", engines=1, colocate=False):
        plan = Plan(host="127.0.0.1", port=0, models=[(s.name, s.path) for s in specs], workers=1,
                    engines=engine_plan(specs, device, None, engines, None, ["0", "1"]), colocate=colocate)
        return [(e["cuda_visible"], "--shared-gpu" in engine_argv(plan, i, "ipc:///tmp/e")) for i, e in
                enumerate(plan.engines)]

    assert shared([a]) == [("0", False), ("1", False)]
    assert shared([a, b]) == [("0", True), ("1", False), ("0", True)]
    assert shared([ModelSpec("m", "/m", max_contexts=8)], engines=2) == [("0", True), ("0", True), ("1", True),
                                                                          ("1", True)]
    assert shared([a, ModelSpec("c", "/c")], device="cpu") == [(None, False), (None, False)]
    assert shared([a, b], colocate=True) == [("0", False), ("1", False), ("0", False)]
