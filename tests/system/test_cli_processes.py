"""The console command as a user types it: `talkgate` from the virtual environment's bin, its help and version, what
it imports, and every mistake answered in one line before a model loads (tests/unit/test_cli.py calls main() in
the test's process)."""
from __future__ import annotations

import concurrent.futures
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.serverproc import TalkgateServer


# ----- the console command, as a user types it -----
TALKGATE = str(Path(sys.executable).parent / "talkgate")


def talkgate(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([TALKGATE, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_help_and_version_from_the_console_command():
    for command in ([], ["checkpoint"], ["checkpoint", "create"], ["synthesize"], ["serve"], ["drain"], ["warmup"],
                    ["bench"]):
        done = talkgate(*command, "--help")
        assert done.returncode == 0 and done.stdout.startswith("usage: talkgate") and not done.stderr, command
    from talkgate import __version__
    done = talkgate("--version")
    assert (done.returncode, done.stdout) == (0, f"talkgate {__version__}\n")


def test_help_imports_nothing_heavy():
    # what `talkgate --help` imports (-X importtime lists every module): no torch, numpy or aiohttp
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "talkgate.cli.main", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines()}
    assert "talkgate" in imported and not imported & {"torch", "numpy", "aiohttp"}


def test_serves_checks_before_the_engines_start_import_no_torch(tiny_checkpoint):
    """The supervisor of `talkgate serve` checks --device and --model before it starts the engine processes;
    importing torch there (3-5 s on a GPU host) delayed every start by as much."""
    code = ("import sys\n"
            "from talkgate.cli import serve\nfrom talkgate.processes import supervisor\n"
            "from talkgate.cli.args import CommandError, check_device, cuda_device_count, torch_cuda_version\n"
            "from talkgate.synth.checkpoint_dir import resolve_path\n"
            "try:\n    check_device('cuda:99')\nexcept CommandError as e:\n    print(e)\n"
            f"resolve_path({str(tiny_checkpoint)!r}); cuda_device_count(); torch_cuda_version()\n"
            "print('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    error, imported = done.stdout.splitlines()
    assert error.startswith("--device cuda:99: ") and imported == "False"


def test_every_mistake_is_one_line_and_exit_2_before_the_model_loads(tmp_path, tiny_checkpoint):
    """Each answer is one line on stderr and nothing else: so no model was loaded (that logs and prints
    the model info) and no traceback was printed."""
    ck, wav = str(tiny_checkpoint), str(tmp_path / "x.wav")
    synth = ["synthesize", "--model", ck, "--text", "Hello.", "-o"]
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = str(busy.getsockname()[1])
    (tmp_path / "voices.json").write_text('{"elevenlabs": []}')
    (tmp_path / "a-file").write_text("")
    cases = [
        (["serve", "--model", ck, "--port", port, "--device", "cpu"], "cannot listen on 127.0.0.1:" + port
         + ": the port is in use"),
        (["serve", "--port", "70000"], "argument --port: 70000 is out of range: use 0 to 65535"),
        (["serve", "--port", "eighty"], "argument --port: 'eighty' is not an integer"),
        (["serve", "--host", "192.0.2.1", "--port", "0", "--model", ck, "--device", "cpu"], "--host 192.0.2.1: not an address of "
         "this machine"),
        (["serve", "--device", "gpu"], "unknown device 'gpu': use cpu, cuda or cuda:N"),
        (["serve", "--port", "0", "--model", ck, "--device", "cuda:99"], "--device cuda:99: "),
        (["serve", "--port", "0", "--model", str(tmp_path / "missing")], "missing: no such checkpoint directory"),
        (["serve", "--model", ck, "--device", "cpu", "--voice-map", str(tmp_path / "none.json")], "no such file"),
        (["serve", "--model", ck, "--device", "cpu", "--voice-map", str(tmp_path / "voices.json")],
         "'elevenlabs' must map voice ids"),
        (["serve", "--port", "0", "--device", "cpu"], "cannot create the default checkpoint in ",
         {"TALKGATE_CACHE": str(tmp_path / "a-file" / "cache")}),
        (["serve", "--max-contexts", "0"], "argument --max-contexts: 0 is out of range: use 1 or more"),
        (["serve", "--max-batch", "0"], "argument --max-batch: 0 is out of range: use 1 or more"),
        (["warmup", "--max-batch", "-2"], "argument --max-batch: -2 is out of range: use 1 or more"),
        (["serve", "--shutdown-deadline", "-1"], "argument --shutdown-deadline: -1 is out of range"),
        (["serve", "--idle-timeout", "0"], "argument --idle-timeout: must be more than 0 seconds"),
        (["serve", "--tls"], "unrecognized arguments: --tls"),
        (["serve", "--model", ck, "--ssl-certfile", str(tmp_path / "a-file")], "--ssl-certfile and --ssl-keyfile go "
         "together"),
        (["serve", "--model", ck, "--ssl-certfile", str(tmp_path / "none.pem"), "--ssl-keyfile", str(tmp_path / "a-file")],
         "--ssl-certfile " + str(tmp_path / "none.pem") + ": no such file"),
        (["serve", "--model", ck, "--ssl-certfile", str(tmp_path / "a-file"), "--ssl-keyfile", str(tmp_path / "a-file")],
         "cannot load them"),
        (synth + [str(tmp_path / "missing" / "x.wav")], "no such directory"),
        (synth + [str(tmp_path)], "is a directory"),
        (synth + [wav, "--voice", "bob"], "unknown voice 'bob'; available: serena, vivian"),
        (synth + [wav, "--language", "klingon"], "unknown language 'klingon'; available: auto, chinese"),
        (synth + [wav, "--device", "tpu"], "unknown device 'tpu'"),
        (synth + [wav, "--max-frames", "0"], "argument --max-frames: 0 is out of range"),
        (synth + [wav, "--ref-text", "hi"], "--ref-text needs --ref-audio"),
        (synth + [wav, "--ref-audio", str(tmp_path / "none.wav")], "none.wav: no such file"),
        (synth + [wav, "--untrained-length", "forever"], "invalid choice: 'forever'"),
        (["warmup", "--device", "gpu"], "unknown device 'gpu'"),
        (["synthesize", "--model", ck, "--text", " ", "-o", wav], "--text is empty"),
        (["synthesize", "--model", ck, "-o", wav], "the following arguments are required: --text"),
        (["checkpoint", "create", ck], "exists and is not empty"),
        (["checkpoint", "create", str(tmp_path / "c"), "--preset", "huge"], "invalid choice: 'huge'"),
        (["speak"], "invalid choice: 'speak'"),
        ([], "the following arguments are required: COMMAND"),
    ]
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda case: talkgate(*case[0], env=case[2] if len(case) > 2 else None), cases))
    finally:
        busy.close()
    for (args, expected, *_), done in zip(cases, answers):
        assert done.returncode == 2 and not done.stdout, (args, done)
        assert done.stderr.startswith("talkgate") and done.stderr.count("\n") == 1, (args, done.stderr)
        assert expected in done.stderr, (args, done.stderr)
    assert not (tmp_path / "x.wav").exists() and not (tmp_path / "c").exists()


def test_max_batch_reaches_the_engine_in_both_process_layouts(tiny_checkpoint):
    """`serve --max-batch N`: the rows a step takes, apart from the slots, in an engine process (the supervisor's
    command line) and in the single-process server; without it a step takes every slot (--max-contexts)."""
    with TalkgateServer(tiny_checkpoint, "--workers", "1", "--max-contexts", "6", "--max-batch", "3") as procs, \
            TalkgateServer(tiny_checkpoint, "--workers", "0", "--max-contexts", "6", "--max-batch", "3") as single, \
            TalkgateServer(tiny_checkpoint, "--workers", "0", "--max-contexts", "5") as plain:
        assert "ready (6 slots, steps of at most 3 rows)" in procs.wait_output("engine 0 ready")
        assert single.wait_output("slots, steps of").rstrip().endswith("6 slots, steps of at most 3 rows")
        assert plain.wait_output("slots, steps of").rstrip().endswith("5 slots, steps of at most 5 rows")
