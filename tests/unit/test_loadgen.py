"""The load generator (talkgate/loadgen/, cli/bench.py), its pure parts against known answers: arrivals, text deltas,
the player, the summary, the parsers, the command line (tests/system/test_bench_load.py runs it against a server)."""
from __future__ import annotations

import dataclasses
import itertools
import json
import random
import statistics
from dataclasses import asdict, replace

import numpy as np
import pytest

from talkgate.cli import bench
from talkgate.loadgen import load
from talkgate.loadgen import measure
from talkgate.loadgen import prompts
from talkgate.loadgen import report
from talkgate.synth.request import frames_for_text


# ----- schedules and text
def test_poisson_schedule_statistics():
    rng = random.Random(7)
    arrivals = measure.poisson_arrivals(10.0, 1000.0, rng)
    gaps = [b - a for a, b in itertools.pairwise([0.0, *arrivals])]
    assert abs(len(arrivals) - 10_000) < 400                  # count ~ Poisson(10000): sd 100
    assert abs(statistics.fmean(gaps) - 0.1) < 0.004          # exponential gaps: mean 1/rate ...
    assert abs(statistics.pstdev(gaps) / statistics.fmean(gaps) - 1) < 0.05   # ... and sd = mean
    assert all(0 <= a < b < 1000 for a, b in itertools.pairwise(arrivals))
    # about 10 % of the gaps exceed ln(10)/rate, as for an exponential distribution
    assert abs(sum(g > np.log(10) / 10 for g in gaps) / len(gaps) - 0.1) < 0.01


def test_poisson_schedule_is_seeded_and_bounded():
    a = measure.poisson_arrivals(5.0, 30.0, random.Random(3))
    assert a == measure.poisson_arrivals(5.0, 30.0, random.Random(3))
    assert a != measure.poisson_arrivals(5.0, 30.0, random.Random(4))
    assert measure.poisson_arrivals(5.0, 30.0, random.Random(3), limit=4) == a[:4]
    with pytest.raises(ValueError):
        measure.poisson_arrivals(0.0, 30.0, random.Random(3))


def test_token_deltas_are_the_qwen_tokens_of_the_text():
    assert measure.token_deltas("Hello there, friend.") == ["Hello", " there", ",", " friend", "."]
    assert measure.token_deltas("你好，世界。") == ["你好", "，", "世界", "。"]      # a word is often one token
    assert measure.token_deltas("我的 iPhone 坏了") == ["我的", " iPhone", " 坏", "了"]
    assert measure.token_deltas("  lead ") == [" ", " lead", " "]
    assert measure.token_deltas("") == []
    # a character that byte-level BPE splits into several tokens is sent whole, in one delta
    tokenizer = measure.qwen_tokenizer()
    assert len(tokenizer.encode("𠀀")) == 3 and measure.token_deltas("𠀀") == ["𠀀"]
    assert measure.token_deltas("喝𠀀水") == ["喝", "𠀀", "水"]
    for p in prompts.select():
        for text in (p["text"], " \n" + p["text"] + "  \n"):
            deltas = measure.token_deltas(text)
            assert "".join(deltas) == text and all(deltas)
        if p["lang"] == "en":                  # no split characters: one delta per token
            assert len(measure.token_deltas(p["text"])) == len(tokenizer.encode(p["text"]))


def test_a_native_requests_text_messages_are_the_text_its_tokens_or_their_ids():
    from dataclasses import replace
    cfg = load.Config(url="http://x", protocol="native")
    text = "Hello there, friend."
    assert load.text_messages(text, cfg) == [{"text": d} for d in ["Hello", " there", ",", " friend", "."]]
    assert load.text_messages(text, replace(cfg, tokens_per_second=0)) == [{"text": text}]
    ids = load.text_messages(text, replace(cfg, token_ids=True))
    assert ids == [{"ids": [i]} for i in measure.qwen_tokenizer().encode(text)] and len(ids) == 5


def test_jobs_are_seeded_and_cancel_share_holds():
    cfg = load.Config(cancel_share=0.3, bucket="short", lang="en", seed=1)
    jobs = list(itertools.islice(load.job_stream(cfg, random.Random(1)), 2000))
    again = list(itertools.islice(load.job_stream(cfg, random.Random(1)), 2000))
    assert [(j.prompt["id"], j.cancel_at) for j in jobs] == [(j.prompt["id"], j.cancel_at) for j in again]
    cancelled = [j.cancel_at for j in jobs if j.cancel_at is not None]
    assert abs(len(cancelled) / len(jobs) - 0.3) < 0.04
    assert all(load.CANCEL_POINT[0] <= c <= load.CANCEL_POINT[1] for c in cancelled)
    assert all(j.frames == frames_for_text(j.prompt["text"]) for j in jobs)
    assert {j.prompt["bucket"] for j in jobs} == {"short"} and {j.prompt["lang"] for j in jobs} == {"en"}
    model_len = load.Config(length="model")
    assert next(load.job_stream(model_len, random.Random(1))).frames is None


def test_prompt_set_buckets():
    for lang in prompts.LANGS:
        for bucket in prompts.BUCKETS:
            chosen = prompts.select(lang, bucket)
            assert len(chosen) == 10          # a missing comma between two texts would merge them
            lo, hi = prompts.BUCKET_CHARS[bucket]
            assert all(lo <= len(p["text"]) <= hi for p in chosen), [len(p["text"]) for p in chosen]
    assert len({p["text"] for p in prompts.select()}) == 90
    with pytest.raises(ValueError):
        prompts.select("fr")


# ----- the simulated player
def test_player_steady_stream_has_no_underruns():
    assert measure.simulate_player([(80.0 * i, 80.0) for i in range(50)]) == (0, 0.0, None)
    assert measure.simulate_player([(10.0 * i, 80.0) for i in range(50)]) == (0, 0.0, None)   # ahead of real time
    assert measure.simulate_player([]) == (0, 0.0, None)


def test_player_counts_stalls_with_known_answers():
    # played until 160 ms, next chunk at 200: one 40 ms stall, with 160 ms of audio played (frame 2's turn)
    assert measure.simulate_player([(0.0, 80.0), (80.0, 80.0), (200.0, 80.0)]) == (1, 40.0, 160.0)
    # a burst does not help later: buffer runs out at 160, chunk at 300 (140 ms), then 380 -> 460 ok, 600 (140 ms)
    chunks = [(0.0, 80.0), (10.0, 80.0), (300.0, 80.0), (380.0, 80.0), (600.0, 80.0)]
    assert measure.simulate_player(chunks) == (2, 280.0, 160.0)
    # the player starts at the first chunk, not at time zero: a late start is TTFA, not an underrun
    assert measure.simulate_player([(500.0, 80.0), (580.0, 80.0)]) == (0, 0.0, None)


def test_player_tolerance():
    chunks = [(0.0, 20.0), (20.5, 20.0), (41.0, 20.0)]
    assert measure.simulate_player(chunks, tolerance_ms=1.0) == (0, 0.0, None)
    count, stalled, first = measure.simulate_player(chunks, tolerance_ms=0.0)
    assert count == 2 and stalled == pytest.approx(1.0) and first == 20.0


def test_timeline_plays_only_until_the_cancel():
    tl = load.Timeline()
    for i in range(10):
        tl.add(1.0 + 0.08 * i + (0.2 if i >= 6 else 0.0), 80.0, True)   # a 200 ms stall before chunk 6
    r = load.Result(0, "en-short-00", "en", "short", 10, 5)
    tl.record(r, 1.0, until=1.0 + 0.08 * 5 + 0.01, tolerance_ms=1.0)   # cancelled after chunk 5
    assert r.ttfa_ms == pytest.approx(0.0) and r.chunks == 10 and r.audio_ms == 800.0
    assert r.underruns == 0 and len(r.gaps_ms) == 5
    tl.record(r, 1.0, until=None, tolerance_ms=1.0)
    assert r.underruns == 1 and r.underrun_ms == pytest.approx(200.0) and r.max_gap_ms == pytest.approx(280.0)


# ----- statistics
def test_percentiles_match_numpy():
    rng = np.random.default_rng(0)
    values = list(rng.lognormal(3, 1, 1001))
    for q in (0, 50, 95, 99, 100):
        assert measure.percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert measure.percentile([1, 2, 3, 4, 5], 95) == pytest.approx(4.8)
    s = measure.stats([4.0, None, 1.0, 3.0, 2.0])
    assert s == {"n": 4, "p50": 2.5, "p95": pytest.approx(3.85), "p99": pytest.approx(3.97), "mean": 2.5, "max": 4.0}
    assert measure.stats([None]) is None
    with pytest.raises(ValueError):
        measure.percentile([], 50)


def _result(i, ttfa=10.0, underruns=0, error=None, start_s=None, dry_at=None, e2e=None, prompt="en-short-00"):
    return load.Result(i, prompt, "en", "short", 10, 9, ttfa_ms=ttfa, ttfb_ms=ttfa, underruns=underruns,
                       audio_ms=720.0, error=error, start_s=start_s, first_underrun_audio_ms=dry_at, e2e_ms=e2e)


def test_summary_clean_criterion():
    cfg = load.Config(rps=1.0, ttfa_limit_ms=150.0)
    summarize = lambda rs: load.summarize(cfg, rs, 10.0, 10.0, 3, {}, None, [0.1])
    assert summarize([_result(i) for i in range(20)])["clean"]
    s = summarize([_result(i) for i in range(19)] + [_result(19, underruns=2)])
    assert not s["clean"] and s["underruns"] == 2 and s["requests_with_underruns"] == 1
    s = summarize([_result(i) for i in range(18)] + [_result(18, ttfa=400.0), _result(19, ttfa=400.0)])
    assert not s["clean"] and s["metrics"]["ttfa_ms"]["p95"] > 150
    s = summarize([_result(i) for i in range(19)] + [_result(19, error={"code": "timeout", "message": ""})])
    assert not s["clean"] and s["errors"] == {"timeout": 1} and s["metrics"]["ttfa_ms"]["n"] == 19
    assert s["achieved_rps"] == pytest.approx(2.0) and s["audio_s_per_wall_s"] == pytest.approx(19 * 0.072)


def test_summary_splits_underrun_requests_by_start_and_first_dry_frame():
    cfg = load.Config(concurrency=8, ramp_s=2.0)
    rs = [_result(0, start_s=0.5, prompt="zh-medium-07"), _result(1, underruns=1, start_s=0.7, dry_at=80.0),
          _result(2, underruns=2, start_s=1.9, dry_at=80.0, prompt="zh-medium-07"),
          _result(3, underruns=1, start_s=2.5, dry_at=160.0, prompt="zh-medium-07"),
          _result(4, underruns=1, start_s=6.0, dry_at=4000.0)]
    s = load.summarize(cfg, rs, 10.0, None, 8, {}, None, [0.1])
    assert s["underrun_requests"] == {"in_ramp": 2, "after_ramp": 2, "first_dry_frame": {"1": 2, "2": 1, "4+": 1},
                                      "prompts": {"zh-medium-07": [2, 3], "en-short-00": [2, 2]}}
    md = report.markdown(asdict(cfg), s)
    assert "| underrun requests: started in the ramp / after it; first ran dry at frame | 2 / 2; 1: 2, 2: 1, 4+: 1 |" in md
    assert "| underrun requests by prompt (the most; of its requests) | en-short-00 2 of 2, zh-medium-07 2 of 3 |" in md


def test_summary_gives_the_text_slack_of_the_prompts_that_underran_when_the_text_was_streamed():
    """Streamed as text (native, a token a delta): each prompt with underrun requests carries the time its text's pace
    leaves a server (measure.text_slack); not where the text came whole (OpenAI) or as token ids."""
    rs = [_result(0, underruns=1, start_s=5.0, dry_at=80.0, prompt="zh-long-00"),
          _result(1, underruns=1, start_s=6.0, dry_at=80.0, prompt="en-long-00")]
    native = load.Config(protocol="native", concurrency=8)
    s = load.summarize(native, rs, 10.0, None, 8, {}, None, [0.1])
    assert s["underrun_requests"]["prompt_slack_ms"] == {"zh-long-00": 0.0, "en-long-00": 40.0}
    assert ("zh-long-00 1 of 1 (text slack 0 ms), en-long-00 1 of 1 (text slack 40 ms)"
            in report.markdown(asdict(native), s))
    for cfg in (load.Config(concurrency=8), load.Config(protocol="native", concurrency=8, token_ids=True)):
        assert "prompt_slack_ms" not in load.summarize(cfg, rs, 10.0, None, 8, {}, None, [0.1])["underrun_requests"]


def test_summary_splits_first_audio_by_how_close_behind_another_a_request_started():
    """A request that starts within 10 ms of the one before it may find that one's first frame still being made: its
    first audio is reported apart (the first request of a run is never close behind one)."""
    cfg = load.Config(rps=20.0)
    rs = [_result(0, ttfa=30.0, start_s=0.004), _result(1, ttfa=8.0, start_s=0.100),
          _result(2, ttfa=16.0, start_s=0.105), _result(3, ttfa=7.0, start_s=0.300),
          _result(4, ttfa=18.0, start_s=0.3099), _result(5, start_s=None)]
    s = load.summarize(cfg, rs, 10.0, 10.0, 3, {}, None, [0.1])
    split = s["ttfa_by_arrival"]
    assert split["within_ms"] == 10.0
    assert split["close"]["n"] == 2 and split["close"]["p50"] == 17.0
    assert split["apart"]["n"] == 3 and split["apart"]["p50"] == 8.0 and split["apart"]["max"] == 30.0
    assert ("| first audio of the requests that started close behind the one before them, and of the others; of those "
            "that started while another was streaming, and of those that found none: n, p50 / p95 (ms) | within 10 "
            "ms: 2, 17.0 / 17.9; the others: 3, 8.0 / 27.8; while another was streaming: none; with none: 5, 16.0 / "
            "27.6 |") in report.markdown(asdict(cfg), s)
    assert load.summarize(cfg, [_result(0, start_s=1.0)], 10.0, 10.0, 1, {}, None, [0.1])["ttfa_by_arrival"][
        "close"] is None


def test_summary_splits_first_audio_by_whether_another_request_was_streaming_when_it_started():
    """At a low rate a request that comes while another is still receiving audio finds the engine making that one's
    frames: its first audio is reported apart from those that found no request of the run in flight (an earlier
    request's end is its start plus e2e; one without e2e ends nothing)."""
    cfg = load.Config(rps=1.0)
    rs = [_result(0, ttfa=7.0, start_s=0.0, e2e=300.0), _result(1, ttfa=10.0, start_s=0.2, e2e=300.0),
          _result(2, ttfa=9.0, start_s=0.45, e2e=300.0), _result(3, ttfa=7.5, start_s=1.0, e2e=None),
          _result(4, ttfa=8.0, start_s=1.1, e2e=300.0), _result(5, ttfa=6.0, start_s=2.0, e2e=300.0)]
    split = load.summarize(cfg, rs, 10.0, 10.0, 2, {}, None, [0.1])["ttfa_by_arrival"]
    assert split["during_another"]["n"] == 2 and split["during_another"]["p50"] == 9.5     # 1 (behind 0), 2 (behind 1)
    assert split["alone"]["n"] == 4 and split["alone"]["max"] == 8.0                        # 0, 3, 4 (3 ends nothing), 5


# ----- wire formats
def test_audio_header_parsing():
    frame = measure.HEADER.pack(1, 2, 0, 7, 3, 240) + b"\x00\x01" * 4
    assert measure.parse_audio_header(frame) == (2, 7, 3, 240)
    with pytest.raises(ValueError):
        measure.parse_audio_header(frame[:10])
    with pytest.raises(ValueError):
        measure.parse_audio_header(measure.HEADER.pack(2, 2, 0, 7, 3, 240))


def test_opus_packet_durations():
    assert measure.opus_packet_ms(bytes([31 << 3])) == 20          # CELT FB 20 ms, one frame
    assert measure.opus_packet_ms(bytes([(31 << 3) | 1])) == 40    # two frames
    assert measure.opus_packet_ms(bytes([(28 << 3) | 3, 3])) == 7.5  # CELT 2.5 ms x 3
    assert measure.opus_packet_ms(bytes([1 << 3])) == 20           # SILK NB 20 ms
    assert measure.opus_packet_ms(bytes([13 << 3])) == 20          # hybrid 20 ms
    with pytest.raises(ValueError):
        measure.opus_packet_ms(b"")
    import opuslib
    enc = opuslib.Encoder(48000, 1, opuslib.APPLICATION_AUDIO)
    tone = (np.sin(np.arange(960) * 0.05) * 8000).astype(np.int16).tobytes()
    packet = enc.encode(tone, 960)
    assert measure.opus_packet_ms(packet) == 20
    probe = load.OpusProbe(48000)
    assert not probe.playable(b"\xff")        # code-3 packet without its count byte: not decodable
    assert probe.playable(packet) and probe.playable(b"\xff")   # once playable, later packets count as audio


METRICS_TEXT = """# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total {cpu}
talkgate_errors_total{{code="engine_full"}} {err}
talkgate_errors_total{{code="timeout"}} 1.0
talkgate_contexts_active 0.0
talkgate_event_loop_lag_seconds_bucket{{le="0.001"}} {b1}
talkgate_event_loop_lag_seconds_bucket{{le="0.01"}} {b2}
talkgate_event_loop_lag_seconds_bucket{{le="+Inf"}} {b3}
talkgate_event_loop_lag_seconds_count {b3}
talkgate_event_loop_lag_seconds_sum {sum}
"""


def test_prometheus_parsing_and_deltas():
    before = measure.parse_prometheus(METRICS_TEXT.format(cpu=10.0, err=2.0, b1=5, b2=5, b3=5, sum=0.001))
    after = measure.parse_prometheus(METRICS_TEXT.format(cpu=15.0, err=5.0, b1=85, b2=103, b3=105, sum=0.201))
    assert after[("talkgate_errors_total", (("code", "engine_full"),))] == 5.0
    lag = measure.histogram_delta(before, after, "talkgate_event_loop_lag_seconds")
    assert lag["count"] == 100 and lag["mean"] == pytest.approx(0.002)
    assert lag["p50_le"] == 0.001 and lag["p95_le"] == 0.01 and lag["p99_le"] == float("inf")
    assert lag["max_le"] == float("inf")
    assert report.seconds_as_ms(lag) == "2.00 / inf / inf"
    early = measure.histogram_delta(before, measure.parse_prometheus(METRICS_TEXT.format(
        cpu=15.0, err=5.0, b1=104, b2=105, b3=105, sum=0.011)), "talkgate_event_loop_lag_seconds")
    assert report.seconds_as_ms(early) == "0.10 / 1.00 / 10.00"    # one of 100 in the 10-ms bucket: only the max says
    assert measure.histogram_delta(before, after, "talkgate_contexts_active") == {"value": 0.0}
    assert measure.histogram_delta(before, after, "talkgate_missing_seconds") is None
    server = load.server_numbers(before, after, wall_s=10.0)
    assert server["cpu_cores"] == pytest.approx(0.5) and server["errors"] == 3.0
    assert server["engine_step_s"] is None and server["underrun_risk"] is None
    assert load.server_numbers({}, {}, 10.0)["cpu_cores"] is None      # no /metrics: numbers are absent


ENGINE_AUDIO_TEXT = """# TYPE talkgate_engine_audio_seconds_total counter
talkgate_engine_audio_seconds_total{{engine="0"}} {e0}
talkgate_engine_audio_seconds_total{{engine="1"}} {e1}
talkgate_engine_audio_seconds_total{{engine="2"}} {e2}
"""


def test_audio_per_wall_second_received_and_made_by_each_engine():
    """The headline figure in all (the clients') and per engine (the server's counter over the run); an engine
    restarted during the run counts from 0 again and is left out rather than counted negative."""
    before = measure.parse_prometheus(ENGINE_AUDIO_TEXT.format(e0=100.0, e1=40.0, e2=30.0))
    after = measure.parse_prometheus(ENGINE_AUDIO_TEXT.format(e0=116.0, e1=48.0, e2=2.0))
    server = load.server_numbers(before, after, wall_s=10.0)
    assert server["engine_audio_s_per_wall_s_by_engine"] == {"0": pytest.approx(1.6), "1": pytest.approx(0.8)}
    assert server["engine_audio_s_per_wall_s"] == pytest.approx(2.4)
    single = "talkgate_engine_audio_seconds_total {}\n"           # `--workers 0`: one engine, no label
    server_one = load.server_numbers(measure.parse_prometheus(single.format(3.0)),
                                     measure.parse_prometheus(single.format(9.0)), wall_s=4.0)
    assert server_one["engine_audio_s_per_wall_s"] == pytest.approx(1.5)
    assert server_one["engine_audio_s_per_wall_s_by_engine"] is None
    assert load.server_numbers({}, {}, 10.0)["engine_audio_s_per_wall_s"] is None

    cfg = load.Config(rps=2.0)
    s = load.summarize(cfg, [_result(i) for i in range(19)], 10.0, 10.0, 3, server, None, [0.1])
    shown = "1.37 received, 2.40 made (engine 0 1.60, engine 1 0.80)"      # 19 x 0.72 s in 10 s
    assert f"audio s per wall s {shown}, " in report.one_line(s)
    assert f"| audio s per wall s: received by the clients, made by the engines (by engine) | {shown} |" \
        in report.markdown(asdict(cfg), s)
    s = load.summarize(cfg, [_result(0)], 10.0, 10.0, 3, {}, None, [0.1])   # no /metrics
    assert "audio s per wall s 0.07 received, - made, " in report.one_line(s)


def test_audio_per_wall_second_by_engine_of_each_model():
    """A server of several models labels its engines by model: the figure per engine shows each, by model and then by
    index as a number (engine 10 after engine 2)."""
    def text(v: float) -> str:
        return "".join(f'talkgate_engine_audio_seconds_total{{model="{m}",engine="{e}"}} {v}\n'
                       for m, e in (("cv", 0), ("cv", 10), ("cv", 2), ("clone", 0)))
    server = load.server_numbers(measure.parse_prometheus(text(0.0)), measure.parse_prometheus(text(5.0)), wall_s=10.0)
    s = load.summarize(load.Config(rps=2.0), [_result(0)], 10.0, 10.0, 3, server, None, [0.1])
    assert "(engine clone/0 0.50, engine cv/0 0.50, engine cv/2 0.50, engine cv/10 0.50)" in report.one_line(s)


def test_lane_launches_are_those_of_the_run_s_model():
    """Three loads on three models of one server, one `talkgate bench` each: a run's first frames made on the lane are
    its model's engines' (a run on cv counted all three models' 1,039 against its own 374 requests); a run naming no
    served model, or a one-model server, counts every engine."""
    def text(v: float) -> str:
        return "".join(f'talkgate_engine_lane_launches_total{{model="{m}",engine="0"}} {v * k}\n'
                       for k, m in enumerate(("cv", "clone", "design"), 1))
    before, after = measure.parse_prometheus(text(0.0)), measure.parse_prometheus(text(10.0))
    assert load.server_numbers(before, after, 10.0, "clone")["engine_lane_launches"] == 20
    assert load.server_numbers(before, after, 10.0, "talkgate")["engine_lane_launches"] == 60
    one = 'talkgate_engine_lane_launches_total{engine="0"} %s\n'
    assert load.server_numbers(measure.parse_prometheus(one % 3), measure.parse_prometheus(one % 7), 10.0,
                               "cv")["engine_lane_launches"] == 4


def test_a_run_while_the_server_still_captures_graphs_says_so():
    """A run begun before the server's engines captured every CUDA graph (first audio then includes captures that
    hold an engine for seconds) is flagged in the one-line result and the summary; a warm server's run is not."""
    def text(e0: float, e1: float) -> str:
        return f'talkgate_engine_graphs_pending{{engine="0"}} {e0}\ntalkgate_engine_graphs_pending{{engine="1"}} {e1}\n'
    cfg = load.Config(rps=1.0)
    server = load.server_numbers(measure.parse_prometheus(text(90, 4)), measure.parse_prometheus(text(0, 0)), 10.0)
    assert server["engine_graphs_pending"] == [94, 0]
    s = load.summarize(cfg, [_result(0)], 10.0, 10.0, 3, server, None, [0.1])
    assert "WARNING: the server was still capturing CUDA graphs (94 pending at the start, 0 at the end)" in \
        report.one_line(s)
    assert "WARNING: the server was still capturing CUDA graphs" in report.markdown(asdict(cfg), s)
    warm = load.server_numbers(measure.parse_prometheus(text(0, 0)), measure.parse_prometheus(text(0, 0)), 10.0)
    s = load.summarize(cfg, [_result(0)], 10.0, 10.0, 3, warm, None, [0.1])
    assert "WARNING" not in report.one_line(s) and "capturing" not in report.markdown(asdict(cfg), s)
    assert load.server_numbers({}, {}, 10.0)["engine_graphs_pending"] is None      # an older server: no warning
    s = load.summarize(cfg, [_result(0)], 10.0, 10.0, 3, {}, None, [0.1])
    assert "WARNING" not in report.one_line(s)


def test_cpu_and_gc_by_process_name_each_model_s_engines_apart():
    """Each model's engines are numbered from 0: the by-process tables name them by model (three engine processes
    of three models were one `engine0` before, two of them lost); workers and a one-model server's engines as ever."""
    def text(v: float) -> str:
        lines = [f'talkgate_engine_cpu_seconds{{model="{m}",engine="0"}} {v * k}\n'
                 f'talkgate_engine_gc_pause_max_seconds{{model="{m}",engine="0"}} {0.001 * k}\n'
                 for k, m in enumerate(("cv", "clone", "design"), 1)]
        return "".join(lines) + f'talkgate_worker_cpu_seconds{{worker="3"}} {v}\n'
    server = load.server_numbers(measure.parse_prometheus(text(0.0)), measure.parse_prometheus(text(10.0)), 10.0)
    assert server["cpu_cores_by_process"] == {"engine cv/0": 1.0, "engine clone/0": 2.0, "engine design/0": 3.0,
                                              "worker3": 1.0}
    assert server["gc_longest_s_by_process"] == {"engine cv/0": 0.001, "engine clone/0": 0.002,
                                                 "engine design/0": 0.003}
    one = "talkgate_engine_cpu_seconds{engine=\"1\"} %s\n"
    assert load.server_numbers(measure.parse_prometheus(one % 0), measure.parse_prometheus(one % 5),
                               10.0)["cpu_cores_by_process"] == {"engine1": 0.5}

# ----- CLI
def test_dump_prompts(capsys):
    assert bench.main(["--dump-prompts", "--lang", "zh", "--bucket", "long"]) == 0
    dumped = json.loads(capsys.readouterr().out)
    assert [p["id"] for p in dumped] == [f"zh-long-{i:02d}" for i in range(10)]
    assert all(p["frames"] == frames_for_text(p["text"]) and p["language"] == "chinese" for p in dumped)


@pytest.mark.parametrize("argv", [["--protocol", "openai", "--encoding", "opus"], ["--cancel-share", "1.5"],
                                  ["--rps", "2", "--concurrency", "3"], ["--sweep", "5,2"], ["--rps", "-1"],
                                  ["--requests", "0"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2


def test_a_server_of_several_models_is_shown_by_engine_of_each_model():
    """Several models: each model's engines are numbered from 0 and labelled by model too; each series keeps its
    own line (a three-model server showed one "engine 0" with a third of the audio)."""
    text = """# TYPE talkgate_engine_audio_seconds_total counter
talkgate_engine_audio_seconds_total{{engine="0",model="cv"}} {a}
talkgate_engine_audio_seconds_total{{engine="0",model="clone"}} {b}
# TYPE talkgate_engine_step_seconds histogram
talkgate_engine_step_seconds_bucket{{engine="0",model="cv",le="0.01"}} {a}
talkgate_engine_step_seconds_bucket{{engine="0",model="cv",le="+Inf"}} {a}
talkgate_engine_step_seconds_count{{engine="0",model="cv"}} {a}
talkgate_engine_step_seconds_sum{{engine="0",model="cv"}} 0.0
talkgate_engine_step_seconds_bucket{{engine="0",model="clone",le="0.01"}} 0.0
talkgate_engine_step_seconds_bucket{{engine="0",model="clone",le="+Inf"}} {b}
talkgate_engine_step_seconds_count{{engine="0",model="clone"}} {b}
talkgate_engine_step_seconds_sum{{engine="0",model="clone"}} 0.0
"""
    before = measure.parse_prometheus(text.format(a=0.0, b=0.0))
    after = measure.parse_prometheus(text.format(a=20.0, b=10.0))
    server = load.server_numbers(before, after, wall_s=10.0)
    assert server["engine_audio_s_per_wall_s_by_engine"] == {"cv/0": pytest.approx(2.0), "clone/0": pytest.approx(1.0)}
    steps = server["engine_step_s_by_engine"]
    assert steps["cv/0"]["count"] == 20 and steps["clone/0"]["count"] == 10
    assert steps["cv/0"]["p95_le"] == 0.01 and steps["clone/0"]["p95_le"] == float("inf")


ROOF_TEXT = """# TYPE talkgate_engine_step_roof_seconds_total counter
talkgate_engine_step_roof_seconds_total{{engine="0"}} {r0}
talkgate_engine_step_seconds_sum{{engine="0"}} {s0}
talkgate_engine_step_seconds_sum{{engine="1"}} {s1}
"""


def test_the_engines_roofline_fraction_is_their_roofline_seconds_over_their_step_seconds():
    """Beside the audio they made: each engine's steps' roofline seconds over the run against their step time; an
    engine that reports none (its GPU's peaks unknown) has no fraction, and none at all reads as unknown."""
    before = measure.parse_prometheus(ROOF_TEXT.format(r0=1.0, s0=10.0, s1=10.0))
    after = measure.parse_prometheus(ROOF_TEXT.format(r0=2.5, s0=20.0, s1=30.0))
    server = load.server_numbers(before, after, wall_s=10.0)
    assert server["engine_roofline_fraction_by_engine"] == {"0": pytest.approx(0.15)}
    assert server["engine_roofline_fraction"] == pytest.approx(0.15)
    summary = {"audio_s_per_wall_s": 3.0, "server": {**server, "engine_audio_s_per_wall_s": 2.0,
                                                      "engine_audio_s_per_wall_s_by_engine": {"0": 2.0}}}
    assert report.audio_rate(summary) == ("3.00 received, 2.00 made (engine 0 2.00 at 15.0% of its roofline); "
                                          "the steps at 15.0% of their roofline")
    assert load.server_numbers({}, {}, 10.0)["engine_roofline_fraction"] is None


def test_in_flight_trend_tells_a_level_held_from_a_backlog():
    """Requests in flight early and late in an open-loop level: level where each request takes as long as the
    others, growing where later ones take longer (the server falling behind), none in a closed loop."""
    def level(e2e_of):                  # 10 req/s for 10 s, request i starting at i / 10 s
        return [dataclasses.replace(_result(i, start_s=i / 10), e2e_ms=e2e_of(i / 10)) for i in range(100)]

    summarize = lambda cfg, rs: load.summarize(cfg, rs, 10.0, 10.0, 3, {}, None, [0.1])
    held = summarize(load.Config(rps=10.0), level(lambda t: 500.0))["in_flight_trend"]
    assert held == [5.0, 5.0]
    behind = summarize(load.Config(rps=10.0), level(lambda t: 100.0 * t))["in_flight_trend"]
    assert behind[1] > 1.5 * behind[0] > 0
    assert summarize(load.Config(concurrency=4), level(lambda t: 500.0))["in_flight_trend"] is None
    line = report.one_line(summarize(load.Config(rps=10.0), level(lambda t: 100.0 * t)))
    assert f", in flight {behind[0]:g} -> {behind[1]:g} (x{behind[1] / behind[0]:.2f}) -> clean" in line


def test_a_sweep_names_its_highest_clean_level_that_held(tmp_path):
    def step(load_, trend, clean=True):
        return {"summary": {**load.summarize(load.Config(rps=load_), [_result(i) for i in range(20)], 10.0, 10.0, 3, {},
                                             None, [0.1]), "in_flight_trend": trend, "clean": clean}}

    runs = [step(100, [50.0, 51.0]), step(150, [80.0, 87.0]), step(200, [120.0, 150.0]), step(250, None, False)]
    assert [report.held(r["summary"]) for r in runs] == [True, True, False, False]
    report.write_sweep(tmp_path, {"protocol": "openai", "ttfa_limit_ms": 100.0}, runs, 200, 150)
    text = (tmp_path / "sweep.md").read_text()
    assert "Highest clean rps: **200** (clean: no errors, no underruns, p95 TTFA <= 100 ms); of those, held " \
           "(requests in flight grew at most x1.1 over the level): **150**" in text
    assert "| 80 -> 87 (x1.09) | True |" in text
    assert json.loads((tmp_path / "sweep.json").read_text())["highest_clean_held"] == 150


def test_audio_made_and_roofline_are_those_of_the_run_s_model():
    """Three loads on three models of one server: a run's "made" figure and its steps' roofline share are its model's
    engines' (each of the three runs printed the server's total, 346 audio s a second against its own 115)."""
    def text(v: float) -> str:
        return "".join(f'talkgate_engine_audio_seconds_total{{model="{m}",engine="0"}} {v * k}\n'
                       f'talkgate_engine_step_seconds_sum{{model="{m}",engine="0"}} {v}\n'
                       f'talkgate_engine_step_roof_seconds_total{{model="{m}",engine="0"}} {v * k / 10}\n'
                       for k, m in enumerate(("cv", "clone", "design"), 1))
    before, after = measure.parse_prometheus(text(0.0)), measure.parse_prometheus(text(10.0))
    clone = load.server_numbers(before, after, 10.0, "clone")
    assert clone["engine_audio_s_per_wall_s"] == 2.0
    assert clone["engine_audio_s_per_wall_s_by_engine"] == {"clone/0": 2.0}
    assert clone["engine_roofline_fraction"] == pytest.approx(0.2)
    every = load.server_numbers(before, after, 10.0, None)
    assert every["engine_audio_s_per_wall_s"] == 6.0 and len(every["engine_audio_s_per_wall_s_by_engine"]) == 3
    assert every["engine_roofline_fraction"] == pytest.approx(0.2)


def test_the_servers_stream_lead_is_shown_where_its_sessions_said_one():
    """A paced server's streams are made at about real time past the lead: its req/s and audio-s/s mean that, and the
    summary says so (the one line and the table); a server without (or HTTP) says off."""
    cfg = load.Config(concurrency=4)
    paced = [replace(_result(i), stream_lead_s=2.0) for i in range(3)]
    paced.append(_result(3, error={"code": "x", "message": ""}))
    s = load.summarize(cfg, paced, 10.0, None, 4, {}, None, [0.1])
    assert s["stream_leads_s"] == [2.0]
    assert ", streams paced: lead 2 s -> NOT clean" in report.one_line(s)
    assert "player, so at about real time past it) | 2 s |" in report.markdown(asdict(cfg), s)
    s = load.summarize(cfg, [_result(i) for i in range(3)], 10.0, None, 4, {}, None, [0.1])
    assert s["stream_leads_s"] == [] and "paced" not in report.one_line(s)
    assert "player, so at about real time past it) | off |" in report.markdown(asdict(cfg), s)


def test_a_request_that_begins_while_an_earlier_one_streams_is_during_another():
    # in order of start: 1 starts during 0 (0.0-0.5 s); 2 after both ended; of two that start together the second
    # is during the first; 4 starts as 2 ends (not during it)
    started = [(0.0, 500), (0.2, 100), (1.0, 300), (1.0, 50), (1.3, 100), (1.5, None)]
    assert load.during_another(started) == [False, True, False, True, False, False]

