"""What the `talkgate` subcommands share: the argument parser, argument types, and the user's error.

Everything a user can get wrong ends as one line `talkgate ...: error: ...` and a non-zero exit:
argparse's own errors through Parser.error, the checks after parsing through CommandError. This
module imports nothing heavy: `talkgate --help` must not wait for torch.
"""
from __future__ import annotations

import argparse
import re


class CommandError(Exception):
    """A mistake the user can fix (a busy port, a missing directory, ...): one line, exit status 2."""


class HelpFormatter(argparse.HelpFormatter):
    """Each option's default once: appended when its help does not already say it, and only when
    there is one to say (not None, False or an empty list)."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=34)

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction):
            # argparse leaves the subcommands' own indent out of the column width: their names would wrap
            for name in action.choices:
                width = len(name) + self._current_indent + self._indent_increment
                self._action_max_length = max(self._action_max_length, width)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("(default" in text or "default:" in text or not action.option_strings or default is None or default is False
                or default is argparse.SUPPRESS or default == []):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, and whose subparsers are Parsers with HelpFormatter."""

    def __init__(self, *args, formatter_class=HelpFormatter, **kw):
        super().__init__(*args, formatter_class=formatter_class, **kw)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def integer(low: int, high: int | None = None):
    """argparse type: an integer in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is out of range: use {low} or more" if high is None
                                             else f"{value} is out of range: use {low} to {high}")
        return value
    return parse


def seconds(text: str) -> float:
    """argparse type: a duration in seconds, >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is out of range: use a number of seconds >= 0")
    return value


def positive_seconds(text: str) -> float:
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return value


def positive_number(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is out of range: use a number > 0")
    return value


port = integer(0, 65535)


def seed(text: str) -> int:
    """argparse type of a sampling seed: an integer of 64 bits, as the engine takes."""
    from talkgate.synth.api import SEED_RANGE, seed_fits
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not seed_fits(value):
        raise argparse.ArgumentTypeError(f"must fit in 64 bits ({SEED_RANGE})")
    return value


DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def device(text: str) -> str:
    """argparse type: cpu, cuda or cuda:N (whether that device exists is check_device's job)."""
    if not DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}: use cpu, cuda or cuda:N")
    return text


def check_device(name: str | None) -> str:
    """The device to run on (None: cuda when one is visible, else cpu); CommandError when this machine
    or this torch build cannot run on it. Imports no torch: the supervisor of `talkgate serve` checks
    this before it starts the engine processes, and importing torch there (3-5 s on an H100 host) delayed
    every start by that much (docs/benchmarks.md, issue 22)."""
    if name == "cpu":
        return name
    count = cuda_device_count()
    if name is None:
        return "cuda" if count and torch_cuda_version() else "cpu"
    if torch_cuda_version() is None:
        raise CommandError(f"--device {name}: this torch build has no CUDA support; "
                           "use --device cpu, or install a CUDA build of torch")
    if not count:
        raise CommandError(f"--device {name}: no CUDA device is visible (no GPU, no driver, or CUDA_VISIBLE_DEVICES "
                           "hides them); use --device cpu")
    index = int(name.partition(":")[2] or 0)
    if index >= count:
        raise CommandError(f"--device {name}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return name


def cuda_device_count() -> int:
    """CUDA devices visible to this process (CUDA_VISIBLE_DEVICES applies), asked of the driver as torch
    asks it; 0 without a driver or a device. Creates no context on any GPU."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def torch_cuda_version() -> str | None:
    """The CUDA version the installed torch was built for (torch.version.cuda), read from its version.py
    without importing torch; None for a CPU build."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    try:
        text = Path(spec.origin).with_name("version.py").read_text()
    except OSError:
        return None
    found = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return found.group(1) if found else None
