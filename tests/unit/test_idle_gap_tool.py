"""bench/idle_gap.py: a context's host parts after a gap spent three ways, on the tiny CPU engine."""
import json
import time

import pytest

from bench.idle_gap import main, spend


def test_each_gap_and_mode_gets_its_row_of_medians_and_p90s(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "idle-gap.json"
    assert main([str(tiny_checkpoint), "--gaps", "5,20", "--modes", "sleep,spin,cuda", "--runs", "2",
                 "--json", str(out)]) == 0
    table = json.loads(out.read_text())["table"]
    assert [(c["gap_ms"], c["mode"]) for c in table] == [(g, m) for g in (5.0, 20.0) for m in ("sleep", "spin", "cuda")]
    for cell in table:
        median, p90 = cell["first_chunk_ms"]
        assert 0 < median <= p90 and {"open_slots", "schedule", "launch"} <= set(cell)
    assert "| 20 | cuda | " in capsys.readouterr().out


def test_a_gap_lasts_its_length_and_an_unknown_mode_is_refused():
    for mode in ("sleep", "spin", "cuda"):
        t0 = time.perf_counter()
        spend(0.03, mode, None)
        assert 0.03 <= time.perf_counter() - t0 < 0.5
    with pytest.raises(ValueError, match="unknown mode 'nap'"):
        spend(0.01, "nap", None)
