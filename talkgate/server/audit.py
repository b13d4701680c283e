"""The audit log (`talkgate serve --audit-log PATH`): one JSON object a line, appended by every worker process
of a server to the same file: voices created and deleted (by which key and tenant, with the consent given),
keys refused (why; never the key), keys files reloaded or refused.

Each record is one write(2) on a file opened O_APPEND: the kernel appends it whole, so the lines of several
processes never interleave, and a crash loses no record already written. A record is at most MAX_LINE_BYTES
(longer strings are cut, `truncated` says so). Refused keys are recorded at most REFUSED_PER_MINUTE a minute per
process: past that they are counted and the next record written says how many were left out (a client hammering
with bad keys cannot fill the disk).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from talkgate.server.jsonlines import JsonLines

MAX_LINE_BYTES = 4096
MAX_STRING_CHARS = 256      # one field's string, before the line's own bound
REFUSED_PER_MINUTE = 60


class AuditLog:
    def __init__(self, path: str | Path | None):
        """None: nothing is recorded. Opening a path that cannot be written raises OSError (start-up fails)."""
        self.path = Path(path) if path else None
        self.file = JsonLines(self.path, "audit log") if self.path else None     # no fsync: a server's crash loses none
        self.window_start, self.refused_in_window, self.refused_left_out = 0.0, 0, 0

    def record(self, event: str, **fields) -> None:
        if self.file is None:
            return
        record = {"time": round(time.time(), 3), "event": event, "pid": os.getpid(),
                  **{k: _bounded(v) for k, v in fields.items()}}
        if self.refused_left_out:
            record["refused_left_out"], self.refused_left_out = self.refused_left_out, 0
        line = self.file.line(record)
        if len(line) > MAX_LINE_BYTES:
            line = self.file.line({k: record[k] for k in ("time", "event", "pid")} | {"truncated": True})
        self.file.write(line)

    def key_refused(self, reason: str, **fields) -> None:
        now = time.monotonic()
        if now - self.window_start >= 60:
            self.window_start, self.refused_in_window = now, 0
        if self.refused_in_window >= REFUSED_PER_MINUTE:
            self.refused_left_out += 1
            return
        self.refused_in_window += 1
        self.record("key_refused", reason=reason, **fields)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _bounded(value):
    if isinstance(value, str):
        return value[:MAX_STRING_CHARS]
    if isinstance(value, dict):
        return {str(k)[:MAX_STRING_CHARS]: _bounded(v) for k, v in list(value.items())[:32]}
    if isinstance(value, (list, tuple)):
        return [_bounded(v) for v in value[:32]]
    return value
