"""Scheduler and request state: pure Python, no model."""
from __future__ import annotations

import pytest

from talkgate.synth.api import ContextParams
from talkgate.synth.request import Request, Status, frames_for_text, text_seconds
from talkgate.synth.scheduler import Scheduler

EOS, PAD = 151673, 151671


def req(context: int, tokens: int = 0, ended: bool = False, fixed: int | None = None) -> Request:
    r = Request(context=context, slot=context, params=ContextParams(fixed_frames=fixed), client=1,
                prompt=None, frame_limit=750, budget_factor=4.0, budget_min=50)
    r.text_ids = list(range(100, 100 + tokens))
    r.text_ended = ended
    return r


def test_frames_for_text_rule():
    assert frames_for_text("") == 4
    assert frames_for_text("a" * 100) == round(12.5 * 6.0)
    assert frames_for_text("你好" * 10) == round(12.5 * 0.25 * 20)


def test_the_rules_cjk_characters_are_kana_ideographs_and_hangul():
    cjk = [(0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0xAC00, 0xD7AF)]
    for c in range(0x10000):
        if 0xD800 <= c <= 0xDFFF:
            continue
        expected = 0.25 if any(lo <= c <= hi for lo, hi in cjk) else 0.06
        assert text_seconds(chr(c)) == expected, hex(c)
    assert text_seconds("かな漢字 한글 ok") == pytest.approx(0.25 * 6 + 0.06 * 4)
    assert frames_for_text("ab你") == round(12.5 * (0.12 + 0.25))


def test_text_tokens_then_eos_then_pad():
    r = req(1, tokens=2, ended=True)
    got = []
    for _ in range(5):
        got.append(r.next_text_id(EOS, PAD))
        r.frames += 1
    assert got == [100, 101, EOS, PAD, PAD]


def test_ready_needs_token_k_or_end():
    r = req(1, tokens=1)
    assert r.ready                 # token 0 committed: prefill can run
    r.frames = 1
    assert not r.ready             # frame 1 needs token 1
    r.text_ids.append(7)
    assert r.ready
    r.frames = 2
    r.text_ended = True
    assert r.ready


def test_limits():
    assert req(1, fixed=20).limit() == (20, "length")
    assert req(1, fixed=2000).limit() == (750, "budget")       # capped by the slot's capacity
    r = req(1, tokens=3)
    r.text_seconds = 1.0
    assert r.limit() == (750, "budget")                       # text still coming: only the capacity
    r.text_ended = True
    assert r.limit() == (50, "budget")                        # max(4 * 12.5, 50)
    r.text_seconds = 10.0
    assert r.limit() == (500, "budget")


def test_text_rule_limits():
    """An untrained checkpoint's contexts (length_rule): the text rule's frames once the text has ended,
    eos never sampled; fixed_frames still wins; the slot's capacity still caps."""
    r = req(1, tokens=3)
    r.length_rule = True
    r.text_seconds = 1.0
    assert r.limit() == (750, "budget") and not r.samples_eos
    r.text_ended = True
    assert r.limit() == (12, "length_rule")                   # round(12.5 * 1.0)
    r.text_seconds = 0.1
    assert r.limit() == (4, "length_rule")                    # at least 4
    r.text_seconds = 100.0
    assert r.limit() == (750, "budget")
    f = req(2, tokens=3, ended=True, fixed=9)
    f.length_rule = True
    assert f.limit() == (9, "length")
    assert req(3).samples_eos and not req(4, fixed=5).samples_eos


def test_waiting_context_does_not_block_others():
    s = Scheduler(max_batch=8, max_prefills=2)
    a, b = req(1), req(2, tokens=1)
    s.add(a)
    s.add(b)
    new, old = s.schedule(now=0.0)
    assert new == [b] and old == [] and a.status is Status.WAITING and b.status is Status.RUNNING
    b.frames = 1
    new, old = s.schedule(now=0.1)
    assert new == [] and old == []                             # b waits for token 1, a for token 0
    a.text_ids = [5]
    b.text_ended = True
    new, old = s.schedule(now=0.2)
    assert new == [a] and old == [b]
    assert a.t_ready == 0.2 and b.t_ready == 0.0


def test_prefills_bounded_per_step():
    s = Scheduler(max_batch=8, max_prefills=2)
    rs = [req(i, tokens=1) for i in range(5)]
    for r in rs:
        s.add(r)
    assert s.schedule(0.0)[0] == rs[:2]
    assert s.schedule(0.0)[0] == rs[2:4]
    assert s.schedule(0.0) == ([rs[4]], rs[:4])


def test_earliest_deadline_first_above_max_batch():
    s = Scheduler(max_batch=2, max_prefills=2)
    rs = [req(i, tokens=100) for i in range(3)]
    for r in rs:
        s.add(r)
    new, old = s.schedule(0.0)
    assert new == rs[:2]
    for r in new:
        r.frames = 1
    new, old = s.schedule(0.01)                                # rs[2] is new with deadline 0.01 < 0.08
    assert new == [rs[2]] and len(old) == 1
    rs[2].frames = 1
    rs[0].frames = 5                                           # rs[0] has the most audio buffered
    new, old = s.schedule(0.02)
    assert new == [] and set(map(id, old)) == {id(rs[1]), id(rs[2])}


def test_remove_is_idempotent():
    s = Scheduler(max_batch=2, max_prefills=1)
    r = req(1, tokens=1)
    s.add(r)
    s.remove(r)
    s.remove(r)
    assert len(s) == 0 and r.status is Status.FINISHED


def test_bad_limits():
    with pytest.raises(ValueError):
        Scheduler(max_batch=2, max_prefills=3)


def paced(context: int, lead_s: float) -> Request:
    r = req(context, tokens=100)
    r.params = ContextParams(lead_s=lead_s)
    return r


def test_a_paced_context_sits_out_while_more_than_its_lead_ahead_of_its_player():
    s = Scheduler(max_batch=8, max_prefills=2)
    a, b = paced(1, lead_s=0.2), req(2, tokens=100)
    s.add(a)
    s.add(b)
    assert s.schedule(0.0) == ([a, b], [])                     # first frames: deadline 0, nothing ahead
    assert s.due_in(0.0) == 0.0                                # a is due (0.08 ahead, lead 0.2)
    a.frames = b.frames = 4                                    # 0.32 s of audio made by t = 0: 0.12 s past its lead
    assert s.schedule(0.0) == ([], [b])                        # the unpaced one runs on as fast as it can
    assert s.due_in(0.0) == pytest.approx(0.12)
    assert s.due_in(0.05) == pytest.approx(0.07)
    assert s.schedule(0.119) == ([], [b])
    assert s.schedule(0.121) == ([], [a, b])                   # its player has 0.2 s left: it runs again
    a.frames = 5
    assert s.due_in(0.121) == pytest.approx(0.079)


def test_due_in_is_none_without_paced_contexts_and_ignores_those_waiting_for_text():
    s = Scheduler(max_batch=8, max_prefills=2)
    assert s.due_in(0.0) is None
    b = req(2, tokens=100)
    s.add(b)
    s.schedule(0.0)
    assert s.due_in(0.0) is None
    a = paced(1, lead_s=0.5)
    a.text_ids = [5]
    s.add(a)
    s.schedule(0.0)
    a.frames = 1                                               # needs a second token it does not have: not ready
    assert not a.ready and s.due_in(0.0) is None


def test_a_paced_context_never_waits_once_its_player_has_less_than_its_lead():
    s = Scheduler(max_batch=8, max_prefills=2)
    a = paced(1, lead_s=2.0)
    s.add(a)
    s.schedule(0.0)
    for frame in range(1, 26):                                 # 2 s of audio as fast as steps come (t stays 0)
        a.frames = frame
        assert s.schedule(0.0) == ([], [a] if frame * 0.08 <= 2.0 else [])
    a.frames = 26
    assert s.schedule(0.0) == ([], [])
    assert s.schedule(26 * 0.08 - 2.0) == ([], [a])            # then one frame every 80 ms: real time
