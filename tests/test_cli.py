"""The `talkgate` command: checkpoint create and synthesize in process; help, version and mistakes as typed."""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import socket
import subprocess
import sys
import wave
from pathlib import Path

import pytest

from talkgate.cli.main import main


def read_wav(path):
    with wave.open(str(path)) as w:
        return w.getframerate(), w.getnframes()


def test_checkpoint_create_then_synthesize(tmp_path, capsys):
    ck = tmp_path / "ck"
    assert main(["checkpoint", "create", str(ck), "--preset", "tiny", "--variant", "custom_voice"]) == 0
    assert (ck / "config.json").is_file() and (ck / "speech_tokenizer" / "model.safetensors").is_file()
    out = tmp_path / "a.wav"
    args = ["synthesize", "--model", str(ck), "--voice", "ryan", "--language", "english", "--text", "Hello there.",
            "-o", str(out), "--seed", "3", "--max-frames", "6"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "untrained random weights" in err and '"untrained": true' in err
    rate, n = read_wav(out)
    assert rate == 24000 and 0 < n <= 6 * 1920 and n % 1920 == 0
    again = tmp_path / "b.wav"
    assert main(args[:-5] + [str(again), "--seed", "3", "--max-frames", "6"]) == 0
    assert out.read_bytes() == again.read_bytes()                 # a seed makes sampling reproducible


def test_synthesize_untrained_ends_by_the_text_rule(tiny_checkpoint, tmp_path, capsys):
    """Random weights never sample eos: without --max-frames the utterance is as long as the text-length
    rule says ("Hello there, how are you?": 25 characters, 19 frames), not max_new_tokens of noise."""
    out = tmp_path / "rule.wav"
    assert main(["synthesize", "--model", str(tiny_checkpoint), "--text", "Hello there, how are you?",
                 "-o", str(out), "--seed", "1"]) == 0
    assert '"end_of_speech": "text_length_rule"' in capsys.readouterr().err
    assert read_wav(out) == (24000, 19 * 1920)


def test_synthesize_with_a_cloned_voice(tmp_path, capsys):
    import numpy as np
    import soundfile

    from tests.voicetools import voiced
    ck = tmp_path / "base"
    assert main(["checkpoint", "create", str(ck), "--preset", "tiny", "--variant", "base"]) == 0
    ref = tmp_path / "ref.flac"
    soundfile.write(str(ref), np.stack([voiced(1, 2.0, 16000)] * 2, axis=1), 16000)     # stereo FLAC
    common = ["synthesize", "--model", str(ck), "--text", "Hello there.", "--max-frames", "6", "--seed", "1"]
    assert main(common + ["-o", str(tmp_path / "x.wav"), "--ref-audio", str(ref)]) == 0
    assert "x-vector only" in capsys.readouterr().err
    assert main(common + ["-o", str(tmp_path / "icl.wav"), "--ref-audio", str(ref), "--ref-text", "Hi, me here."]) == 0
    assert "ICL, 25 reference frames" in capsys.readouterr().err
    assert read_wav(tmp_path / "icl.wav")[0] == 24000
    (tmp_path / "bad.wav").write_bytes(b"not audio")
    assert main(common + ["-o", str(tmp_path / "y.wav"), "--ref-audio", str(tmp_path / "bad.wav")]) == 2
    assert "bad.wav: cannot read audio" in capsys.readouterr().err
    assert main(common + ["-o", str(tmp_path / "y.wav"), "--ref-text", "x"]) == 2
    assert "--ref-text needs --ref-audio" in capsys.readouterr().err


def test_errors_are_one_line_and_exit_2(tmp_path, tiny_checkpoint, capsys):
    assert main(["synthesize", "--model", str(tiny_checkpoint), "--voice", "bob", "--text", "hi",
                 "-o", str(tmp_path / "x.wav")]) == 2
    assert "talkgate: error: unknown voice 'bob'; available: serena" in capsys.readouterr().err
    assert main(["synthesize", "--model", str(tmp_path / "missing"), "--text", "hi", "-o", str(tmp_path / "x.wav")]) == 2
    assert "no such checkpoint directory" in capsys.readouterr().err
    assert main(["checkpoint", "create", str(tiny_checkpoint), "--preset", "tiny"]) == 2
    assert "not empty" in capsys.readouterr().err
    for command in (["serve"], ["synthesize", "--model", str(tiny_checkpoint), "--text", "hi", "-o", "x.wav"]):
        with pytest.raises(SystemExit) as exit_:
            main(command + ["--seed", str(1 << 64)])
        assert exit_.value.code == 2 and "--seed: must fit in 64 bits" in capsys.readouterr().err


# ----- the console command, as a user types it -----
TALKGATE = str(Path(sys.executable).parent / "talkgate")


def talkgate(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([TALKGATE, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def all_parsers():
    """(prog, parser) of every command: talkgate, each subcommand, and `talkgate bench`."""
    from talkgate.cli import bench
    from talkgate.cli.main import parser

    todo, found = [parser()], []
    while todo:
        p = todo.pop()
        found.append((p.prog, p))
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [sub for name, sub in action.choices.items() if name != "bench"]
    return found + [("talkgate bench", bench.parser())]


def test_help_explains_every_option_and_shows_each_default_once():
    from talkgate.cli.args import HelpFormatter

    parsers = dict(all_parsers())
    assert set(parsers) == {"talkgate", "talkgate checkpoint", "talkgate checkpoint create", "talkgate synthesize",
                            "talkgate serve", "talkgate drain", "talkgate warmup", "talkgate bench"}
    for prog, p in parsers.items():
        text = p.format_help()
        assert "(default: None)" not in text and "%(default)" not in text, prog
        for action in p._actions:
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                assert action.help, (prog, action.dest)
            if action.option_strings:
                help_text = HelpFormatter(prog)._get_help_string(action) % {"default": action.default}
                assert action.help and help_text.count("default") <= 1, (prog, action.option_strings, help_text)
    serve_help = parsers["talkgate serve"].format_help()
    assert "--port N" in serve_help and "(default: 8080)" in serve_help and "(default: 10.0)" in serve_help
    assert "english, german" in parsers["talkgate synthesize"].format_help()


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
