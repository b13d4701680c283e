"""A JSON-lines file that every process of a server appends to (the usage log, the audit log, --trace-latency):
one record a line, each one write(2) on a descriptor opened O_APPEND.

The kernel appends each write whole at the file's end, so the lines of several processes never interleave, and a
line written survives a SIGKILL of the server (it is the kernel's from then on). What a caller chooses:

- `sync_s`: None, no fsync (what is written survives the server's death, not the host's); a number, the file is
  fdatasync'ed within that many seconds of a record (at once when the last sync is that old, else once, later, on
  the running event loop): a host crash or power loss loses at most that last stretch;
- `max_bytes`: what this process writes at most (then it stops, with one warning);
- `stop_on_error`: a failing write (a full disk) stops the file (the trace), or is logged and the next record
  tried (the usage and audit logs: the line goes to the server's log instead).

A line cut short (a write the disk could not take whole, a host crash mid-write) is never glued to the next one:
a file that does not end with a newline when it is opened, or after a short write, gets one before the next
record. The readers skip a line that does not parse.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger("talkgate.server")


class JsonLines:
    def __init__(self, path: str | Path, what: str, mode: int = 0o600, sync_s: float | None = None,
                 max_bytes: int | None = None, stop_on_error: bool = False):
        """`what` names the file in log lines (`usage log`). Opening a path that cannot be written raises OSError."""
        self.path, self.what = Path(path), what
        self.sync_s, self.max_bytes, self.left, self.stop_on_error = sync_s, max_bytes, max_bytes, stop_on_error
        self.fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
        self.torn = _torn_tail(self.path)       # a line cut short at the end: ended before the next record
        self.synced = time.monotonic()
        self.sync_later: asyncio.TimerHandle | None = None

    @staticmethod
    def line(record: dict) -> bytes:
        return (json.dumps(record, ensure_ascii=True, separators=(",", ":")) + "\n").encode()

    def write(self, record: dict | bytes) -> bool:
        """Append one record (a dict, or a line made by `line`); False when it was not written."""
        if self.fd is None:
            return False
        data = record if isinstance(record, bytes) else self.line(record)
        if self.left is not None:
            if len(data) > self.left:
                log.warning("%s %s: this process wrote its %d MiB; no more records", self.what, self.path,
                            self.max_bytes >> 20)
                self.stop()
                return False
            self.left -= len(data)
        if self.torn:
            data = b"\n" + data
        try:
            n = os.write(self.fd, data)
            self.torn = n < len(data)
            if self.torn:
                raise OSError(f"wrote {n} of {len(data)} bytes")
            self._sync_soon()
            return True
        except OSError as e:
            text = data.decode().strip()
            if self.stop_on_error:
                log.warning("%s %s: %s; no more records", self.what, self.path, e.strerror or e)
                self.stop()
            else:                       # a full disk must not take the server down: the record goes to its log
                log.error("%s %s: cannot write (%s): %s", self.what, self.path, e.strerror or e, text)
            return False

    def _sync_soon(self) -> None:
        if self.sync_s is None or self.sync_later is not None:
            return
        if time.monotonic() - self.synced >= self.sync_s:
            self.sync()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:            # no event loop (a tool, a test): synced now
            self.sync()
            return
        self.sync_later = loop.call_later(self.sync_s - (time.monotonic() - self.synced), self.sync)

    def sync(self) -> None:
        if self.sync_later is not None:
            self.sync_later.cancel()
            self.sync_later = None
        if self.fd is None:
            return
        try:
            os.fdatasync(self.fd)
        except OSError as e:
            log.error("%s %s: cannot sync (%s)", self.what, self.path, e.strerror or e)
        self.synced = time.monotonic()

    def stop(self) -> None:
        """No more records from this process."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        if self.fd is not None and self.sync_s is not None:
            self.sync()
        self.stop()


def _torn_tail(path: Path) -> bool:
    """Whether the file ends inside a line (its last byte is not a newline)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:
        return False
