"""Compiled functions kept with their traces, so that a restart loads them instead of tracing them again.

    forward = PrecompiledFunction(RMSNorm.forward, folder).function()     # a plain function of (self, *tensors)
    forward(norm, x)                   # the compiled code of x's kind: loaded, or compiled and saved now

Inductor and Triton keep their kernels on disk (compile_cache.py), but Dynamo traces the Python of every
compiled function again at every start: about 12 s of a 1.7B restart on an H100 (docs/benchmarks.md,
issue 22). torch's ahead-of-time compile (`torch.compile(fn, fullgraph=True).aot_compile`) saves a traced
function with its guards; loaded, it runs without Dynamo. One artifact holds one kind of input (a batch
of one or of any number of rows, a slice or a whole tensor, inference mode or not, a prefill's length) and
refuses another, so a PrecompiledFunction keeps every kind it has met: a call runs the first whose guards
pass, a kind not met before is compiled ahead of time then and written next to the others. Once a kind
cannot be compiled that way (a graph break, an object the artifact cannot hold), the function's kinds not
saved run torch.compile's usual path, traced at every start. Artifacts hold the bytecode of the functions
they traced, so they are kept per version of talkgate's model code (`code_folder`): changed code compiles
again, never runs stale.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

log = logging.getLogger("talkgate.precompiled")

MAX_KINDS = 64          # kinds one function keeps; past it, torch.compile's own path (bounded by its recompile limit)
KEEP_VERSIONS = 4       # versions of the model code whose artifacts are kept (about 60 MB each for 1.7B)
STALE_WRITE_S = 3600    # a partial write this old was cut short (its process killed): removed
SUFFIX = ".aot"


def code_digest() -> str:
    """Digest of the model code the artifacts trace (every module of talkgate.synth)."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def code_folder(root: str | os.PathLike) -> Path:
    """root/<code_digest()>, marked as used now; the folders of all but the KEEP_VERSIONS versions used last
    are removed (a rolling upgrade may still run the version before)."""
    folder = Path(root) / code_digest()
    folder.mkdir(parents=True, exist_ok=True)
    os.utime(folder)
    versions = sorted((p for p in folder.parent.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in versions[KEEP_VERSIONS:]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def enable() -> None:
    """torch's ahead-of-time compile is off by default in torch 2.11: on for this process."""
    torch._dynamo.config.enable_aot_compile = True


class PrecompiledFunction:
    """fn's compiled kinds, loaded from `folder` on first use, compiled and saved there as new kinds appear.
    Called by the thread that runs the model; a call inlined into another compiled function's trace runs
    fn itself, so that the outer trace sees through it."""

    def __init__(self, fn, folder: Path):
        self.fn, self.folder = fn, Path(folder)
        self.name = f"{fn.__module__}.{fn.__qualname__}"
        self.kinds: list = []                     # loaded or compiled artifacts, the last one used first
        self.jit = None                           # torch.compile(fn), once the ahead-of-time compile refused a kind
        self.loaded = False
        self.compiled = 0                         # kinds compiled in this process (0 on a warm restart)

    def function(self):
        """A plain function to bind as a method: Dynamo inlines plain functions into the traces of the
        compiled functions that call them (Attention.qkv calls its q_norm's forward), and sees fn there."""
        fn = self.fn

        def call(*args):
            if torch.compiler.is_compiling():
                return fn(*args)
            return self(*args)
        call.__name__, call.__qualname__, call.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        return call

    def __call__(self, *args):
        if not self.loaded:
            self._load()
        for i, kind in enumerate(self.kinds):
            if kind.guard_check(*args):
                if i:
                    self.kinds.insert(0, self.kinds.pop(i))
                return kind(*args)
        return self._new_kind(*args)

    def _load(self) -> None:
        self.loaded = True
        if not self.folder.is_dir():
            return
        t0 = time.perf_counter()
        for path in self.folder.glob("*.tmp"):
            try:
                if time.time() - path.stat().st_mtime > STALE_WRITE_S:
                    path.unlink()
            except OSError:                        # another process removed it first
                pass
        for path in sorted(self.folder.glob(f"*{SUFFIX}")):
            try:
                with open(path, "rb") as f:
                    kind = torch.compiler.load_compiled_function(f, f_globals=self.fn.__globals__)
            except Exception as e:                 # another torch's, or cut short: compiled again when met
                log.warning("%s: not loaded (%s: %s)", path, type(e).__name__, e)
                continue
            kind.disable_guard_check()             # __call__ has checked
            self.kinds.append(kind)
        if self.kinds:
            log.info("%s: %d compiled kinds loaded in %.3f s", self.name, len(self.kinds), time.perf_counter() - t0)

    def _new_kind(self, *args):
        _mark_batch_dynamic(args)
        if self.jit is None and len(self.kinds) < MAX_KINDS:
            t0 = time.perf_counter()
            try:
                kind = torch.compile(self.fn, fullgraph=True).aot_compile((args, {}))
                data = type(kind).serialize(kind).serialized_data
            except Exception as e:
                first_line = str(e).splitlines()[0] if str(e) else ""
                log.warning("%s: a kind of input not compiled ahead of time; its kinds not saved are traced at "
                            "every start (%s: %s)", self.name, type(e).__name__, first_line)
            else:
                try:
                    _write(self.folder, hashlib.sha256(data).hexdigest()[:16] + SUFFIX, data)
                except OSError as e:              # a full or read-only cache: the kind runs, compiled again next start
                    log.warning("%s: a compiled kind not saved (%s)", self.name, e)
                kind.disable_guard_check()
                self.kinds.insert(0, kind)
                self.compiled += 1
                log.info("%s: new kind compiled and saved in %.2f s", self.name, time.perf_counter() - t0)
                return kind(*args)
        if self.jit is None:
            self.jit = torch.compile(self.fn)
        return self.jit(*args)


def _mark_batch_dynamic(args) -> None:
    """The leading (batch) dimension of the tensor arguments dynamic when it is more than 1 (parameters
    never): one kind for every batch of 2 or more, every other size static."""
    for a in args:
        if isinstance(a, torch.Tensor) and not isinstance(a, torch.nn.Parameter) and a.dim() and a.shape[0] > 1:
            torch._dynamo.maybe_mark_dynamic(a, 0)


def _write(folder: Path, name: str, data: bytes) -> None:
    """Whole or not at all: another process may be loading the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, folder / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
