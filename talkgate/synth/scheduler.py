"""Which contexts run in the next step: pure Python over Request objects, no tensors, no clock of its own.

Every ready context runs every step (continuous batching). New contexts are prefilled in the same step
as the running ones' decode (at most `max_prefills` a step), so a first frame never waits behind long
utterances. When more are ready than one step takes (`max_batch`), earliest deadline first: the
context whose client runs out of audio soonest (start + audio emitted so far) goes first; a new
context's deadline is the moment its text became ready, so it competes fairly with running ones.

A context whose client plays its audio as it comes (ContextParams.lead_s) sits out the steps while its audio is more
than that lead ahead of its player: audio made earlier than that is heard no sooner, and making it costs the steps
their rows and the gateway's workers their encoding now, when other contexts need them (at 512 closed-loop streams
every stream was made at about 3x real time: docs/benchmarks.md). It runs again once its lead has shrunk to that;
`due_in` tells the engine loop when the first such context is due, so that it wakes for it with nothing else to do.

With a PagePool (synth/pages.py) a context runs only once it holds the KV page of the position its frame writes: the
running ones reach theirs first, then the new ones. A running context that could not is `starved` (the engine fails
the newest of them, whose pages then let the others go on); a new one that could not is `blocked` (it waits while
anything else can go on, else the engine fails it too).
"""
from __future__ import annotations

from talkgate.synth.pages import PagePool
from talkgate.synth.request import Request, Status


class Scheduler:
    def __init__(self, max_batch: int, max_prefills: int, pages: PagePool | None = None):
        if not (1 <= max_prefills <= max_batch):
            raise ValueError(f"need 1 <= max_prefills ({max_prefills}) <= max_batch ({max_batch})")
        self.max_batch, self.max_prefills = max_batch, max_prefills
        self.pages = pages
        self.waiting: list[Request] = []     # not prefilled yet
        self.running: list[Request] = []     # prefilled, generating
        self.starved: list[Request] = []     # running, due, but no KV page for their next frame (the last schedule)
        self.blocked: list[Request] = []     # not prefilled, ready, but no KV page for their prompt (the last schedule)

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def join(self, req: Request) -> None:
        """A context whose first frame was made apart from the steps (the lane: synth/lane.py): running from here on
        (out of `waiting` where it was opened at a step boundary before its text came)."""
        if req in self.waiting:
            self.waiting.remove(req)
        self.running.append(req)
        req.status = Status.RUNNING

    def remove(self, req: Request) -> None:
        """Take a finished or cancelled context out and give its pages back (idempotent)."""
        for queue in (self.waiting, self.running):
            if req in queue:
                queue.remove(req)
        req.status = Status.FINISHED
        if self.pages is not None:
            self.pages.give_back(req)

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def new_ready(self) -> bool:
        """A context not prefilled yet is ready: the next step makes its first frame."""
        return any(r.ready for r in self.waiting)

    def due_in(self, now: float) -> float | None:
        """Seconds until the first ready context that sits out for its lead is due (0 where one is due now); None where
        none sits out."""
        due = [r.deadline - r.params.lead_s - now for r in self.running if r.ready and r.params.lead_s is not None]
        return max(0.0, min(due)) if due else None

    def schedule(self, now: float) -> tuple[list[Request], list[Request]]:
        """(contexts to prefill, contexts to decode) for the next step; moves the prefilled to running.
        A context whose next text token has not arrived is skipped, never blocking the others."""
        for req in self.waiting:
            if req.ready and req.t_ready is None:
                req.t_ready = now
        # a context with a lead runs while its player has at most that lead still to play (inline: per row and step)
        old = [r for r in self.running
               if r.ready and (r.params.lead_s is None or r.deadline - now <= r.params.lead_s)]
        new = [r for r in self.waiting if r.ready]
        if self.pages is not None:                  # inline too: a page is reached once every page_len frames
            span, reach = self.pages.page_len, self.pages.reach
            self.starved = [r for r in old if r.next_position >= span * len(r.pages) and not reach(r, r.next_position)]
            if self.starved:
                old = [r for r in old if r not in self.starved]
            reached, self.blocked = [], []
            for r in new:                           # few: the new contexts ready this step
                fits = r.next_position < span * len(r.pages) or reach(r, r.next_position)
                (reached if fits else self.blocked).append(r)
            new = reached
        if len(new) > self.max_prefills:
            new = sorted(new, key=lambda r: r.deadline)[:self.max_prefills]
        if len(new) + len(old) > self.max_batch:
            ranked = sorted(new + old, key=lambda r: r.deadline)[:self.max_batch]
            keep = set(map(id, ranked))
            new = [r for r in new if id(r) in keep]
            old = [r for r in old if id(r) in keep]
        for req in new:
            self.waiting.remove(req)
            self.running.append(req)
            req.status = Status.RUNNING
        return new, old
