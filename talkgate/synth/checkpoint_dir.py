"""Where a checkpoint is: a local directory, or a Hugging Face repo id found in its cache or downloaded.

Imports no torch, so that `talkgate serve`'s supervisor can check --model before it starts the engine
processes without the seconds torch's import takes (synth/loader.py loads what is found here).
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file (and tensor)."""


def resolve_path(path_or_id: str | os.PathLike) -> Path:
    """A local directory, or a Hugging Face repo id downloaded with huggingface_hub (fails fast offline)."""
    path = Path(path_or_id).expanduser()
    if path.exists():
        if not path.is_dir():
            raise CheckpointError(f"{path}: not a directory (expected a checkpoint directory)")
        return path
    text = str(path_or_id)
    parts = text.split("/")
    if len(parts) != 2 or not all(parts) or text.startswith((".", "/", "~")):
        raise CheckpointError(f"{text}: no such checkpoint directory (and not a Hugging Face id like Org/Name)")
    from huggingface_hub import snapshot_download
    try:
        return Path(snapshot_download(text, local_files_only=True))
    except Exception:
        pass                                     # not cached: download
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False"):
        raise CheckpointError(f"{text}: not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
                              "pass a checkpoint directory")
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as e:
        raise CheckpointError(f"{text}: not in the local Hugging Face cache and {host}:{port} is unreachable "
                              f"({e}); pass a checkpoint directory (e.g. one made by `talkgate checkpoint "
                              "create`)") from None
    try:
        return Path(snapshot_download(text))
    except Exception as e:
        raise CheckpointError(f"{text}: download from {endpoint} failed: {e}") from e
