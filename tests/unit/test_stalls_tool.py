"""bench/stalls.py: a run's pauses found where they began, and grouped where they began together."""
from bench.stalls import Pause, main, pauses, together


def request(idx, start_s, ttfa_ms, gaps_ms, underruns=0):
    return {"idx": idx, "prompt_id": f"p{idx}", "start_s": start_s, "ttfa_ms": ttfa_ms, "gaps_ms": gaps_ms,
            "underruns": underruns}


RUN = [request(0, 1.0, 100.0, [20, 20, 20, 250, 0, 0]),        # its pause begins 1.0 + 0.1 + 0.06 s in
       request(1, 1.05, 50.0, [20, 300, 20], underruns=1),     # 1.05 + 0.05 + 0.02
       request(2, 3.0, 80.0, [20] * 10),                       # none
       request(3, 5.0, 10.0, [160]),
       {"idx": 4, "prompt_id": "failed", "start_s": 6.0, "ttfa_ms": None, "gaps_ms": []}]


def test_pauses_begin_after_the_audio_before_them():
    assert pauses(RUN, 150) == [Pause(0, "p0", 1.16, 250, 4), Pause(1, "p1", 1.12, 300, 2)][::-1] + \
        [Pause(3, "p3", 5.01, 160, 1)]
    assert [p.request for p in pauses(RUN, 150, underruns_only=True)] == [1]
    assert [p.request for p in pauses(RUN, 200)] == [1, 0]


def test_pauses_that_began_together_are_one_group(capsys):
    groups = together(pauses(RUN, 150), within_ms=200)
    assert [[p.request for p in g] for g in groups] == [[1, 0], [3]]
    assert [[p.request for p in g] for g in together(pauses(RUN, 150), within_ms=10)] == [[1], [0], [3]]


def test_the_table(tmp_path, capsys):
    import json
    path = tmp_path / "requests.json"
    path.write_text(json.dumps(RUN))
    main([str(path)])
    out = capsys.readouterr().out
    assert out.startswith("3 pauses of 150 ms or more, in 2 groups (1 of more than one request)")
    assert "| 1.12-1.16 | 2 | 250-300 | 2, 4 |" in out
