"""The soak's CI size (tests/soak.py; docs/reliability.md, "The soak"): 8 minutes of the whole mix against a real
server over TLS with every fault of the schedule once (one about every minute), reconnect storms, slow readers kept
and slow readers cut off. It needs root for the voice store's small filesystem (mount -t tmpfs) and is skipped
without it.

Every check of the runner is asserted but the RSS slope: seven faults in 8 minutes leave each process a few minutes
past its warm-up, too short to tell a slope of 1 MB / 10 min from the engine's allocation steps (docs/reliability.md,
"The RSS slope"). The slope is judged by the hour (python -m tests.soak --minutes 60); here it is only reported."""
from __future__ import annotations

import json
import os

import pytest

from tests import soak

MINUTES = 8


@pytest.mark.slow
@pytest.mark.timeout(MINUTES * 60 + 420)    # start-up, the capacity's 20 s, faults due at the end, the last sessions
@pytest.mark.skipif(os.geteuid() != 0, reason="the voice store's small filesystem needs mount (root)")
def test_eight_minutes_of_mixed_load_and_every_fault_pass_the_soak(tmp_path):
    soak.main(["--minutes", str(MINUTES), "--seed", "1", "--out", str(tmp_path)])
    checks = json.loads((tmp_path / "checks.json").read_text())
    failed = [c["check"] for key, c in checks.items() if key != "rss_slope" and not c["ok"]]
    assert not failed, "failed: " + "; ".join(failed) + "\n\n" + (tmp_path / "report.md").read_text()
