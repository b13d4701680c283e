"""Python's bytecode kept in the talkgate cache for packages installed without it (processes/bytecode.py)."""
from __future__ import annotations

import os
import py_compile
import subprocess
import sys
import time
from pathlib import Path

from talkgate.processes import bytecode

REPO = Path(__file__).resolve().parents[2]
START = """
import subprocess, sys
from talkgate.processes import bytecode
folder = bytecode.use("fakepkg")
import fakepkg.mod
child = subprocess.run([sys.executable, "-c", "import sys; print(sys.pycache_prefix, sys.flags.dont_write_bytecode)"],
                       capture_output=True, text=True).stdout.split()
print(folder, *child)
"""


def package(root: Path) -> Path:
    src = root / "src" / "fakepkg"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "mod.py").write_text("VALUE = 42\n")
    (src / "later.py").write_text("VALUE = 43\n")
    (src / "tests").mkdir()
    (src / "tests" / "test_mod.py").write_text("VALUE = 44\n")
    return src


def environment(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    return {**env, "PYTHONPATH": f"{tmp_path / 'src'}{os.pathsep}{REPO}", "PYTHONDONTWRITEBYTECODE": "1",
            "TALKGATE_CACHE": str(tmp_path / "cache"), **extra}


def test_a_package_without_bytecode_has_it_kept_in_the_cache_and_read_by_the_next_start(tmp_path):
    """Installed without bytecode and run with PYTHONDONTWRITEBYTECODE: the first start writes the bytecode under
    <cache>/bytecode (nothing beside the sources), the processes it starts inherit the prefix, and the next start
    loads the module from there (python -v names the file a code object comes from)."""
    src = package(tmp_path)
    env = environment(tmp_path)
    first = subprocess.run([sys.executable, "-c", START], env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    folder = tmp_path / "cache" / "bytecode"
    assert first.stdout.split() == [str(folder), str(folder), "0"]
    kept = list(folder.rglob("mod.*.pyc"))
    assert len(kept) == 1 and str(src).lstrip(os.sep) in str(kept[0])
    assert not (src / "__pycache__").exists()
    # the whole package is compiled over every core beside the start, not only what it imported; not its tests
    deadline = time.monotonic() + 60
    while not list(folder.glob("precompiled-*")):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert len(list(folder.rglob("later.*.pyc"))) == 1 and not list(folder.rglob("test_mod.*.pyc"))
    again = subprocess.run([sys.executable, "-v", "-c", START], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert f"# code object from '{kept[0]}'" in again.stderr


def test_nothing_changes_where_the_bytecode_is_beside_the_sources_or_the_operator_chose_a_prefix(tmp_path,
                                                                                               monkeypatch):
    src = package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setenv("TALKGATE_CACHE", str(tmp_path / "cache"))
    assert bytecode.bytecode_folder("fakepkg") == tmp_path / "cache" / "bytecode"
    assert bytecode.bytecode_folder("no_such_package_here") is None
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "theirs"))
    assert bytecode.bytecode_folder("fakepkg") is None
    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    py_compile.compile(str(src / "__init__.py"), doraise=True)          # pip's default: bytecode beside it
    assert bytecode.bytecode_folder("fakepkg") is None
