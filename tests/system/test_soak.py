"""The soak's short version (tests/soak.py; docs/reliability.md, "The soak"): 3 minutes of the whole mix against a
real server over TLS with every fault of the schedule (one about every 22 s). It needs root for the voice store's
small filesystem (mount -t tmpfs) and is skipped without it.

It runs only with TALKGATE_SOAK=1 (so `make test` and CI skip it): everything but the RSS slope passes honestly in
3 minutes (2026-11-28, 10216df: storms, faults, voices, sessions, close codes, the slow reader, no crash), but the
slope cannot be judged in that time. Seven faults in 3 minutes leave each process 70-140 s past its warm-up, and
the engine's RSS rises in steps (an allocation high-water mark: +2 to +12 MB at once, then flat for 100 s and
more, on every engine pid of the runs so far), so one step in a 70 s window reads as +20 to +160 MB / 10 min. A
bound loose enough to pass that could not catch the heartbeat leak (+25 MB / 10 min) it was meant for, so it is not
loosened: the RSS verdict belongs to the long runs (python -m tests.soak --minutes 60)."""
from __future__ import annotations

import os

import pytest

from tests import soak


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TALKGATE_SOAK") != "1",
                    reason="TALKGATE_SOAK=1 runs it: 3 minutes cannot judge the RSS slope (docs/reliability.md)")
@pytest.mark.skipif(os.geteuid() != 0, reason="the voice store's small filesystem needs mount (root)")
def test_three_minutes_of_mixed_load_and_faults_pass_the_soak(tmp_path):
    # The capacity is measured like the full soak's, to fit the machine. The slope bound of 15 MB / 10 min is the
    # one this test was written with; it fails on the engine's allocation steps (see the docstring).
    code = soak.main(["--minutes", "3", "--seed", "1", "--out", str(tmp_path), "--warm-up-s", "60",
                      "--slope-limit-mb", "15"])
    assert code == 0, (tmp_path / "report.md").read_text()
