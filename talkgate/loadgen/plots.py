"""PNG plots of load runs (matplotlib, the `bench` extra; report.py imports this only to draw)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")      # files only: no display needed
import matplotlib.pyplot as plt


def ttfa_cdf(series: dict[str, list[float]], path: Path) -> None:
    """Empirical CDF of time to first audio, one line per run (label -> TTFA values in ms)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, values in series.items():
        xs = sorted(values)
        if xs:
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=f"{label} (n={len(xs)})")
    ax.set_xlabel("time to first playable audio (ms, from the first text byte sent)")
    ax.set_ylabel("share of requests")
    ax.set_ylim(0, 1.01)
    ax.grid(True, alpha=0.3)
    if any(series.values()):
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def sweep(steps: list[dict], path: Path, mode: str) -> None:
    """p95 TTFA and underruns against the load level of each sweep step (summaries from loadgen/load.py)."""
    loads = [s["load"] for s in steps]
    p95 = [(s["metrics"]["ttfa_ms"] or {}).get("p95") for s in steps]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(loads, [float("nan") if v is None else v for v in p95], "o-", color="tab:blue", label="p95 TTFA")
    ax.set_xlabel("offered requests/s" if mode == "rps" else "concurrent clients")
    ax.set_ylabel("p95 TTFA (ms)", color="tab:blue")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    right = ax.twinx()
    underruns = [s["underruns"] for s in steps]
    right.bar(loads, underruns, width=[0.15 * max(1.0, x) for x in loads], color="tab:red", alpha=0.4)
    right.set_ylim(0, max(1, *underruns) * 1.1)
    right.set_ylabel("underruns (count)", color="tab:red")
    for s in steps:
        if not s["clean"]:
            ax.axvline(s["load"], color="gray", linestyle="--", linewidth=1)
    ax.set_title("talkgate sweep: p95 TTFA and underruns")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
