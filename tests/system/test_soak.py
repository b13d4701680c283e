"""The soak's short version (tests/soak.py; docs/reliability.md, "The soak"): 3 minutes of the whole mix against a
real server over TLS, with every fault of the schedule (about one every 22 s). It needs root, for the voice store's
small filesystem (mount -t tmpfs), and is skipped without it."""
from __future__ import annotations

import os

import pytest

from tests import soak


@pytest.mark.skipif(os.geteuid() != 0, reason="the voice store's small filesystem needs mount (root)")
def test_three_minutes_of_mixed_load_and_faults_pass_the_soak(tmp_path):
    # the capacity is measured (20 s) like the full soak's, so the load fits the machine it runs on
    code = soak.main(["--minutes", "3", "--seed", "1", "--out", str(tmp_path)])
    assert code == 0, (tmp_path / "report.md").read_text()
