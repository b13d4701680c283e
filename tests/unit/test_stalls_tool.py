"""bench/stalls.py: a run's pauses found where they began, and grouped where they began together."""
from bench.stalls import Pause, main, pause_counts, pauses, timeline, together


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
    assert "requests by their pauses: 0: 1, 1: 3" in out and "requests with an underrun by their pauses: 1: 1" in out
    main([str(path), "--timeline", "0.5"])
    assert "| 1.00 | 0 | 0 |" in capsys.readouterr().out


def test_requests_by_their_pauses():
    assert pause_counts(RUN, 150) == {0: 1, 1: 3}
    assert pause_counts(RUN, 10) == {1: 1, 3: 1, 4: 1, 10: 1}
    assert pause_counts(RUN, 10, most=5) == {1: 1, 3: 1, 4: 1, 5: 1}


def test_the_timeline_counts_the_requests_receiving_audio_and_those_in_a_pause():
    # request 0 receives audio 1.1-1.41 s (its pause 1.16-1.41), 1 1.1-1.44 (1.12-1.42), 2 3.08-3.28, 3 5.01-5.17
    assert timeline(RUN, 150, 0.5)[2:4] == [(1.0, 0, 0), (1.5, 0, 0)]
    points = dict((t, (n, p)) for t, n, p in timeline(RUN, 150, 0.01))
    assert points[1.15] == (2, 1) and points[1.2] == (2, 2) and points[1.43] == (1, 0) and points[5.1] == (1, 1)
    assert timeline([], 150, 0.5) == []
