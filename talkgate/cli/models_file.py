"""`talkgate serve --models FILE`: the served models, one JSON object a line (docs/operations.md "Several models").

    {"name": "cv", "path": "/models/Qwen3-TTS-12Hz-1.7B-CustomVoice", "aliases": ["tts-1"], "max_contexts": 128}
    {"name": "base", "path": "Qwen/Qwen3-TTS-12Hz-1.7B-Base", "gpus": [0], "max_contexts": 64}

Keys: `path` (required: a checkpoint directory or a Hugging Face id, as --model takes), `name` (default: the
path's last part), `aliases` (other names requests may give it, a vendor's model name too: `tts-1` then names this
model instead of the default), `gpus` (indices of the visible GPUs, or "all"; default --gpus), `engines` (engine
processes per GPU; default --engines), `max_contexts` (slots of each of its engine processes; default
--max-contexts), `memory_share` (the fraction of a GPU's memory each of its engine processes sizes its slots from,
0 < x <= 1; default an even split of what the stated shares leave: cli/serve.py's engine_plan). Blank lines
and lines starting with # are skipped; the first model is the default. Every mistake is a CommandError naming the
file and line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from talkgate.cli.args import CommandError

KEYS = ("name", "path", "aliases", "gpus", "engines", "max_contexts", "memory_share")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: str
    aliases: tuple[str, ...] = ()
    gpus: str | None = None                # as --gpus takes it: "all" or "0,1"; None: --gpus
    engines: int | None = None             # None: --engines
    max_contexts: int | None = None        # None: --max-contexts
    memory_share: float | None = None      # None: an even split of what the stated shares leave


def read(path: str) -> list[ModelSpec]:
    from talkgate.sessions.models import MODEL_NAME, model_name

    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise CommandError(f"--models {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise CommandError(f"--models {path}: not UTF-8 text") from None
    specs: list[ModelSpec] = []
    taken: dict[str, int] = {}                      # every name and alias, lower case -> its line
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue

        def bad(message: str) -> CommandError:
            return CommandError(f"--models {path} line {n}: {message}")

        try:
            d = json.loads(line)
        except ValueError as e:
            raise bad(f"not a JSON object ({e})") from None
        if not isinstance(d, dict):
            raise bad("not a JSON object")
        unknown = [k for k in d if k not in KEYS]
        if unknown:
            raise bad(f"unknown key {unknown[0]!r}; the keys are {', '.join(KEYS)}")
        checkpoint = d.get("path")
        if not isinstance(checkpoint, str) or not checkpoint.strip():
            raise bad("'path' is required: a checkpoint directory or a Hugging Face id")
        name = d.get("name", model_name(checkpoint))
        aliases = d.get("aliases", [])
        if not isinstance(aliases, list):
            raise bad("'aliases' is a list of names")
        for label in (name, *aliases):
            if not isinstance(label, str) or not MODEL_NAME.match(label):
                raise bad(f"{label!r}: a model's name or alias is letters, digits, '.', '_' and '-' (1-64)")
            if label.lower() in taken:
                raise bad(f"the name {label!r} is taken (line {taken[label.lower()]})")
            taken[label.lower()] = n
        gpus = d.get("gpus")
        if gpus is not None:
            if gpus == "all":
                pass
            elif isinstance(gpus, list) and gpus and all(isinstance(g, int) and not isinstance(g, bool) and g >= 0
                                                        for g in gpus):
                gpus = ",".join(str(g) for g in gpus)
            else:
                raise bad("'gpus' is \"all\" or a list of GPU indices like [0, 1]")
        counts = {}
        for key in ("engines", "max_contexts"):
            value = d.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise bad(f"'{key}' is a whole number, at least 1")
            counts[key] = value
        share = d.get("memory_share")
        if share is not None and (not isinstance(share, (int, float)) or isinstance(share, bool)
                                  or not 0 < share <= 1):
            raise bad("'memory_share' is a fraction of a GPU's memory, above 0 and at most 1")
        specs.append(ModelSpec(name, checkpoint, tuple(aliases), gpus, **counts,
                               memory_share=None if share is None else float(share)))
    if not specs:
        raise CommandError(f"--models {path}: no model in it (one JSON object a line)")
    return specs
