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
    max_connections: int = 1000              # WebSocket connections per server
    idle_timeout_s: float = 120.0            # no client message and no audio taken by the client: close
    max_backlog_ms: int = 10_000             # audio unread by a client behind real time: cancel (slow_consumer)
    max_outbox_items: int = 4096             # messages waiting to be written on one connection
    max_outbox_bytes: int = 16 << 20         # and their bytes (audio runs ahead of a real-time reader)
    max_http_input_chars: int = 4096         # OpenAI endpoint `input` (its published limit)

    def as_dict(self) -> dict:
        return asdict(self)
