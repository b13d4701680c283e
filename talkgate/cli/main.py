"""The `talkgate` command: one add_parser function per subcommand, registered in SUBCOMMANDS.

Each add_parser(subparsers) adds its subcommand and sets `func`, which takes the parsed arguments
and returns the exit status. Errors a user can fix (a bad checkpoint, an unknown voice, a busy port,
...) print one line `talkgate: error: ...` and exit with status 2, checked before a model loads
wherever they can be. Heavy modules (torch, aiohttp) are imported by the subcommands, not here:
`talkgate --help` answers at once.
"""
from __future__ import annotations

import argparse
import sys

from talkgate import __version__
from talkgate.cli import args as cli_args
from talkgate.cli import checkpoint, drain, serve, synthesize, warmup
from talkgate.cli.args import CommandError
from talkgate.server.listen import ListenError

def add_bench_parser(subparsers) -> None:
    # listed for --help only: main() hands `bench` its arguments untouched (cli/bench.py parses them); the load
    # generator is not imported here, so that `talkgate --help` does not wait for aiohttp
    subparsers.add_parser("bench", add_help=False,
                          help="end-to-end load test of a running server (`talkgate bench --help`)")


SUBCOMMANDS = [checkpoint.add_parser, synthesize.add_parser, serve.add_parser, drain.add_parser, warmup.add_parser,
               add_bench_parser]


def parser() -> argparse.ArgumentParser:
    p = cli_args.Parser(prog="talkgate", description="talkgate: real-time streaming text-to-speech gateway "
                        "(Qwen3-TTS). `talkgate COMMAND --help` for each command's options.")
    p.add_argument("--version", action="version", version=f"talkgate {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_parser in SUBCOMMANDS:
        add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from talkgate.cli import bench
        return bench.main(argv[1:])
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (CommandError, ListenError) as e:
        print(f"talkgate: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        from talkgate.synth.api import EngineError
        from talkgate.synth.checkpoint import CheckpointWriteError
        from talkgate.synth.loader import CheckpointError
        if not isinstance(e, (CheckpointError, CheckpointWriteError, EngineError)):
            raise
        print(f"talkgate: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
