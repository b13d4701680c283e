"""Usage metering (`talkgate serve --usage-log PATH`): one JSON line per finished context, appended by every worker
process to the same file: the key (id, tenant), model, API, characters in, audio seconds out, start and end time.

Audio is counted where its frames go to the client's socket (server/connection.py Link.wrote_audio; a body sent
whole, server/http_speech.py, as it goes), so a context cancelled or cut off counts what was sent and nothing the
client never got; metered just before the bytes are handed over, so a record precedes the end its client sees. A context's record is written once it
is over and none of its frames waits in the outbox (written or purged), or when its connection ends.

Each record is one write(2) on a file opened O_APPEND (server/jsonlines.py): the kernel appends it whole, the lines
of several processes never interleave, and a record written survives the server's SIGKILL (it is the kernel's).
The file is fdatasync'ed within SYNC_S of each record: a host crash loses at most the last second's records. Each
record has its own random `id` and is written once; a line cut short (a full disk, a host crash) does not parse
and is skipped by the reader (GET /v1/usage), and the next record starts on a line of its own. A context still in
flight when the server is killed has no record.
"""
from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from talkgate.server.jsonlines import JsonLines
from talkgate.server.key_limits import KeyLimits, Refusal
from talkgate.server.keys import Identity

SYNC_S = 1.0
MAX_READ_BYTES = 256 << 20      # GET /v1/usage reads at most the log's last this many bytes
MAX_LINE_BYTES = 4096


class UsageLog:
    def __init__(self, path: str | Path | None):
        """None: nothing is recorded. A path that cannot be written raises OSError (start-up fails)."""
        self.path = Path(path) if path else None
        self.file = JsonLines(self.path, "usage log", sync_s=SYNC_S) if self.path else None

    @property
    def enabled(self) -> bool:
        return self.file is not None

    def record(self, record: dict) -> None:
        if self.file is not None:
            self.file.write(record)

    def sync(self) -> None:
        if self.file is not None:
            self.file.sync()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


@dataclass
class Metered:
    """One context's usage so far."""
    start: float                    # wall clock, seconds
    queued: int = 0                 # its frames in the outbox or being written
    audio_ms: float = 0.0           # written to the client
    over: bool = False
    model: str | None = None
    characters: int = 0


@dataclass
class KeyAccount:
    """One link's (a WebSocket or an HTTP speech response) dealings with its key: the key's limits (KeyLimits) as
    its contexts start, and their usage, recorded to the usage log. The Session calls `start`, `characters` and
    `ended`; the Link calls `queued`, `dropped`, `sent`, `settle` and `close`. `identity()` is who the link is (a
    WebSocket whose key comes in its first message is nobody until then: it cannot start contexts before)."""

    identity: object                # () -> Identity | None
    limits: KeyLimits
    usage: UsageLog
    api: str
    admitted: bool = False          # an HTTP request admitted as a whole before its context (serve_speech)
    streams: dict[int, Metered] = field(default_factory=dict)

    def start(self, stream: int) -> Refusal | None:
        who = self.identity()
        if not self.admitted and who is not None:
            refusal = self.limits.start_context(who)
            if refusal is not None:
                return refusal
        self.streams[stream] = Metered(time.time())
        return None

    def characters(self, stream: int, n: int) -> Refusal | None:
        who = self.identity()
        if not self.admitted and who is not None and (refusal := self.limits.characters(who, n)) is not None:
            return refusal
        self.streams[stream].characters += n
        return None

    def ended(self, stream: int, model: str) -> None:
        """The session is done with the context; its record waits for its frames (settle)."""
        metered = self.streams[stream]
        metered.over, metered.model = True, model

    def queued(self, stream: int) -> None:
        if stream in self.streams:
            self.streams[stream].queued += 1

    def dropped(self, items) -> None:
        """Frames taken out of the outbox unwritten (a purge, a full outbox)."""
        for item in items:
            if getattr(item, "stream", None) in self.streams:
                self.streams[item.stream].queued -= 1

    def sent(self, stream: int, audio_ms: float) -> None:
        metered = self.streams.get(stream)
        if metered is None:
            return
        metered.queued -= 1
        metered.audio_ms += audio_ms
        if (who := self.identity()) is not None:
            self.limits.audio(who, audio_ms / 1000)

    def settle(self) -> None:
        """Record the contexts that are over with none of their frames waiting."""
        for stream in [s for s, m in self.streams.items() if m.over and m.queued <= 0]:
            self._record(stream)

    def close(self) -> None:
        """The link is over: what was not written never will be."""
        for stream in list(self.streams):
            self._record(stream)

    def _record(self, stream: int) -> None:
        metered = self.streams.pop(stream)
        who: Identity | None = self.identity()
        if who is None:
            return
        if not self.admitted:
            self.limits.end_context(who)
        self.usage.record({"id": secrets.token_hex(8), "key_id": who.key_id, "tenant": who.tenant,
                           "model": metered.model, "api": self.api, "characters": metered.characters,
                           "audio_s": round(metered.audio_ms / 1000, 4), "start": round(metered.start, 3),
                           "end": round(time.time(), 3)})


def totals(path: Path, start: float | None, end: float | None, key_id: str | None = None) -> dict:
    """The usage log's totals by key and model over records that ended in [start, end), read from at most the
    log's last MAX_READ_BYTES (`complete` False when older records were not read)."""
    by: dict[tuple, dict] = {}
    records = skipped = 0
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return {"totals": [], "records": 0, "skipped": 0, "complete": True}
    with f:
        size = os.fstat(f.fileno()).st_size
        offset = max(0, size - MAX_READ_BYTES)
        f.seek(offset)
        if offset:
            f.readline()                # the line cut by the offset
        for line in iter(lambda: f.readline(MAX_LINE_BYTES), b""):
            if not line.strip():
                continue                # the newline that ends a line cut short (server/jsonlines.py)
            try:
                r = json.loads(line)
                t, key, model = float(r["end"]), r["key_id"], r["model"]
                characters, audio_s = int(r["characters"]), float(r["audio_s"])
            except (ValueError, KeyError, TypeError):
                skipped += 1            # a line a full disk cut short, or one longer than any record
                continue
            if (start is not None and t < start) or (end is not None and t >= end) or \
                    (key_id is not None and key != key_id):
                continue
            records += 1
            total = by.setdefault((key, model), {"key_id": key, "tenant": r.get("tenant"), "model": model,
                                                 "contexts": 0, "characters": 0, "audio_s": 0.0})
            total["contexts"] += 1
            total["characters"] += characters
            total["audio_s"] += audio_s
    for total in by.values():
        total["audio_s"] = round(total["audio_s"], 3)
    return {"totals": sorted(by.values(), key=lambda t: (str(t["key_id"]), str(t["model"]))), "records": records,
            "skipped": skipped, "complete": offset == 0}
