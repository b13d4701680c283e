"""Per-key limits (the keys file's `limits`, server/keys.py) held by one worker process: concurrent WebSocket
connections, concurrent contexts (an HTTP speech request is one), requests a minute (an HTTP speech request or a
WebSocket context started), characters a minute, audio seconds a UTC day (audio written to the client).

Several worker processes split each limit evenly (`share` = the number of workers): each enforces
ceil(limit / share), counted in its own memory. With one worker (or --workers 0) a limit is exact; with N it is
approximate, as connections go to whichever worker is free to take them: a key may be refused a little below its
limit when its load lands unevenly, and holds at most N - 1 over it (docs/operations.md, "Per-key limits"). Counts
shared between workers would make every context start a cross-process round trip and outlive a worker that dies
holding them; the even split costs neither.

Bounded: counts are kept only for keys in use (at most the keys file's MAX_KEYS), a count that falls to zero goes.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

from talkgate.server.keys import Identity

MINUTE_S = 60.0
DAY_S = 86400.0


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str
    retry_after_s: int      # when trying again can succeed (a concurrency limit: 1)


class Window:
    """A count over a fixed window of `span_s` seconds (a minute from the first use; a UTC day)."""

    def __init__(self, start: float, span_s: float):
        self.start, self.span_s, self.used = start, span_s, 0.0

    def roll(self, now: float) -> None:
        if now >= self.start + self.span_s:
            self.start += self.span_s * ((now - self.start) // self.span_s)
            self.used = 0.0

    def retry_after_s(self, now: float) -> int:
        return max(1, math.ceil(self.start + self.span_s - now))


class KeyLimits:
    """One worker process's counts of every key in use."""

    def __init__(self, share: int = 1, clock: Callable[[], float] = time.time):
        self.share, self.clock = max(1, share), clock
        self.connections: dict[str, int] = {}
        self.contexts: dict[str, int] = {}
        self.windows: dict[tuple[str, str], Window] = {}

    def limit(self, who: Identity, name: str) -> int | None:
        """This worker's share of `who`'s limit `name`, or None (no such limit)."""
        value = who.limits.get(name)
        return None if value is None else math.ceil(value / self.share)

    def _window(self, who: Identity, name: str, now: float) -> Window:
        window = self.windows.get((who.key_id, name))
        if window is None:
            span = DAY_S if name == "audio_seconds_per_day" else MINUTE_S
            window = self.windows[(who.key_id, name)] = Window(now - now % DAY_S if span == DAY_S else now, span)
        window.roll(now)
        return window

    # ----- concurrent connections -----
    def connect(self, who: Identity) -> Refusal | None:
        """A WebSocket connection of `who` opens (counted), or its refusal (nothing counted)."""
        limit = self.limit(who, "connections")
        if limit is not None and self.connections.get(who.key_id, 0) >= limit:
            return Refusal("key_connections_limit", f"this key's {who.limits['connections']} concurrent connections "
                           "are open", 1)
        self.connections[who.key_id] = self.connections.get(who.key_id, 0) + 1
        return None

    def disconnect(self, who: Identity) -> None:
        _down(self.connections, who.key_id)

    # ----- contexts: concurrency, requests, characters, audio -----
    def start_context(self, who: Identity, characters: int = 0) -> Refusal | None:
        """A context of `who` starts (counted: one of its contexts, one request, `characters` characters), or its
        refusal (nothing counted). Audio over the day's limit refuses new contexts; one in progress goes on."""
        now = self.clock()
        limit = self.limit(who, "contexts")
        if limit is not None and self.contexts.get(who.key_id, 0) >= limit:
            return Refusal("key_contexts_limit", f"this key's {who.limits['contexts']} concurrent contexts are in "
                           "flight", 1)
        for name, code, more, what in (("requests_per_minute", "key_requests_limit", 1, "requests a minute"),
                                       ("characters_per_minute", "key_characters_limit", characters,
                                        "characters a minute"),
                                       ("audio_seconds_per_day", "key_audio_limit", 0, "audio seconds a day")):
            limit = self.limit(who, name)
            if limit is None:
                continue
            window = self._window(who, name, now)
            if window.used + more > limit or (more == 0 and window.used >= limit):
                return Refusal(code, f"over this key's {who.limits[name]} {what}", window.retry_after_s(now))
        self.contexts[who.key_id] = self.contexts.get(who.key_id, 0) + 1
        for name, more in (("requests_per_minute", 1), ("characters_per_minute", characters)):
            if self.limit(who, name) is not None:
                self._window(who, name, now).used += more
        return None

    def characters(self, who: Identity, n: int) -> Refusal | None:
        """`n` more characters of a context in flight (a WebSocket's text), counted, or their refusal."""
        limit = self.limit(who, "characters_per_minute")
        if limit is None:
            return None
        now = self.clock()
        window = self._window(who, "characters_per_minute", now)
        if window.used + n > limit:
            return Refusal("key_characters_limit", f"over this key's {who.limits['characters_per_minute']} characters "
                           "a minute", window.retry_after_s(now))
        window.used += n
        return None

    def end_context(self, who: Identity) -> None:
        _down(self.contexts, who.key_id)

    def audio(self, who: Identity, seconds: float) -> None:
        """Audio of `who` written to its client."""
        if self.limit(who, "audio_seconds_per_day") is not None:
            self._window(who, "audio_seconds_per_day", self.clock()).used += seconds


def _down(counts: dict[str, int], key: str) -> None:
    n = counts.get(key, 0) - 1
    if n > 0:
        counts[key] = n
    else:
        counts.pop(key, None)
