"""Every bound a connection or context is held to, in one place (documented in docs/protocol.md, set by
`talkgate serve` flags). They hold for every protocol, the compatible APIs and the HTTP endpoint too."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 64 * 1024       # one client message
    max_messages_per_s: float = 200.0        # client messages a second on average (bursts of 5 s worth): past it, close 1008
    max_text_chars: int = 20_000             # text per context (per flush for the compatible APIs' contexts)
    max_contexts_per_connection: int = 16    # contexts in flight on one connection
    max_connections: int = 1000              # WebSocket connections per server (and HTTP ones beside them: below)
    idle_timeout_s: float = 120.0            # no client message and no audio taken by the client: close
    max_backlog_ms: int = 10_000             # audio unread by a client behind real time: cancel (slow_consumer)
    max_outbox_items: int = 4096             # messages waiting to be written on one connection
    max_outbox_bytes: int = 16 << 20         # and their bytes (audio runs ahead of a real-time reader)
    max_http_input_chars: int = 4096         # OpenAI endpoint `input` (its published limit)
    # a WebSocket client's contexts are made at most this many seconds of audio ahead of its player (synth/scheduler.py;
    # None: as fast as the engine can). 2 s: on one H200 it took 1,024 real-time streams of 0.6B from 303 requests with
    # an underrun to none, the server's CPU from 12.7 to 6.9 cores (docs/benchmarks.md). HTTP requests always run as
    # fast as the engine can
    stream_lead_s: float | None = 2.0

    def as_dict(self) -> dict:
        return asdict(self)


OVER_CAP = 64   # connections past the cap that are answered (503) before they close; past those, closed unanswered


def open_connections(max_connections: int) -> tuple[int, int]:
    """(cap, hard) on the TCP connections of every kind one server process holds, for its `max_connections`
    WebSocket sessions: up to the cap, as many HTTP connections beside the sessions; past it, a connection's requests
    are answered 503 too_many_connections and it closes (server/errors.py); past hard (OVER_CAP more), it is closed
    as it is accepted. So a client opening connections holds at most `hard` of the process's descriptors."""
    return 2 * max_connections, 2 * max_connections + OVER_CAP
