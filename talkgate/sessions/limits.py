"""Every bound a connection or context is held to, in one place (documented in docs/protocol.md)."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 64 * 1024       # one client message
    max_text_chars: int = 20_000             # text per context
    max_contexts_per_connection: int = 16    # contexts in flight on one connection
    max_connections: int = 1000              # WebSocket connections per server
    idle_timeout_s: float = 120.0            # no client message for this long: close 1000 (idle)
    max_backlog_ms: int = 10_000             # unsent audio of one context: past it, cancel (slow_consumer)
    max_outbox_items: int = 4096             # messages waiting to be written on one connection
    max_http_input_chars: int = 4096         # OpenAI endpoint `input` (its published limit)

    def as_dict(self) -> dict:
        return asdict(self)
