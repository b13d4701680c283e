"""The soak's short version (tests/soak.py; docs/reliability.md, "The soak"): 3 minutes of the whole mix against a
real server over TLS with every fault of the schedule (one about every 22 s). It needs root for the voice store's
small filesystem (mount -t tmpfs) and is skipped without it."""
from __future__ import annotations

import os

import pytest

from tests import soak


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the voice store's small filesystem needs mount (root)")
def test_three_minutes_of_mixed_load_and_faults_pass_the_soak(tmp_path):
    # Three minutes cannot measure a slope of 1 MB / 10 min (a sample's noise is about that), so the short version
    # bounds the slope loosely: it catches a leak like the heartbeat one of docs/reliability.md (+25 MB / 10 min),
    # the hour measures the real bound. The capacity is measured like the full soak's, to fit the machine.
    code = soak.main(["--minutes", "3", "--seed", "1", "--out", str(tmp_path), "--warm-up-s", "60",
                      "--slope-limit-mb", "15"])
    assert code == 0, (tmp_path / "report.md").read_text()
