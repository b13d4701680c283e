"""A server process (a gateway worker, the single process) has room for its --max-connections before it listens
(talkgate/system/descriptors.py; tests/unit/test_descriptors.py tests the reservation itself)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.serverproc import TalkgateServer
from tests.unit.test_descriptors import fd_size

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")


@pytest.mark.parametrize("workers", ["1", "0"])
def test_the_process_serving_connections_has_room_for_them_before_it_listens(tiny_checkpoint, workers):
    from talkgate.system.descriptors import SPARE
    from tests.system.test_faults import pids

    with TalkgateServer(tiny_checkpoint, "--workers", workers, "--max-connections", "700", wait="listening") as srv:
        server = pids(srv, "worker")[0] if workers == "1" else srv.proc.pid
        assert fd_size(server) >= 700 + SPARE
        limits = Path(f"/proc/{server}/limits").read_text()
        soft = re.search(r"^Max open files\s+(\d+|unlimited)", limits, re.M).group(1)
        assert soft == "unlimited" or int(soft) >= 700 + SPARE
