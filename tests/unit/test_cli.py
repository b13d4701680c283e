"""The `talkgate` command through main() in the test's process: checkpoint create and synthesize, one-line errors, the
help of every option (tests/system/test_cli_processes.py runs the console command as typed)."""
from __future__ import annotations

import argparse
import wave

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


def test_serve_models_file_mistakes_name_the_line_and_workers_0_serves_one_model(tmp_path, tiny_checkpoint, capsys):
    """`serve --models FILE`: each mistake is one line naming the file's line, before anything starts; `--workers 0`
    with several models is refused in words (one process runs one engine)."""
    good = f'{{"name": "cv", "path": "{tiny_checkpoint}"}}'
    cases = {
        "not json": ("# a comment\n" + good + "\n{nope", "line 3: not a JSON object"),
        "no path": ('{"name": "x"}', "line 1: 'path' is required"),
        "unknown key": (f'{{"path": "{tiny_checkpoint}", "slots": 3}}', "line 1: unknown key 'slots'"),
        "taken": (good + f'\n{{"name": "b", "path": "{tiny_checkpoint}", "aliases": ["CV"]}}',
                  "line 2: the name 'CV' is taken (line 1)"),
        "bad alias": (f'{{"path": "{tiny_checkpoint}", "aliases": ["a b"]}}', "line 1: 'a b': a model's name"),
        "gpus": (f'{{"path": "{tiny_checkpoint}", "gpus": "0"}}', "line 1: 'gpus' is \"all\" or a list"),
        "slots": (f'{{"path": "{tiny_checkpoint}", "max_contexts": 0}}', "line 1: 'max_contexts' is a whole number"),
        "empty": ("\n# nothing\n", "no model in it"),
    }
    for text, expected in cases.values():
        path = tmp_path / "models.jsonl"
        path.write_text(text)
        assert main(["serve", "--models", str(path), "--port", "0"]) == 2
        err = capsys.readouterr().err
        assert f"talkgate: error: --models {path}" in err and expected in err and err.count("\n") == 1, err
    assert main(["serve", "--models", str(path), "--model", str(tiny_checkpoint)]) == 2
    assert "--model and --models: give the models in one place" in capsys.readouterr().err
    assert main(["serve", "--model", f"a={tiny_checkpoint}", "--model", f"b={tiny_checkpoint}", "--workers", "0",
                 "--port", "0"]) == 2
    assert "--workers 0 serves one model; 2 are given (a, b)" in capsys.readouterr().err
    path.write_text(f'{{"path": "{tiny_checkpoint}", "memory_share": 0.5}}')
    assert main(["serve", "--models", str(path), "--workers", "0", "--port", "0"]) == 2
    assert "memory_share need engine processes: leave out --workers 0" in capsys.readouterr().err


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


@pytest.mark.parametrize("argv, cap", [([], 512), (["--concurrency", "1024"], 1024), (["--concurrency", "64"], 512),
                                       (["--concurrency", "64", "--max-in-flight", "100"], 100)])
def test_bench_client_cap_takes_in_its_closed_loop(argv, cap):
    """`talkgate bench --concurrency N` above the client cap's default runs N clients (it was refused until
    --max-in-flight was raised by hand); a cap given is kept."""
    from talkgate.cli import bench

    p = bench.parser()
    assert bench.config_from(p.parse_args(argv), p).max_in_flight == cap


def test_bench_concurrency_over_a_given_cap_is_refused(capsys):
    from talkgate.cli import bench

    p = bench.parser()
    with pytest.raises(SystemExit):
        bench.config_from(p.parse_args(["--concurrency", "600", "--max-in-flight", "512"]), p)
    assert "--concurrency must be between 1 and --max-in-flight" in capsys.readouterr().err


def test_serve_keep_warm_is_seconds_and_reaches_an_engine_process_only_when_given(capsys):
    """`serve --keep-warm` takes seconds >= 0 (a mistake is refused in words); the engine process's parser takes what
    serve passes on, and leaves the engine's own default where serve passed nothing."""
    from talkgate.processes.engine_process import parser

    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--keep-warm", "-1", "--port", "0"])
    assert exit_.value.code == 2 and "--keep-warm: -1 is out of range" in capsys.readouterr().err
    common = ["--endpoint", "ipc:///tmp/x.ipc", "--model", "m"]
    assert parser().parse_args(common).keep_warm is None
    assert parser().parse_args(common + ["--keep-warm", "0.0"]).keep_warm == 0.0
