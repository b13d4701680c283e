"""The Talker's KV pages: which context holds which page (pure Python, no tensors; the engine thread only).

A context's Talker positions live in pages of `page_len` positions (synth/model.py Talker.setup_cache): position p in
its page `pages[p // page_len]`. A context takes a page when its next position reaches past the pages it holds (the
scheduler asks `reach` before it runs a row), so that a context of natural length (a sentence: 2-10 s) holds a few
pages, not the 60 s of positions a slot can address; the engine gives them back when the context ends.

Page 0 is scratch: every position a context does not hold reads and writes it (the dummy slot's rows, a prefill's
padding), never a context's own. A page given back joins the free list only at `settle()` (the start of the engine's
next step): the step in flight may still write the pages of a context cancelled during it.

`reserve` pages are held back from new contexts (`room`): the contexts already open can still grow by that many pages,
so that admission refuses a new one before the running ones starve (the engine fails the newest that does starve).
Admission runs on the callers' threads, before the engine thread opens the context and takes its first page, so it
asks `room(queued)` with the opens admitted but not opened yet: each of them will take a page the count still shows.
"""
from __future__ import annotations


class PagePool:
    def __init__(self, pages: int, page_len: int, reserve: int = 0):
        if pages < 2:
            raise ValueError(f"need at least 2 pages (page 0 is scratch), not {pages}")
        self.pages, self.page_len, self.reserve = pages, page_len, reserve
        self._free = list(range(pages - 1, 0, -1))     # popped from the end: low pages first
        self._returned: list[int] = []                 # given back, free from the next settle()

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def returning(self) -> int:
        """Pages given back since the last settle(): free from the next."""
        return len(self._returned)

    def room(self, queued: int = 0) -> bool:
        """A new context may open, `queued` opens admitted before it still to take their first page: more pages free
        than those and the reserve for the open ones' growth."""
        return len(self._free) - queued > self.reserve

    def reach(self, req, position: int) -> bool:
        """Give `req` (its `pages` list) the pages up to the one of `position`; False where too few are free (it
        keeps what it has)."""
        need = position // self.page_len + 1 - len(req.pages)
        if need <= 0:
            return True
        if need > len(self._free):
            return False
        for _ in range(need):
            req.pages.append(self._free.pop())
        return True

    def give_back(self, req) -> None:
        """`req`'s pages, free from the next settle() (idempotent)."""
        self._returned.extend(req.pages)
        req.pages.clear()

    def settle(self) -> None:
        """The pages given back since the last settle become free (no step in flight writes them any more)."""
        if self._returned:
            self._free.extend(self._returned)
            self._returned.clear()
