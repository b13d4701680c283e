"""bench/draws_ab.py, the draw kernels of two trees side by side: its calls pass the engine's settings (top-k 50,
temperature 0.9, top-p) through each kernel's own signature. Run here in Triton's interpreter (conftest.py), with
this tree's kernel loaded from its path as both trees; the timing itself needs a GPU."""
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is part of the test extra (and of torch on CUDA)")

from bench.draws_ab import calls, inputs  # noqa: E402
from bench.persistent import load_variant  # noqa: E402

KERNEL = Path(__file__).parents[2] / "talkgate" / "synth" / "sample_kernel.py"


@pytest.mark.parametrize("top_p", [1.0, 0.95])
def test_each_trees_draw_and_codebook0_draw_fall_inside_the_top_50(top_p):
    B, V = 3, 2048
    x = inputs(B, V, top_p, "cpu")
    old, new = load_variant(str(KERNEL)), load_variant(str(KERNEL))
    top50 = x["logits"].float().topk(50, dim=1).indices
    ids = []
    for module in (old, new):
        draw, first = calls(module, x, B, V, "cpu")
        got = draw()
        assert all(got[b] in top50[b] for b in range(B)), got
        ids.append(got)
        marked = first()
        assert all(marked[b] in top50[b] for b in range(B)), marked
    assert ids[0].tolist() == ids[1].tolist()
