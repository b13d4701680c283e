"""bench/profile_shares.py: a py-spy raw profile's samples by function, idle (the loop's selector) apart."""
from bench.profile_shares import main, shares


def test_shares_count_inclusive_and_own_samples_of_the_busy_ones(tmp_path, capsys):
    raw = tmp_path / "w.raw"
    raw.write_text("run (a.py:1);route (b.py:2);encode_float (c.py:3) 6\n"
                   "run (a.py:1);route (b.py:2);write (d.py:4) 3\n"
                   "run (a.py:1);EpollSelector.select (selectors.py:468) 11\n")
    total, idle, inclusive, own = shares(str(raw))
    assert (total, idle) == (20, 11)
    assert inclusive["route"] == 9 and inclusive["run"] == 9 and "EpollSelector.select" not in inclusive
    assert own == {"encode_float": 6, "write": 3}
    main([str(raw), "--top", "2"])
    out = capsys.readouterr().out
    assert "20 samples, 55% idle" in out and "| 66.7 | encode_float |" in out
