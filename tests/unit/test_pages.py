"""The Talker's KV pages (synth/pages.py) and the scheduler's use of them: pure Python, no model."""
from __future__ import annotations

from talkgate.synth.api import ContextParams
from talkgate.synth.pages import PagePool
from talkgate.synth.request import Request
from talkgate.synth.scheduler import Scheduler


def req(context: int, frames: int = 0, prompt_len: int = 10) -> Request:
    r = Request(context=context, slot=context, params=ContextParams(), client=1, prompt=None, frame_limit=750,
                budget_factor=4.0, budget_min=50)
    r.text_ids, r.text_ended, r.prompt_len, r.frames = [7], True, prompt_len, frames
    return r


def test_a_context_takes_the_page_of_each_position_as_it_reaches_it_and_gives_them_back_at_the_next_settle():
    pool = PagePool(pages=6, page_len=4, reserve=2)
    a = req(1)
    assert pool.free == 5 and pool.room() and pool.room(2) and not pool.room(3)     # 3 opens queued: 2 free after
    assert pool.reach(a, 0) and a.pages == [1]                 # page 0 is scratch: never handed out
    assert pool.reach(a, 3) and a.pages == [1]                 # still the first page's
    assert pool.reach(a, 9) and a.pages == [1, 2, 3] and pool.free == 2 and not pool.room()   # the reserve
    b = req(2)
    assert not pool.reach(b, 12) and b.pages == []             # four pages, two free: takes none
    pool.give_back(a)
    assert a.pages == [] and pool.free == 2 and pool.returning == 3     # a step in flight may still write them
    pool.settle()
    assert pool.free == 5 and pool.returning == 0 and pool.reach(b, 12) and len(b.pages) == 4


def test_the_scheduler_runs_only_contexts_that_hold_the_page_of_their_next_position():
    pool = PagePool(pages=5, page_len=4, reserve=0)
    s = Scheduler(max_batch=8, max_prefills=8, pages=pool)
    old, new = req(1, frames=3, prompt_len=2), req(2, prompt_len=8)       # positions 4 and 7: two pages each
    s.add(old)
    assert s.schedule(0.0) == ([old], []) and old.pages == [1, 2]
    s.add(new)
    old.frames = 4                                             # its next position, 5: the page it holds
    prefill, decode = s.schedule(0.0)
    assert (prefill, decode) == ([new], [old]) and new.pages == [3, 4] and pool.free == 0
    old.frames = 7                                             # position 8: a third page, none free
    assert s.schedule(0.0) == ([], [new]) and s.starved == [old]
    s.remove(new)                                              # its pages, free once settled
    assert s.schedule(0.0) == ([], []) and s.starved == [old]
    pool.settle()
    assert s.schedule(0.0) == ([], [old]) and s.starved == [] and old.pages[:2] == [1, 2] and len(old.pages) == 3


def test_running_contexts_reach_their_pages_before_new_ones():
    pool = PagePool(pages=3, page_len=4)
    s = Scheduler(max_batch=8, max_prefills=8, pages=pool)
    old = req(1, frames=1, prompt_len=4)                       # position 4: its second page
    assert pool.reach(old, 0)                                  # page 1; one left
    s.running.append(old)
    new = req(2, prompt_len=6)                                 # position 5: two pages
    s.add(new)
    assert s.schedule(0.0) == ([], [old]) and old.pages == [1, 2] and new.pages == []
    assert s.blocked == [new]                                  # ready, no page for its prompt
    s.remove(old)
    pool.settle()
    assert s.schedule(0.0) == ([new], []) and s.blocked == [] and new.pages == [2, 1]
