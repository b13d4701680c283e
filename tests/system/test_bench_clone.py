"""bench/clone.py (issue 24's cloning measurement, run on the GPU by bench/gpu_clone.sh) against the tiny Base
server on the CPU: every figure is there, the voices it made are gone again, and the ICL voice's streamed TTFA
shows the wait for its text that the prompt layout imposes."""
from __future__ import annotations

import json

from bench import clone
from tests.voicetools import KEY


def test_bench_clone_runs_and_cleans_up(base_server, tmp_path):
    before = sorted((base_server.store / "voices").iterdir()) if (base_server.store / "voices").exists() else []
    out = tmp_path / "clone.json"
    assert clone.main(["--url", base_server.url, "--api-key", KEY, "--out", str(out), "--uploads", "2", "--rounds", "3",
                       "--warmup", "1", "--streamed", "1", "--word-ms", "40"]) == 0
    r = json.loads(out.read_text())
    s = r["summary"]
    assert set(s["ttfa_p50_ms"]) == {"default", "xvector", "icl"} and all(v > 0 for v in s["ttfa_p50_ms"].values())
    assert all(len(r["ttfa"][k]["samples"]) == 3 for k in ("default", "xvector", "icl"))
    assert r["voices"]["icl"]["mode"] == "icl" and r["voices"]["icl"]["audio"]["seconds"] == 10.0
    assert all(s["ready_p50_ms"][m] > s["engine_p50_ms"][m] > 0 for m in ("xvector", "icl"))
    assert set(s["targets"]) == {"ready_ms", "xvector_ttfa_delta_ms", "icl_ttfa_delta_ms"}
    # an ICL context of a 10 s reference needs ~100 text tokens or the end of its text: streamed at 40 ms a
    # word, the 25-word text ends after ~1 s, and the first audio follows it
    words = len(clone.STREAMED.split(" "))
    assert s["streamed_ttfa_p50_ms"]["icl"] > 0.8 * (words - 1) * 40 > s["streamed_ttfa_p50_ms"]["default"]
    after = sorted((base_server.store / "voices").iterdir())
    assert after == before
