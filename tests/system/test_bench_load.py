"""`talkgate bench` (talkgate/loadgen/, cli/bench.py) against a real `talkgate serve`: a short run of each protocol,
errors failing the run, the ramp, the audio per wall second the engine made (its /metrics counter) and the clients
received."""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from talkgate.cli import bench
from talkgate.loadgen import load
from talkgate.loadgen.measure import parse_prometheus


# ----- a short run against a real `talkgate serve` (tiny random-weight checkpoint, CPU)
@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    from tests.serverproc import TalkgateServer

    with TalkgateServer(tiny_checkpoint) as srv:
        yield srv


def _run(server, tmp_path, *argv) -> tuple[int, dict, list[dict]]:
    out = tmp_path / "results"
    rc = bench.main(["--url", server.url, "--lang", "en", "--bucket", "short", "--duration", "60",
                    "--out", str(out), *argv])
    return rc, json.loads((out / "summary.json").read_text())["summary"], json.loads(
        (out / "requests.json").read_text())


@pytest.mark.parametrize("argv", [["--protocol", "openai"],
                                  ["--protocol", "native", "--encoding", "opus", "--tokens-per-second", "50"],
                                  ["--protocol", "native", "--tokens-per-second", "0"],      # the whole text at once
                                  ["--protocol", "native", "--tokens-per-second", "50", "--token-ids"]])
def test_short_run_against_a_real_server(server, tmp_path, argv):
    rc, summary, requests = _run(server, tmp_path, *argv, "--concurrency", "2", "--requests", "4",
                                 "--cancel-share", "0.5", "--seed", "3", "--warmup", "1")
    assert rc == 0 and summary["errors"] == {} and summary["requests"] == 4
    assert summary["completed"] >= 1 and summary["cancelled"] >= 1     # seed 3: both kinds
    assert summary["server"]["cpu_cores"] is not None                  # /metrics was read
    assert summary["server"]["engine_slow_turns"] is not None
    assert summary["server"]["engine_lane_launches"] == 0              # a CPU engine has no lane
    if Path("/proc/thread-self/schedstat").exists():                  # each loop thread's wait for a CPU
        assert "engine0" in summary["server"]["cpu_wait_share_by_process"]
    for r in requests:
        assert 0 < r["ttfb_ms"] <= r["ttfa_ms"] < 30_000
        frames_ms = 80.0 * r["frames_requested"]
        if r["cancel_sent_at_audio_ms"] is None:     # completed: exactly the frames asked for (Opus: in 20 ms
            # packets, plus libopus' 2.5 ms lookahead so that the tail is not cut)
            want = 20 * np.ceil((frames_ms + 2.5) / 20) if "opus" in argv else frames_ms
            assert r["audio_ms"] == pytest.approx(want)
            assert r["e2e_ms"] >= r["ttfa_ms"] and r["rtf"] > 0
        else:
            assert load.CANCEL_POINT[0] * frames_ms <= r["cancel_sent_at_audio_ms"] <= r["audio_ms"]
            if "native" in argv:
                assert 0 <= r["cancel_to_last_audio_ms"] <= r["cancel_to_cancelled_ms"] < 5_000
    assert (tmp_path / "results" / "summary.md").exists()


def test_errors_fail_the_run(server, tmp_path):
    rc, summary, requests = _run(server, tmp_path, "--protocol", "native", "--voice", "no_such_voice",
                                 "--rps", "5", "--requests", "2", "--warmup", "0")
    assert rc == 1 and summary["errors"] == {"unknown_voice": 2} and not summary["clean"]
    assert all(r["error"]["code"] == "unknown_voice" for r in requests)


def test_ramp_spreads_the_clients_first_starts(server, tmp_path):
    """--ramp 2 with 4 clients in 2 processes: the first requests start 0.5 s apart, in turn across the
    processes (client i of N at i x ramp / N). Text at 2 tokens a second: no client is done (and takes another
    of the 4 requests) before the last has started."""
    rc, summary, requests = _run(server, tmp_path, "--protocol", "native", "--concurrency", "4", "--processes",
                                 "2", "--requests", "4", "--ramp", "2", "--warmup", "0", "--tokens-per-second", "2")
    assert rc == 0 and summary["requests"] == 4
    starts = sorted(r["start_s"] for r in requests)
    # each process times from its own start (a few ms apart), and a loaded CI machine adds some jitter
    assert all(0.3 < b - a < 0.7 for a, b in zip(starts, starts[1:])), starts


def _engine_audio_s(server) -> float:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as resp:
        return parse_prometheus(resp.read().decode())[("talkgate_engine_audio_seconds_total", (("engine", "0"),))]


def test_audio_per_wall_second_made_and_received(server, tmp_path, capsys):
    """The engine's audio counter grows by exactly the audio the clients received (every request completes: no
    frame made for a cancelled one), and the bench's summary, printed and written, shows it per wall second."""
    time.sleep(load.SCRAPE_SETTLE_S)                    # the engine's last published stats count every frame
    before = _engine_audio_s(server)
    rc, summary, requests = _run(server, tmp_path, "--protocol", "openai", "--concurrency", "2", "--requests", "4",
                                 "--seed", "5", "--warmup", "0")
    assert rc == 0 and summary["completed"] == 4
    received = sum(r["audio_ms"] for r in requests) / 1000
    deadline = time.monotonic() + 10                    # the engine publishes its stats every 0.1 s
    while (made := _engine_audio_s(server) - before) < received - 1e-6 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert made == pytest.approx(received, abs=1e-6)

    assert summary["audio_s_per_wall_s"] == pytest.approx(received / summary["wall_s"])
    engines = summary["server"]["engine_audio_s_per_wall_s_by_engine"]
    assert engines.keys() == {"0"} and engines["0"] == pytest.approx(received / summary["wall_s"])
    assert summary["server"]["engine_audio_s_per_wall_s"] == pytest.approx(engines["0"])
    figure = f"audio s per wall s {received / summary['wall_s']:.2f} received, {engines['0']:.2f} made " \
             f"(engine 0 {engines['0']:.2f})"
    assert figure in capsys.readouterr().out
    assert figure.removeprefix("audio s per wall s ") in (tmp_path / "results" / "summary.md").read_text()


def test_an_open_loop_sweep_reports_what_held(server, tmp_path, capsys):
    """`--sweep`: each open-loop level's requests in flight early and late in the level (its line, sweep.md and
    sweep.json), and the highest clean level that held beside the highest clean one. Whether a level of the tiny
    CPU model is clean depends on the machine: the test reads the figures, not a verdict."""
    out = tmp_path / "sweep"
    rc = bench.main(["--url", server.url, "--lang", "en", "--bucket", "short", "--protocol", "openai", "--sweep", "2",
                     "--duration", "4", "--warmup", "1", "--seed", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    sweep = json.loads((out / "sweep.json").read_text())
    (step,) = sweep["steps"]
    early, late = step["in_flight_trend"]
    assert rc == 0 and 0 <= early <= step["peak_in_flight"] and 0 <= late <= step["peak_in_flight"], printed
    assert f"in flight {early:g} -> {late:g}" in printed and f"| {early:g} -> {late:g}" in (out / "sweep.md").read_text()
    assert "highest clean rps: " in printed and "; of those, held (requests in flight grew at most x1.1" in printed
    assert sweep["highest_clean_held"] == (2 if step["clean"] and late <= 1.1 * early else None)
