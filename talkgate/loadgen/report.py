"""Results of load runs on disk: requests.json, summary.json/.md, sweep.json/.md and the plots.

Works on plain dicts (a run's config as a dict, its summary, its requests) so it can also re-render
results read back from disk.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

CLIENT_LAG_WARN_MS = 5.0    # client loop lag p99 over this: the client, not the server, adds latency


def fmt(v, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def seconds_as_ms(h: dict | None) -> str:
    """A histogram_delta in seconds as "mean / p99 bucket / max bucket" ms (a gauge: its value): a rare stall (a
    worker's loop held for 250 ms) shows in the max where the p99 hides it."""
    if not h:
        return "-"
    if "value" in h:
        return fmt(h["value"] * 1000, 2)
    return " / ".join(fmt(None if h.get(k) is None else h[k] * 1000, 2) for k in ("mean", "p99_le", "max_le"))


def engine_order(key: str) -> tuple[str, int]:
    """An engine's key in /metrics' series, "0" or, where a server serves several models, "MODEL/0": by model, then
    by index as a number (engine 10 after engine 9)."""
    model, _, index = key.rpartition("/")
    return model, int(index)


def audio_rate(s: dict) -> str:
    """The headline figure, audio seconds per wall second: what the clients received, what the engines made (the
    server's /metrics) and what each made (none with `--workers 0`: its one engine has no label); beside them, where
    the server knows its GPU's peaks, the share of the roofline its steps achieved (synth/roofline.py: the steps'
    roofline time over their time)."""
    srv = s["server"]
    engines = srv.get("engine_audio_s_per_wall_s_by_engine") or {}
    roofs = srv.get("engine_roofline_fraction_by_engine") or {}
    made = ", ".join(f"engine {e} {v:.2f}" + (f" at {100 * roofs[e]:.1f}% of its roofline" if e in roofs else "")
                     for e, v in sorted(engines.items(), key=lambda ev: engine_order(ev[0])))
    roof = srv.get("engine_roofline_fraction")
    return (f"{fmt(s['audio_s_per_wall_s'], 2)} received, {fmt(srv.get('engine_audio_s_per_wall_s'), 2)} made"
            + (f" ({made})" if made else "") + (f"; the steps at {100 * roof:.1f}% of their roofline" if roof else ""))


def capturing(s: dict) -> str:
    """A warning where the server's engines still had CUDA graphs to capture during the run ('' otherwise): each
    capture holds an engine up to seconds, so the run's first audio is not the warm server's."""
    pending = s["server"].get("engine_graphs_pending")
    if not pending or not any(pending):
        return ""
    return (f"the server was still capturing CUDA graphs ({pending[0]:g} pending at the start, {pending[1]:g} at the "
            "end): each capture holds an engine up to seconds, so these latencies are not the warm server's (wait "
            "for `all N graphs captured` in its log, or for talkgate_engine_graphs_pending 0)")


def one_line(s: dict) -> str:
    t = s["metrics"]["ttfa_ms"] or {}
    warning = capturing(s)
    return (f"{s['mode']} {s['load']:g}: {s['requests']} requests, {s['achieved_rps']:.2f} req/s, "
            f"audio s per wall s {audio_rate(s)}, "
            f"TTFA p50 {fmt(t.get('p50'))} p95 {fmt(t.get('p95'))} ms, underruns {s['underruns']}, "
            f"errors {sum(s['errors'].values())}, peak in flight {s['peak_in_flight']}{trend(s, ', in flight ')}"
            f"{lead(s, ', streams paced: lead ')} -> {'clean' if s['clean'] else 'NOT clean'}"
            + (f"; WARNING: {warning}" if warning else ""))


def lead(s: dict, prefix: str = "") -> str:
    """The server's stream leads its sessions said (load.summarize's stream_leads_s), '' where none (off, or HTTP)."""
    leads = s.get("stream_leads_s")
    return prefix + ", ".join(f"{v:g} s" for v in leads) if leads else ""


def trend(s: dict, prefix: str = "") -> str:
    """The level's mean in flight early -> late (load.in_flight_trend), '' where not measured."""
    t = s.get("in_flight_trend")
    return f"{prefix}{t[0]:g} -> {t[1]:g}" + (f" (x{t[1] / t[0]:.2f})" if t[0] else "") if t else ""


# an open-loop level "held" where its requests in flight (load.in_flight_trend) grew at most this much: on an H200
# (docs/benchmarks.md "Room for the load") levels the engine kept up with went x0.97-1.05, those it did not x1.12-1.8
HELD_GROWTH = 1.1


def held(s: dict) -> bool:
    """Whether an open-loop level's requests in flight held level; False where not measured."""
    t = s.get("in_flight_trend")
    return bool(t) and t[0] > 0 and t[1] <= HELD_GROWTH * t[0]


def held_line(mode: str, best_held: float | None, mark: str = "") -> str:
    """The sweep's highest clean level that also held (open loop only: a closed loop holds its clients); `mark`
    around the figure (markdown's "**")."""
    if mode != "rps":
        return ""
    return (f"; of those, held (requests in flight grew at most x{HELD_GROWTH:g} over the level): "
            f"{mark}{fmt(best_held)}{mark}")


def markdown(cfg: dict, s: dict) -> str:
    """The summary of one run as a markdown page: run-level numbers, then p50/p95/p99 per metric."""
    load = f"{cfg['rps']} req/s offered (Poisson)" if s["mode"] == "rps" else f"{cfg['concurrency']} concurrent clients"
    native = cfg["protocol"] == "native"
    lines = [f"# talkgate load run: {cfg['protocol']}, {cfg['encoding'] if native else 'pcm'}, {load}", "",
             f"url {cfg['url']}; lang {cfg['lang']}; bucket {cfg['bucket']}; length {cfg['length']}; "
             f"cancel share {cfg['cancel_share']}; duration {cfg['duration_s']} s; seed {cfg['seed']}"
             + (f"; {cfg['tokens_per_second']} tokens/s{' as token ids' if cfg.get('token_ids') else ''}, first "
                f"token after {cfg['first_token_delay_ms']} ms" if native else ""), "",
             f"**{'CLEAN' if s['clean'] else 'NOT CLEAN'}** (clean: no errors, no underruns, p95 TTFA <= "
             f"{cfg['ttfa_limit_ms']:.0f} ms)", ""]
    srv, gpu, lag = s["server"], s["gpu"], s["client_loop_lag_ms"]
    if lag and lag["p99"] > CLIENT_LAG_WARN_MS:
        lines += [f"WARNING: the client's own event loop lagged (p99 {lag['p99']:.1f} ms): it is saturated and "
                  "inflates the latencies below; run fewer streams per client process.", ""]
    if warning := capturing(s):
        lines += [f"WARNING: {warning}.", ""]
    rows = [("requests / completed / cancelled", f"{s['requests']} / {s['completed']} / {s['cancelled']}"),
            ("errors", ", ".join(f"{k}: {v}" for k, v in s["errors"].items()) or "none"),
            ("achieved req/s", fmt(s["achieved_rps"], 2)), ("peak in flight", s["peak_in_flight"]),
            ("mean in flight over 30-60% -> 70-100% of the run (growing: the server falls behind)",
             trend(s) or "-"),
            ("audio s per wall s: received by the clients, made by the engines (by engine)", audio_rate(s)),
            ("server's stream lead (serve --stream-lead: a WebSocket stream made at most this far ahead of its "
             "player, so at about real time past it)", lead(s) or "off"),
            ("underruns (requests with any) / total ms",
             f"{s['underruns']} ({s['requests_with_underruns']}) / {fmt(s['underrun_ms_total'])}"),
            ("underrun requests: started in the ramp / after it; first ran dry at frame", underrun_split(s)),
            ("underrun requests by prompt (the most; of its requests)", underrun_prompts(s)),
            ("server CPU cores", fmt(srv.get("cpu_cores"), 2)),
            ("CPU cores by process", ", ".join(f"{k} {v:.2f}" for k, v in sorted((srv.get("cpu_cores_by_process")
                                                                                  or {}).items())) or "-"),
            ("server event-loop lag mean / p99 / max bucket (ms)", seconds_as_ms(srv.get("event_loop_lag_s"))),
            ("event-loop lag mean / p99 / max bucket by worker (ms)",
             "; ".join(f"{w}: {seconds_as_ms(h)}" for w, h in sorted((srv.get("event_loop_lag_s_by_worker")
                                                                       or {}).items())) or "-"),
            ("engine step mean / p99 / max bucket (ms)", seconds_as_ms(srv.get("engine_step_s"))),
            ("engine loop: share of the run by phase (turn includes gpu_wait)", ", ".join(
                f"{k} {v:.2f}" for k, v in sorted((srv.get("engine_loop_share") or {}).items())) or "-"),
            ("GC pauses: share of the run / longest since start (ms), by process", ", ".join(
                f"{k} {v:.3f} / {1000 * (srv.get('gc_longest_s_by_process') or {}).get(k, 0.0):.0f}"
                for k, v in sorted((srv.get("gc_share_by_process") or {}).items())) or "-"),
            ("waiting for a CPU (cores held by other processes): share of the run, by process", ", ".join(
                f"{k} {v:.3f}" for k, v in sorted((srv.get("cpu_wait_share_by_process") or {}).items())) or "-"),
            ("engine turns over 40 ms (the server log says where their time went)",
             fmt(srv.get("engine_slow_turns"), 0)),
            ("first audio of the requests that started close behind the one before them, and of the others; of "
             "those that started while another was streaming, and of those that found none: n, p50 / p95 (ms)",
             arrival_split(s)),
            ("first frames made on the lane beside a running step (synth/lane.py), of the run's requests",
             f"{fmt(srv.get('engine_lane_launches'), 0)} of {s['requests']}"),
            ("steps whose new contexts' first frames were decoded ahead of their running rows' (synth/engine.py)",
             fmt(srv.get('engine_first_decodes'), 0)),
            ("a step's audio from the engine to a worker mean / p99 / max bucket (ms)",
             seconds_as_ms(srv.get("step_delivery_s"))),
            ("engine step mean / p99 / max bucket by engine (ms)",
             "; ".join(f"{e}: {seconds_as_ms(h)}" for e, h in sorted((srv.get("engine_step_s_by_engine")
                                                                       or {}).items())) or "-"),
            ("server underrun-risk writes", fmt(srv.get("underrun_risk"), 0)),
            ("server contexts active after the run", fmt(srv.get("contexts_active_after"), 0)),
            ("GPU util mean / max %, mem max MiB", "-" if gpu is None else
             f"{gpu['util_mean_pct']:.0f} / {gpu['util_max_pct']:.0f}, {gpu['mem_max_mib']:.0f}"),
            ("client loop lag p99 / max (ms)", "-" if lag is None else f"{lag['p99']:.1f} / {lag['max']:.1f}")]
    lines += ["| run | value |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in rows]
    lines += ["", "| metric | n | p50 | p95 | p99 | mean | max |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, m in s["metrics"].items():
        if m is not None:
            d = 3 if name == "rtf" else 1
            lines.append(f"| {name} | {m['n']} | "
                         + " | ".join(fmt(float(m[k]), d) for k in ("p50", "p95", "p99", "mean", "max")) + " |")
    return "\n".join(lines) + "\n"


def arrival_split(s: dict) -> str:
    split = s.get("ttfa_by_arrival")
    if not split:
        return "-"
    part = lambda h: "none" if h is None else f"{h['n']}, {h['p50']:.1f} / {h['p95']:.1f}"
    return (f"within {split['within_ms']:.0f} ms: {part(split['close'])}; the others: {part(split['apart'])}; "
            f"while another was streaming: {part(split['during_another'])}; with none: {part(split['alone'])}")


def underrun_split(s: dict) -> str:
    u = s["underrun_requests"]
    frames = ", ".join(f"{k}: {v}" for k, v in u["first_dry_frame"].items()) or "-"
    return f"{u['in_ramp']} / {u['after_ramp']}; {frames}"


def underrun_prompts(s: dict) -> str:
    u = s["underrun_requests"]
    slack = u.get("prompt_slack_ms", {})
    return ", ".join(f"{p} {n} of {asked}" + (f" (text slack {slack[p]:g} ms)" if p in slack else "")
                     for p, (n, asked) in u.get("prompts", {}).items()) or "-"


def ttfas(run: dict) -> list[float]:
    return [r["ttfa_ms"] for r in run["requests"] if r["error"] is None and r["ttfa_ms"] is not None]


def plot(draw) -> None:
    """Plots need matplotlib (the `bench` extra); without it the numbers are still written."""
    try:
        from talkgate.loadgen import plots
    except ImportError as e:
        print(f"note: no plots ({e}); pip install matplotlib", file=sys.stderr)
        return
    draw(plots)


def write_run(out: Path, run: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    s = run["summary"]
    (out / "requests.json").write_text(json.dumps(run["requests"], ensure_ascii=False, indent=1))
    (out / "summary.json").write_text(json.dumps({"config": run["config"], "summary": s}, indent=1))
    (out / "summary.md").write_text(markdown(run["config"], s))
    plot(lambda plots: plots.ttfa_cdf({f"{run['config']['protocol']} {s['mode']} {s['load']:g}": ttfas(run)},
                                      out / "ttfa_cdf.png"))


def write_sweep(out: Path, cfg: dict, runs: list[dict], best: float | None, best_held: float | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    steps = [r["summary"] for r in runs]
    mode = steps[0]["mode"]
    (out / "sweep.json").write_text(json.dumps({"config": cfg, "highest_clean": best, "highest_clean_held": best_held,
                                                "steps": steps}, indent=1))
    rows = ["| load | achieved req/s | audio s per wall s | p50 TTFA | p95 TTFA | p99 TTFA | underruns | errors | "
            "in flight 30-60% -> 70-100% | clean |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in steps:
        t = s["metrics"]["ttfa_ms"] or {}
        rows.append(f"| {s['load']:g} | {s['achieved_rps']:.2f} | {audio_rate(s)} | {fmt(t.get('p50'))} | "
                    f"{fmt(t.get('p95'))} | {fmt(t.get('p99'))} | {s['underruns']} | {sum(s['errors'].values())} | "
                    f"{trend(s) or '-'} | {s['clean']} |")
    (out / "sweep.md").write_text(f"# talkgate sweep ({cfg['protocol']}, {mode})\n\nHighest clean {mode}: "
                                  f"**{fmt(best)}** (clean: no errors, no underruns, p95 TTFA <= "
                                  f"{cfg['ttfa_limit_ms']:.0f} ms)" + held_line(mode, best_held, "**") + "\n\n"
                                  + "\n".join(rows) + "\n")
    plot(lambda plots: (plots.sweep(steps, out / "sweep.png", mode),
                        plots.ttfa_cdf({f"{mode} {s['load']:g}": ttfas(r) for s, r in zip(steps, runs)},
                                       out / "ttfa_cdf.png")))
