"""The server's Prometheus series (server/metrics.py) from given engine stats: what /metrics renders of them
(tests/system/test_bench_load.py reads them from a real server)."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from talkgate.ipc.wire import STEP_BUCKETS
from talkgate.loadgen.measure import parse_prometheus
from talkgate.server.metrics import EngineCollector, Metrics

AUDIO = "talkgate_engine_audio_seconds_total"


class PublishedStats:
    """RemoteEngines as EngineCollector reads it: the stats each engine process published last."""

    def __init__(self, engines: list[dict]):
        self.engines = engines

    def stats(self) -> dict:
        return {"engines": self.engines}


def engine_stats(frames: int) -> dict:
    return {"state": "ready", "slots": 4, "free_slots": 4, "running": 0, "waiting": 0,
            "step_buckets": [0] * (len(STEP_BUCKETS) + 1), "step_sum": 0.0, "frames": frames}


def test_each_engine_process_counts_the_audio_it_made_from_its_frames():
    registry = CollectorRegistry()
    registry.register(EngineCollector(PublishedStats([engine_stats(25), {"state": "warming"}, engine_stats(0)])))
    series = parse_prometheus(generate_latest(registry).decode())
    audio = {dict(labels)["engine"]: v for (name, labels), v in series.items() if name == AUDIO}
    assert audio == {"0": pytest.approx(2.0), "2": 0.0}          # 80 ms a frame; engine 1 not heard from yet


def test_an_in_process_engine_counter_takes_the_frames_made_since_the_last_scrape():
    metrics = Metrics()
    audio = lambda: parse_prometheus(metrics.render().decode())[(AUDIO, ())]
    assert audio() == 0.0
    for frames, seconds in ((10, 0.8), (10, 0.8), (35, 2.8)):
        metrics.observe({"frames": frames, "slots": 4, "free_slots": 4}, 0, 16, False)
        assert audio() == pytest.approx(seconds)
    metrics.observe({}, 0, 16, False)                             # stats without a frame count change nothing
    assert audio() == pytest.approx(2.8)


def test_several_models_label_each_engine_by_model_and_its_index_among_the_models():
    """ModelEngines.stats names each engine's model only when several are served (one model: the labels above)."""
    engines = [{**engine_stats(25), "model": "cv"}, {**engine_stats(50), "model": "cv"},
               {**engine_stats(0), "model": "base"}]
    registry = CollectorRegistry()
    registry.register(EngineCollector(PublishedStats(engines)))
    series = parse_prometheus(generate_latest(registry).decode())
    audio = {tuple(sorted(labels)): v for (name, labels), v in series.items() if name == AUDIO}
    assert audio == {(("engine", "0"), ("model", "cv")): pytest.approx(2.0),
                     (("engine", "1"), ("model", "cv")): pytest.approx(4.0),
                     (("engine", "0"), ("model", "base")): 0.0}
    loop = [dict(labels) for (name, labels), _ in series.items() if name == "talkgate_engine_slots"]
    assert {(d["engine"], d["model"]) for d in loop} == {("0", "cv"), ("1", "cv"), ("0", "base")}


ROOF = "talkgate_engine_step_roof_seconds_total"


def test_the_steps_roofline_seconds_only_where_an_engine_reports_them():
    """An engine on a GPU whose peaks it knows reports its steps' roofline seconds (synth/roofline.py); one that does
    not (a CPU, an unknown GPU) has no such series rather than a zero that would read as 0% of the roofline."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(PublishedStats([{**engine_stats(25), "step_roof_s": 1.5}, engine_stats(5)])))
    series = parse_prometheus(generate_latest(registry).decode())
    assert {dict(labels)["engine"]: v for (name, labels), v in series.items() if name == ROOF} == {"0": 1.5}
    registry = CollectorRegistry()
    registry.register(EngineCollector(PublishedStats([engine_stats(5)])))
    assert ROOF not in {name for name, _ in parse_prometheus(generate_latest(registry).decode())}
    metrics = Metrics()                                           # an in-process engine: from its stats at each scrape
    assert ROOF not in {name for name, _ in parse_prometheus(metrics.render().decode())}
    for roof_s in (0.25, 0.75):
        metrics.observe({"frames": 1, "step_roof_s": roof_s, "slots": 4, "free_slots": 4}, 0, 16, False)
        assert parse_prometheus(metrics.render().decode())[(ROOF, ())] == pytest.approx(roof_s)


PREFIXES = "talkgate_engine_prompt_prefixes_total"


def test_new_contexts_by_whether_their_prompt_prefix_was_kept():
    """Each engine's counts of new contexts whose prompt's prefix was found kept or was prefilled (synth/runner.py),
    from the engine processes' published stats, and from an in-process engine's at each scrape."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(PublishedStats([{**engine_stats(5), "prompt_prefixes": {"kept": 7,
                                                                                               "prefilled": 2}},
                                                      engine_stats(5)])))
    series = parse_prometheus(generate_latest(registry).decode())
    assert {(dict(labels)["engine"], dict(labels)["found"]): v for (name, labels), v in series.items()
            if name == PREFIXES} == {("0", "kept"): 7, ("0", "prefilled"): 2}
    metrics = Metrics()
    for kept, prefilled in ((0, 1), (3, 1), (10, 2)):
        metrics.observe({"prompt_prefixes": {"kept": kept, "prefilled": prefilled}, "slots": 4, "free_slots": 4},
                        0, 16, False)
        series = parse_prometheus(metrics.render().decode())
        assert (series[(PREFIXES, (("found", "kept"),))], series[(PREFIXES, (("found", "prefilled"),))]) == (
            kept, prefilled)


@pytest.mark.parametrize("name, stat", [("talkgate_engine_lane_launches_total", "lane_launches"),
                                        ("talkgate_engine_first_apart_launches_total", "first_apart_launches"),
                                        ("talkgate_engine_first_decodes_total", "first_decodes"),
                                        ("talkgate_engine_keep_warm_touches_total", "keep_warm_touches"),
                                        ("talkgate_engine_kv_full_failures_total", "kv_full_failures")])
def test_engine_counts_first_frames_on_the_lane_apart_decoded_ahead_and_its_idle_touches(name, stat):
    """Each engine's count of new contexts whose first frame took the first-frame lane (synth/lane.py), of steps whose
    new contexts' first frames were launched apart, of steps whose new contexts' first frames were decoded ahead of
    the others' (synth/engine.py), of its touches of the GPU while idle (Runner.keep_warm) and of the contexts it
    failed for want of a KV page (synth/pages.py), from the engine
    processes' published stats (0 where an engine says none), and from an in-process engine's at each scrape."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(PublishedStats([{**engine_stats(5), stat: 12}, engine_stats(5)])))
    series = parse_prometheus(generate_latest(registry).decode())
    assert {dict(labels)["engine"]: v for (n, labels), v in series.items() if n == name} == {"0": 12, "1": 0}
    metrics = Metrics()
    for n in (0, 4, 9):
        metrics.observe({stat: n, "slots": 4, "free_slots": 4}, 0, 16, False)
        assert parse_prometheus(metrics.render().decode())[(name, ())] == n


PENDING = "talkgate_engine_graphs_pending"
KV_PAGES, KV_FREE = "talkgate_engine_kv_pages", "talkgate_engine_kv_pages_free"


def test_kv_pages_and_those_free_per_engine():
    """Each engine's Talker KV pages and those no context holds (synth/pages.py), from the engine processes' published
    stats (none from an engine that does not report them) and from an in-process engine's at each scrape."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(PublishedStats([{**engine_stats(5), "kv_pages": 14000, "free_kv_pages": 9000},
                                                      engine_stats(5)])))
    series = parse_prometheus(generate_latest(registry).decode())
    for name, want in ((KV_PAGES, {"0": 14000}), (KV_FREE, {"0": 9000})):
        assert {dict(labels)["engine"]: v for (n, labels), v in series.items() if n == name} == want
    metrics = Metrics()
    for free in (14000, 13, 0):
        metrics.observe({"kv_pages": 14000, "free_kv_pages": free, "slots": 4, "free_slots": 0}, 0, 16, False)
        series = parse_prometheus(metrics.render().decode())
        assert (series[(KV_PAGES, ())], series[(KV_FREE, ())]) == (14000, free)


def test_graphs_still_to_capture_after_warm_up():
    """Each engine's CUDA graphs still to capture (while any are, a capture may hold it for seconds), from the engine
    processes' published stats and from an in-process engine's at each scrape."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(PublishedStats([{**engine_stats(5), "graphs_pending": 94}, engine_stats(5)])))
    series = parse_prometheus(generate_latest(registry).decode())
    assert {dict(labels)["engine"]: v for (name, labels), v in series.items() if name == PENDING} == {"0": 94, "1": 0}
    metrics = Metrics()
    for n in (94, 3, 0):
        metrics.observe({"graphs_pending": n, "slots": 4, "free_slots": 4}, 0, 16, False)
        assert parse_prometheus(metrics.render().decode())[(PENDING, ())] == n


def test_a_stalled_worker_loop_is_logged_with_its_lateness_once_a_second(caplog):
    """A wake-up LOOP_STALL_S late or more is a stall every connection of the worker heard: logged (and observed);
    one line a second at most."""
    import asyncio
    import logging
    import time

    from talkgate.server.metrics import LOOP_STALL_S

    async def go():
        metrics = Metrics(worker=3)
        watch = asyncio.create_task(metrics.watch_loop_lag(interval=0.01))
        await asyncio.sleep(0.05)
        for _ in range(2):                      # two stalls within a second: one line
            time.sleep(LOOP_STALL_S * 1.5)      # the loop held, as a blocking call would
            await asyncio.sleep(0.03)
        watch.cancel()
        return metrics

    with caplog.at_level(logging.WARNING, logger="talkgate.metrics"):
        metrics = asyncio.run(go())
    stalls = [r.getMessage() for r in caplog.records if "woke" in r.getMessage()]
    assert len(stalls) == 1 and stalls[0].startswith("worker 3: its event loop woke 1"), stalls
    lag = parse_prometheus(metrics.render().decode())
    bucket = lambda le: lag[("talkgate_event_loop_lag_seconds_bucket", (("le", le), ("worker", "3")))]
    assert bucket("0.25") - bucket("0.1") >= 2                 # both stalls observed


def test_every_protocols_context_count_is_there_at_zero_from_the_start():
    """A worker's first context of a protocol does not make its series (0.1 ms in a multiprocess registry on the
    first audio's path): each front end's label is made with the Metrics, and each label a front end passes to
    Gateway.new_session is one of them."""
    import pathlib
    import re

    import talkgate.server
    from talkgate.server.metrics import PROTOCOLS

    series = parse_prometheus(Metrics().render().decode())
    assert {dict(labels)["protocol"]: v for (name, labels), v in series.items()
            if name == "talkgate_contexts_total"} == dict.fromkeys(PROTOCOLS, 0.0)
    source = "".join(p.read_text() for p in pathlib.Path(talkgate.server.__file__).parent.glob("*.py"))
    used = set(re.findall(r'new_session\("(\w+)"', source)) | set(re.findall(r'label = "(\w+)"', source))
    assert used == set(PROTOCOLS)
