"""bench/first_audio_alone.py: an open-loop run's first audio split by whether another request was in flight."""
import json

from talkgate.server.latency_trace import STAGES

from bench.first_audio_alone import main


def request(start_s: float, e2e_ms: float, ttfa_ms: float) -> dict:
    return {"start_s": start_s, "e2e_ms": e2e_ms, "ttfa_ms": ttfa_ms, "error": None}


def trace(read_s: float, total_ms: float) -> dict:
    read = int(read_s * 1e9)
    stamps = {s: read + int(i * total_ms * 1e6 / (len(STAGES) - 1)) for i, s in enumerate(STAGES)}
    return {"endpoint": "http:openai", "model": None, "context": 1, "opened": read, "stages": stamps}


def test_the_report_splits_the_client_figures_and_the_stage_budgets(tmp_path, capsys):
    reqs = [request(0.0, 400, 7.0), request(0.1, 100, 6.0), request(2.0, 400, 8.0)]
    (tmp_path / "requests.json").write_text(json.dumps(reqs + [{"start_s": 3, "e2e_ms": 1, "ttfa_ms": None,
                                                                 "error": "timeout"}]))
    offset = 100.0                                          # the server's clock: another origin, one offset
    traces = [trace(offset - 1, 9.0)] + [trace(offset + r["start_s"], r["ttfa_ms"] - 0.5) for r in reqs]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in traces))
    assert main([str(tmp_path), "--trace", str(path), "--skip", "1"]) == 0
    out = capsys.readouterr().out
    assert "all: 3 requests, first audio p50 7.00 ms" in out
    assert "alone (no other request in flight): 2 requests, first audio p50 7.50 ms" in out
    assert "during another's audio: 1 requests, first audio p50 6.00 ms" in out
    assert "| total: read -> written | - | 5.500 | 5.500 |" in out        # the one request during another's


def test_a_trace_of_another_run_is_refused(tmp_path, capsys):
    reqs = [request(0.0, 100, 7.0), request(1.0, 100, 7.0), request(2.0, 100, 7.0)]
    (tmp_path / "requests.json").write_text(json.dumps(reqs))
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(trace(50 + s, 6.0)) + "\n" for s in (0.0, 1.0, 1.5)))
    assert main([str(tmp_path), "--trace", str(path), "--skip", "0"]) == 1
    assert "not this run's requests" in capsys.readouterr().err
