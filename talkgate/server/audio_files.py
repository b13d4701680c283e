"""Audio files served at a URL for a bounded time: DashScope's non-streamed Qwen TTS answers with the URL of a WAV
file, not the audio (sessions/dashscope_http.py). Each file is named by an unguessable id (128 random bits), which
is the whole of its access rule, as DashScope's signed download URL is: the SDK's users fetch it with a plain GET.

The files live in one folder that every gateway worker of a server shares (`talkgate serve` gives them its run
folder's `audio/`, removed when the server stops; one process without a folder makes a temporary one and removes
it at the end), so the worker that answers the GET need not be the one that made the file. Bounds: a file expires
TTL_S after it was written, and the folder holds at most MAX_BYTES (the oldest go first); both are applied at
every write, and an expired file is never served.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
import time

TTL_S = 3600                    # a URL is valid this long (DashScope's last 24 hours: a gateway keeps less)
MAX_BYTES = 512 * 1024 * 1024   # the folder's bound, over every worker's files
ID = re.compile(r"audio_[0-9a-f]{32}\Z")


class AudioFiles:
    def __init__(self, root: str | None = None, ttl_s: float = TTL_S, max_bytes: int = MAX_BYTES):
        self.root, self.ttl_s, self.max_bytes = root, ttl_s, max_bytes
        self.own = root is None         # a folder made here, removed by close()

    def _folder(self) -> str:
        if self.root is None:
            self.root = tempfile.mkdtemp(prefix="talkgate-audio-")
        os.makedirs(self.root, exist_ok=True)
        return self.root

    def put(self, data: bytes, suffix: str = ".wav", now: float | None = None) -> tuple[str, int]:
        """Keep `data`; -> (its id, when its URL expires: Unix seconds)."""
        now = time.time() if now is None else now
        folder = self._folder()
        self._prune(folder, now, len(data))
        audio_id = f"audio_{secrets.token_hex(16)}"
        path = os.path.join(folder, audio_id + suffix)
        with open(path + ".part", "wb") as f:
            f.write(data)
        os.utime(path + ".part", (now, now))    # its age counts from `now`
        os.replace(path + ".part", path)        # never served half written
        return audio_id, int(now + self.ttl_s)

    def path(self, name: str, now: float | None = None) -> str | None:
        """The file of `name` (`<id>.wav`) while it is valid, else None."""
        stem, dot, suffix = name.partition(".")
        if not ID.match(stem) or self.root is None or suffix not in ("wav",):
            return None
        path = os.path.join(self.root, name)
        try:
            written = os.stat(path).st_mtime
        except OSError:
            return None
        return path if (time.time() if now is None else now) - written < self.ttl_s else None

    def _prune(self, folder: str, now: float, incoming: int) -> None:
        """Remove the expired files, then the oldest while the folder would exceed max_bytes."""
        files = []
        for entry in os.scandir(folder):
            try:
                st = entry.stat()
            except OSError:
                continue            # another worker removed it
            if now - st.st_mtime >= self.ttl_s:
                _remove(entry.path)
            else:
                files.append((st.st_mtime, st.st_size, entry.path))
        total = sum(size for _, size, _ in files) + incoming
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            _remove(path)
            total -= size

    def close(self) -> None:
        if self.own and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
