"""Python's bytecode kept in the talkgate cache when the installed packages have none beside their sources.

A package installed without its bytecode (uv's default, `pip --no-compile`) and run where Python may not write
it (PYTHONDONTWRITEBYTECODE, a common container setting, or a read-only image) is compiled from source by
every process that imports it. torch and its compiler are thousands of modules: on the H100 machine, set up so,
importing them took 11.6 s in every engine process and 3.8 s from bytecode (docs/benchmarks.md, cold start).
Then the talkgate command keeps the bytecode of what its processes import under `<talkgate cache>/bytecode`
(Python's pycache prefix: a tree mirroring the sources' paths, one file per module and Python version, checked
against its source's size and time as usual): the first start writes it, the next ones read it, and the
processes it starts inherit the setting. Nothing is written beside the sources. PYTHONPYCACHEPREFIX set by the
operator wins; where torch's bytecode is beside it (pip's default), nothing changes.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path

from talkgate.synth.compile_cache import cache_root

log = logging.getLogger("talkgate.bytecode")
FOLDER = "bytecode"


def bytecode_folder(package: str = "torch") -> Path | None:
    """Where talkgate's processes keep their bytecode, or None where Python's own place serves: the operator
    chose a prefix, `package` is not installed, or its bytecode is beside its source."""
    if os.environ.get("PYTHONPYCACHEPREFIX") or sys.pycache_prefix:
        return None
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    if os.path.exists(importlib.util.cache_from_source(spec.origin)):
        return None
    return cache_root() / FOLDER


def use(package: str = "torch") -> Path | None:
    """Keep this process's bytecode, and that of the processes it starts (their environment), in
    bytecode_folder(package) when there is one. -> the folder, or None."""
    folder = bytecode_folder(package)
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        log.warning("cannot keep Python's bytecode in %s (%s): every start compiles the imports again", folder,
                    e.strerror)
        return None
    sys.pycache_prefix, sys.dont_write_bytecode = str(folder), False
    os.environ["PYTHONPYCACHEPREFIX"] = str(folder)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    log.info("Python bytecode kept in %s (%s has none beside its source)", folder, package)
    return folder
