"""system/heap.py: the heap frozen out of the garbage collector, and the collector's pauses counted."""
import gc

from talkgate.system import heap


def test_a_frozen_heap_is_left_out_of_collections_and_every_pause_is_counted():
    pauses = heap.GcPauses().install()
    try:
        heap.freeze("test")
        frozen = gc.get_freeze_count()
        # Frozen objects still die when their last reference goes (another test's leftover thread may drop a few
        # between two counts), so the counts agree within 100, not exactly.
        assert frozen > 10_000 and abs(pauses.stats()["gc_frozen"] - frozen) < 100     # pytest's own heap, at least
        cycle = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1                            # the new garbage is still collected
        assert frozen - 100 < gc.get_freeze_count() <= frozen   # and the frozen objects stay where they are
        heap.freeze("serving", serving=True)                # what was made since joins them, uncounted
        assert gc.get_freeze_count() > frozen - 100
        stats = pauses.stats()
        assert stats["gc_count"] >= 1 and 0 < stats["gc_max_s"] <= stats["gc_s"]
    finally:
        gc.callbacks.remove(pauses._on_gc)
        gc.unfreeze()


def test_collections_held_while_a_process_starts_resume_at_its_first_freeze():
    """hold_collections (an engine process, until its model is loaded): garbage cycles wait, however much is
    allocated; the first freeze collects them once and turns the collector back on."""
    import weakref

    class Node:
        pass

    heap.hold_collections()
    try:
        node = Node()
        node.self = node
        alive = weakref.ref(node)
        del node
        kept = [[i] for i in range(50_000)]                 # many times what starts an automatic collection
        assert not gc.isenabled() and alive() is not None and len(kept) == 50_000
        heap.freeze("loaded")
        assert gc.isenabled() and alive() is None
    finally:
        gc.enable()
        gc.unfreeze()
