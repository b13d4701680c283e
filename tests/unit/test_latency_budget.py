"""bench/latency_trace.py's budget of a `--trace-latency` file: the requests of each endpoint and served model apart
(a line's `model`, null for the default), and `--model` keeps one model's."""
from __future__ import annotations

import json

from bench import latency_trace
from talkgate.server.latency_trace import STAGES


def line(model, step_ms: float) -> str:
    times = [int(i * step_ms * 1e6) for i in range(len(STAGES))]
    return json.dumps({"endpoint": "http:openai", "model": model, "context": 1, "opened": 0,
                       "stages": dict(zip(STAGES, times))})


def test_each_models_requests_are_budgeted_apart(tmp_path, capsys):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join([line(None, 1.0), line("clone", 2.0), line("clone", 2.0)]) + "\n")
    assert latency_trace.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "http:openai: 1 requests" in out and "http:openai model clone: 2 requests" in out
    total = [row for row in out.splitlines() if row.startswith("| total")]
    assert len(total) == 2 and "| 12.000 |" in total[0] and "| 24.000 |" in total[1], total
    assert latency_trace.main([str(path), "--model", "clone"]) == 0
    out = capsys.readouterr().out
    assert "model clone: 2 requests" in out and "http:openai: 1" not in out
