"""The wire actions every protocol translator returns for the I/O layer (server/connection.py).

`Send` a text or binary frame (audio frames name their stream and duration, so the writer can account
for what the client really received), `Purge` the queued, unsent frames of a stream (a cancel
happened), `Close` the socket after what is queued. A Send that reports an error names its code, so
the I/O layer counts every error the client is told about in one place (/metrics errors_total).
Engine commands are the translators' other output (sessions/protocol.py), never among these.
"""
from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Send:
    data: str | bytes
    stream: int | None = None      # audio frames: the context's stream
    audio_ms: float = 0.0
    error: str | None = None       # the error code this message reports, if it reports one


@dataclass(frozen=True)
class Purge:
    stream: int


@dataclass(frozen=True)
class Close:
    code: int
    reason: str
    error: str | None = None       # the error code this close reports (protocols whose errors are closes)


Action = Send | Purge | Close

# error codes that are the server's fault, and the one that means "no capacity now, try again later";
# every other code is a client's mistake (HTTP 4xx, WebSocket close 1008, never 500 or 1011)
SERVER_ERRORS = frozenset({"internal_error", "engine_error", "engine_stopped", "engine_failed"})
BUSY = "engine_full"
# a client key's limits (server/key_limits.py): "too many requests", as the vendors answer theirs
KEY_LIMITS = frozenset({"key_connections_limit", "key_contexts_limit", "key_requests_limit", "key_characters_limit",
                        "key_audio_limit"})


def http_status(code: str) -> int:
    return 500 if code in SERVER_ERRORS else 503 if code == BUSY else 429 if code in KEY_LIMITS else 400


def close_code(code: str) -> int:
    return 1011 if code in SERVER_ERRORS else 1013 if code == BUSY else 1008


def dumps(obj: dict) -> str:
    """Compact JSON (ASCII: a string from the client is echoed escaped, whatever it holds)."""
    return json.dumps(obj, separators=(",", ":"))


def send_json(obj: dict, error: str | None = None) -> Send:
    """A JSON text frame (every translator's JSON messages go out through this)."""
    return Send(dumps(obj), error=error)
