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

Into an empty folder the first start compiles the whole of the large packages its processes import (PRECOMPILED:
torch, its compiler's sympy and networkx, triton ...) over every core, beside them: an import compiles its modules
one after another on one core, in the engine process and again in each compile helper (synth/parallel_compile.py)
that starts on a fresh machine.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path

from talkgate.synth.compile_cache import cache_root
from talkgate.system.childproc import usable_cores

log = logging.getLogger("talkgate.bytecode")
FOLDER = "bytecode"
# the packages of talkgate's processes with the most modules (an engine process on CUDA imports about 1,300 of
# torch's, 420 of sympy's, 290 of networkx's); their tests are left out
PRECOMPILED = ("torch", "triton", "sympy", "networkx", "mpmath", "numpy", "jinja2", "aiohttp")
SKIPPED = r"[/\\](tests?|benchmarks)[/\\]"


def bytecode_folder(package: str = "torch") -> Path | None:
    """Where talkgate's processes keep their bytecode, or None where Python's own place serves: the operator
    chose a prefix, `package` is not installed, or its bytecode is beside its source."""
    if os.environ.get("PYTHONPYCACHEPREFIX") or sys.pycache_prefix:
        return None
    if not without_bytecode(package):
        return None
    return cache_root() / FOLDER


def without_bytecode(package: str) -> bool:
    """Whether `package` is installed from sources with no bytecode beside them (pip puts it there, uv not)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    origin = Path(spec.origin)
    return not (origin.parent / "__pycache__" / f"{origin.stem}.{sys.implementation.cache_tag}.pyc").exists()


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
    precompile(folder, tuple(dict.fromkeys((package, *PRECOMPILED))))
    return folder


# run by precompile in a process of its own: marker, cores, skipped, dirs...; the marker once every file was tried
PRECOMPILE = """import compileall, pathlib, re, sys, time
t0 = time.perf_counter()
marker, cores, skipped, dirs = pathlib.Path(sys.argv[1]), int(sys.argv[2]), re.compile(sys.argv[3]), sys.argv[4:]
for d in dirs:
    compileall.compile_dir(d, quiet=2, workers=cores, rx=skipped)   # False also where a file is another Python's
marker.touch()
print(f"talkgate.bytecode: {len(dirs)} packages compiled in {time.perf_counter() - t0:.1f} s on {cores} cores",
      file=sys.stderr)
"""


def precompile(folder: Path, packages: tuple[str, ...]) -> subprocess.Popen | None:
    """Compile the bytecode of those of `packages` installed without it into `folder` (the pycache prefix this
    process has set) over every core, once (a marker file records it), in a process of its own: the processes
    started meanwhile import as it goes, compiling what it has not reached yet themselves (it is never waited
    for; on an H100 machine's 16 cores it took 4.6-4.9 s). -> the process, or None where there was nothing to do."""
    marker = folder / f"precompiled-{sys.implementation.cache_tag}"
    packages = tuple(name for name in packages if without_bytecode(name))
    if marker.exists() or not packages:
        return None
    dirs = [d for name in packages for d in importlib.util.find_spec(name).submodule_search_locations or ()]
    cores = usable_cores()
    try:
        proc = subprocess.Popen([sys.executable, "-c", PRECOMPILE, str(marker), str(cores), SKIPPED, *dirs],
                                env=dict(os.environ, PYTHONPYCACHEPREFIX=str(folder)), stdout=subprocess.DEVNULL)
    except OSError as e:
        log.warning("compiling the bytecode of %s failed (%s): each import compiles its own", ", ".join(packages), e)
        return None
    log.info("compiling the bytecode of %s into %s on %d cores", ", ".join(packages), folder, cores)
    return proc
