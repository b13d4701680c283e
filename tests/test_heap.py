"""gateway/heap.py: the heap frozen out of the garbage collector, and the collector's pauses counted."""
import gc

from talkgate.gateway import heap


def test_a_frozen_heap_is_left_out_of_collections_and_every_pause_is_counted():
    pauses = heap.GcPauses().install()
    try:
        heap.freeze("test")
        frozen = gc.get_freeze_count()
        assert frozen > 10_000 and pauses.stats()["gc_frozen"] == frozen      # pytest's own heap, at least
        cycle = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1                            # the new garbage is still collected
        assert gc.get_freeze_count() == frozen              # and the frozen objects stay where they are
        heap.freeze("serving", serving=True)                # what was made since joins them, uncounted
        assert gc.get_freeze_count() >= frozen
        stats = pauses.stats()
        assert stats["gc_count"] >= 1 and 0 < stats["gc_max_s"] <= stats["gc_s"]
    finally:
        gc.callbacks.remove(pauses._on_gc)
        gc.unfreeze()
