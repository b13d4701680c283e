"""Heap probe for the soak (tests/soak.py --trace-heap; docs/reliability.md, "The soak"): imported at start-up by
every process of a `talkgate serve` started with this folder first on PYTHONPATH and TALKGATE_HEAP_PROBE=DIR.
Nothing happens until the process gets SIGUSR2: the first one starts tracemalloc (so only what is allocated from then
on is traced: warm-up is not), and each one writes a tracemalloc snapshot and one JSON line of heap figures (VmRSS,
glibc's mallinfo2, what tracemalloc traces, the garbage collector's objects) to DIR. `python -m tests.heapprobe DIR`
diffs them."""
import os

_DIR = os.environ.get("TALKGATE_HEAP_PROBE")

if _DIR:
    import ctypes
    import gc
    import json
    import signal
    import sys
    import time
    import tracemalloc

    class _Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:            # loaded once: a probe must not allocate what the next one would count
        _mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
        _mallinfo2.restype = _Mallinfo2
    except (OSError, AttributeError):
        _mallinfo2 = None

    def _mallinfo() -> dict:
        if _mallinfo2 is None:
            return {}
        m = _mallinfo2()
        return {n: getattr(m, n) for n, _ in _Mallinfo2._fields_}

    def _role() -> str:
        argv = " ".join(sys.argv)
        if "engine_process" in argv:
            return "engine-" + sys.argv[sys.argv.index("--index") + 1] if "--index" in sys.argv else "engine"
        if "TALKGATE_WORKER" in os.environ:
            return "worker-" + str(json.loads(os.environ["TALKGATE_WORKER"]).get("index"))
        return "supervisor" if "serve" in sys.argv else "other"

    _n = [0]

    def _probe(signum, frame) -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start(16)
        name = f"{_role()}-{os.getpid()}-{_n[0]:03d}"
        _n[0] += 1
        tracemalloc.take_snapshot().dump(os.path.join(_DIR, name + ".snap"))
        with open(f"/proc/{os.getpid()}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
        cur, peak = tracemalloc.get_traced_memory()
        row = {"t": time.time(), "name": name, "rss_mb": rss, "traced": cur, "traced_peak": peak,
               "gc_objects": len(gc.get_objects()), "gc_frozen": gc.get_freeze_count(), **_mallinfo()}
        with open(os.path.join(_DIR, "heap.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")

    signal.signal(signal.SIGUSR2, _probe)
