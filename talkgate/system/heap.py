"""The garbage collector in a long-lived server process: its pauses measured, the startup heap frozen out of it.

A full collection (generation 2) walks every tracked object. An engine process holds millions of them after
warm-up (the compiled model's graphs, guards and caches, imported modules) that live as long as the process,
and CPython collects generation 2 whenever the objects that survived younger collections reach a quarter of
it: under 512 streams the 0.6B engine process (936,000 objects after warm-up) paused 430-770 ms at a time
(H100, docs/benchmarks.md), and every stream's audio with it. `freeze` moves everything alive at that moment into the permanent generation,
which collections never walk (gc.freeze; vLLM does the same after its graph capture): later full collections
walk only what was made since. `GcPauses` times every collection (gc.callbacks) so that /metrics shows them.
"""
from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("talkgate.heap")


_frozen = 0     # objects frozen by the last counted freeze (gc.get_freeze_count walks them all: ~0.1 s per million)


def hold_collections() -> None:
    """No automatic collections until the next freeze: a starting process's imports and checkpoint load make
    hundreds of thousands of objects that live as long as it does, and CPython would walk them again and again
    (a quarter of the time it takes to import torch and its compiler, measured). freeze() collects once and
    turns collections back on."""
    gc.disable()


def freeze(what: str, serving: bool = False) -> None:
    """Freeze everything alive out of later collections (and turn them on, if hold_collections turned them off).
    Before the process serves, collect first (one walk of everything) so that no garbage is frozen for good, and
    count; while serving, only freeze (microseconds)."""
    global _frozen
    t0 = time.perf_counter()
    if serving:
        gc.freeze()
        log.info("%s: what was made since the last freeze is frozen too", what)
        return
    gc.collect()
    gc.freeze()
    gc.enable()
    _frozen = gc.get_freeze_count()
    log.info("%s: %d objects frozen out of the garbage collector (%.0f ms)", what, _frozen,
             (time.perf_counter() - t0) * 1000)


class GcPauses:
    """The process's garbage-collection pauses since `install` (a serving process installs it once warm, so
    that warm-up's collections are not counted): total seconds, the longest, and how many."""

    def __init__(self):
        self.seconds = self.longest = 0.0
        self.count = 0
        self._start = 0.0

    def install(self) -> "GcPauses":
        gc.callbacks.append(self._on_gc)
        return self

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        pause = time.perf_counter() - self._start
        self.seconds += pause
        self.longest = max(self.longest, pause)
        self.count += 1

    def stats(self) -> dict:
        return {"gc_s": self.seconds, "gc_max_s": self.longest, "gc_count": self.count,
                "gc_frozen": _frozen}
