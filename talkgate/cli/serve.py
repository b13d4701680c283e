"""`talkgate serve`: check the arguments, bind the port, then either start the engine processes and gateway
workers under a supervisor (processes/supervisor.py, the default), or with `--workers 0` load the engine in
this process, warm up, serve until SIGINT/SIGTERM, drain.

The port is bound before the model loads, so that a busy port is reported at once; HTTP answers from
the end of the load on (/health 200 "starting", /ready 503 until the warm-up is over). With
--ssl-certfile / --ssl-keyfile (loaded before the port is bound) every route is served over TLS on that
port: https:// and wss://.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import logging
import os
from pathlib import Path

from talkgate.cli import args as cli_args
from talkgate.cli import models_file
from talkgate.cli.args import CommandError
from talkgate.cli.models_file import ModelSpec
from talkgate.processes import bytecode, mps, single
from talkgate.server.listen import listen, tls_context
from talkgate.sessions.limits import Limits, open_connections
from talkgate.system import descriptors
from talkgate.system.childproc import usable_cores
from talkgate.system.warmup_watchdog import DEFAULT_STALL_S

log = logging.getLogger("talkgate.serve")
DEFAULT_PRESET = "mini"
MAX_DEFAULT_WORKERS = 32     # docs/benchmarks.md: 8 workers ran 0.6-0.8 cores each at 512 Opus streams


def default_checkpoint() -> Path:
    """The built-in default: a random-weight `mini` checkpoint, created once and cached."""
    from talkgate.synth.compile_cache import cache_root

    root = cache_root()
    path = root / f"{DEFAULT_PRESET}-custom_voice"
    if not (path / "config.json").exists():
        from talkgate.synth.checkpoint import create_checkpoint     # torch: only to create it

        tmp = path.with_name(path.name + ".partial")
        try:
            root.mkdir(parents=True, exist_ok=True)
            log.info("creating the built-in default checkpoint (%s, random weights) in %s", DEFAULT_PRESET, path)
            create_checkpoint(tmp, preset=DEFAULT_PRESET, variant="custom_voice")
            tmp.rename(path)    # atomic: a half-written default is never picked up
        except OSError as e:
            raise CommandError(f"cannot create the default checkpoint in {root}: {e.strerror}; set TALKGATE_CACHE "
                               "to a writable directory, or pass --model") from None
    return path


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve the WebSocket/HTTP gateway",
        description="Serve every endpoint (native WebSocket, OpenAI HTTP, compatible WebSocket APIs, /health, "
                    "/ready, /metrics, the web page) on one port until SIGTERM or SIGINT (Ctrl-C), which drain: "
                    "new sessions are refused, open contexts finish up to --shutdown-deadline, a second signal "
                    "cuts the drain short (docs/operations.md).")
    p.add_argument("--model", metavar="[NAME=]DIR|ID", action="append", help="checkpoint directory or Hugging Face "
                   f"id (default: a built-in random-weight '{DEFAULT_PRESET}' checkpoint, created once under "
                   "$TALKGATE_CACHE or ~/.cache/talkgate); repeat it to serve several models, each with engine "
                   "processes of its own, the first one for requests that name no model and no voice of another; "
                   "NAME, else the directory's or id's last part, is what requests name it by (docs/operations.md)")
    p.add_argument("--models", metavar="FILE", help="the served models from a file instead of --model: one JSON "
                   "object a line with path (directory or Hugging Face id), name, aliases, gpus, engines, "
                   "max_contexts and memory_share (docs/operations.md)")
    p.add_argument("--host", metavar="ADDRESS", default="127.0.0.1",
                   help="address to listen on (0.0.0.0: every IPv4 interface)")
    p.add_argument("--port", metavar="N", type=cli_args.port, default=8080,
                   help="TCP port; 0 picks a free one (printed at start)")
    p.add_argument("--device", metavar="DEVICE", type=cli_args.device,
                   help="cpu, cuda or cuda:N (default: cuda when a GPU is visible, else cpu)")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                   help="Talker and code predictor dtype (default: bfloat16 on GPU, float32 on CPU)")
    p.add_argument("--decoder-dtype", choices=["float32", "float16", "bfloat16"],
                   help="codec decoder dtype (default: float16 on a GPU where a probe of the checkpoint's decoder at load "
                   "gives >= 30 dB SNR against float32, else float32; float32 for a float32 model and on CPU: "
                   "docs/engine.md)")
    p.add_argument("--gpus", metavar="all|I,J", help="GPUs to serve on, one engine process each (default: all; "
                   "indices as CUDA_VISIBLE_DEVICES shows them)")
    p.add_argument("--engines", metavar="N", type=cli_args.integer(1), default=1, help="engine processes per GPU, "
                   "or on the CPU; several on one GPU (of one model or of several) split its memory: each without "
                   "--max-contexts sizes its slots from 1/N of the GPU for N engine processes on it, or from its "
                   "model's memory_share (--models FILE; docs/operations.md)")
    p.add_argument("--colocate", action="store_true", help="run the engines of the models that share a GPU in one "
                   "engine process (one CUDA context: a model's first frames go ahead of every model's steps, where "
                   "separate processes share the GPU under MPS without priority between them); a process that dies "
                   "then fails the contexts of every model on its GPU (docs/operations.md)")
    p.add_argument("--mps", choices=mps.MODES, default="auto", help="CUDA MPS for a GPU that several "
                   "engine processes share (several models, or --engines above 1), so that their kernels run side "
                   "by side instead of taking turns: auto starts a daemon of talkgate's own for each such GPU where "
                   "nvidia-cuda-mps-control can, else says why and serves without; on refuses to start without; off "
                   "never (docs/operations.md)")
    p.add_argument("--workers", metavar="N", type=cli_args.integer(0), help="gateway worker processes sharing the "
                   "port (default: the cores less one per engine process and one more, 1 to "
                   f"{MAX_DEFAULT_WORKERS}); 0: one process, the engine a thread of it")
    p.add_argument("--max-contexts", metavar="N", type=cli_args.integer(1), help="engine slots of each engine process: "
                   "contexts in flight on it (default: sized from free GPU memory, or from its share of the GPU's "
                   "memory where engine processes share one (--engines), at most 1,024; 16 on CPU)")
    p.add_argument("--max-batch", metavar="N", type=cli_args.integer(1), help="rows one step of an engine process "
                   "takes at most; more contexts with text take turns, earliest deadline first (default: "
                   "--max-contexts when given, else 512 where the engine process has 120 GiB of GPU memory or more "
                   "(the GPU's, or its share of it: an H200 alone), 256 below; docs/engine.md)")
    p.add_argument("--seed", metavar="N", type=cli_args.seed, help="sampling seed of contexts whose request sets "
                   "none, so that the same text and settings give the same audio (default: a fresh random seed each)")
    add_untrained_length(p)
    p.add_argument("--api-key", metavar="KEY", action="append", default=[], help="require this API key "
                   "(repeatable; also TALKGATE_API_KEYS=k1,k2); default: no key needed")
    p.add_argument("--keys", metavar="FILE", help="keys file: JSON lines of hashed keys, each with an id, a tenant, "
                   "a role (admin|user) and limits; reloaded on SIGHUP and when it changes (docs/operations.md)")
    p.add_argument("--audit-log", metavar="PATH", help="append audit records (voices created and deleted, keys "
                   "refused, keys reloaded) to this JSON-lines file (docs/operations.md)")
    p.add_argument("--usage-log", metavar="PATH", help="append one usage record per finished context (key, model, "
                   "characters, audio seconds delivered) to this JSON-lines file; GET /v1/usage totals it "
                   "(docs/operations.md)")
    p.add_argument("--admin-without-key", action="store_true", help="answer the admin endpoints (POST /admin/drain) "
                   "without an API key; without --api-key they are refused otherwise (docs/operations.md)")
    p.add_argument("--allow-origin", metavar="ORIGIN", action="append", default=[],
                   help="allowed browser Origin (repeatable); default: any")
    d = Limits()
    p.add_argument("--max-message-bytes", metavar="N", type=cli_args.integer(1), default=d.max_message_bytes,
                   help="largest client message, in bytes")
    p.add_argument("--max-messages-per-s", metavar="N", type=cli_args.positive_number, default=d.max_messages_per_s,
                   help="client messages a second per connection, on average (bursts of 5 s worth); past it the "
                   "connection closes with 1008")
    p.add_argument("--max-text-chars", metavar="N", type=cli_args.integer(1), default=d.max_text_chars,
                   help="text of one context, in characters")
    p.add_argument("--max-contexts-per-connection", metavar="N", type=cli_args.integer(1),
                   default=d.max_contexts_per_connection, help="contexts in flight on one connection")
    p.add_argument("--max-connections", metavar="N", type=cli_args.integer(1), default=d.max_connections,
                   help="open WebSocket connections; more are refused (close 1013); each worker takes at most 1.5x "
                   "an even share of them. Connections of every kind past twice that are answered HTTP 503 "
                   "too_many_connections")
    p.add_argument("--idle-timeout", metavar="SECONDS", type=cli_args.positive_seconds, default=d.idle_timeout_s,
                   help="seconds without a client message or audio taken by the client before a connection is "
                   "closed, contexts in flight or not; an HTTP connection is closed after as long without a request, "
                   "and a request body not sent within it is answered 408")
    p.add_argument("--max-backlog-ms", metavar="MS", type=cli_args.integer(1), default=d.max_backlog_ms,
                   help="audio of one context left unread, in ms, by a client that is behind real time before the "
                   "context is cancelled as a slow consumer")
    p.add_argument("--stream-lead", metavar="SECONDS", type=cli_args.seconds, default=d.stream_lead_s or 0.0,
                   help="a WebSocket client plays the audio as it comes: make each of its contexts at most this many "
                   "seconds of audio ahead of its player (2 s is above the longest pauses a gateway worker was seen to "
                   "make under load), so that the GPU and the workers spend their time on the contexts that need it "
                   "(1,024 streams on one H200: no underrun, half the CPU); 0: every context as fast as the engine "
                   "can. HTTP requests always run as fast as it can (docs/protocol.md)")
    p.add_argument("--keep-warm", metavar="SECONDS", type=cli_args.seconds,
                   help="an idle engine touches its GPU this often (one small operation), so that the first audio "
                   "after a quiet spell takes a warm launch path; 0: never (default: 0.02, and never where engine "
                   "processes share a GPU; docs/engine.md)")
    p.add_argument("--ssl-certfile", metavar="FILE", help="PEM certificate (chain) to serve https:// and wss:// on "
                   "the same port and routes; needs --ssl-keyfile")
    p.add_argument("--ssl-keyfile", metavar="FILE", help="PEM private key of --ssl-certfile")
    p.add_argument("--voice-map", metavar="FILE", help="JSON file mapping the compatible APIs' voice ids to "
                   "talkgate voices (docs/compat.md); default: the built-in map")
    p.add_argument("--voice-store", metavar="DIR", help="directory of the stored (cloned) voices, which several "
                   "servers may share (docs/voices.md); default: voices/ in the talkgate data directory "
                   "($TALKGATE_DATA, else ~/.local/share/talkgate)")
    p.add_argument("--trace-latency", metavar="PATH", help="append one JSON line per request to PATH: the time of "
                   "each stage from the request read to its first audio byte written, in the worker and the engine "
                   "(python -m bench.latency_trace PATH summarizes it; docs/operations.md)")
    p.add_argument("--shutdown-deadline", metavar="SECONDS", type=cli_args.seconds, default=10.0,
                   help="seconds open contexts may finish once a drain begins (SIGTERM, SIGINT, POST /admin/drain); "
                   "then their sockets close with 1001")
    p.add_argument("--warmup-stall", metavar="SECONDS", type=cli_args.positive_seconds, default=DEFAULT_STALL_S,
                   help="an engine whose warm-up makes no progress for this long (a hung compile) exits and is "
                   "started again (with --workers 0 the server exits, status 75)")
    p.set_defaults(func=run)


def add_untrained_length(p) -> None:
    """--untrained-length (serve, synthesize): how an untrained checkpoint's utterances end."""
    p.add_argument("--untrained-length", choices=["text-rule", "runaway"], default="text-rule",
                   help="random-weight checkpoints never sample end of speech: text-rule ends an utterance where "
                   "the text-length rule puts it (reason length_rule), runaway lets it run to the runaway guard "
                   "(4x that, reason budget), as a trained model that never ended would; trained checkpoints "
                   "end by the model either way")


def run(args: argparse.Namespace) -> int:
    from talkgate.sessions.voices import VoiceMap

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    bytecode.use()                      # before anything imports torch, here or in the processes started
    # everything a user can get wrong is checked before the model loads, the cheap checks first
    if args.voice_map and not Path(args.voice_map).is_file():
        raise CommandError(f"--voice-map {args.voice_map}: no such file")
    try:
        VoiceMap.load(args.voice_map)
    except ValueError as e:
        raise CommandError(str(e)) from None
    if args.voice_store:                # one given must be usable; the default is made on the first upload
        from talkgate.server.voice_store import StoreError, VoiceStore
        try:
            VoiceStore(args.voice_store).open()
        except StoreError as e:
            # a wrong path fails start-up; a disk fault of the right one does not: the stored voices are still
            # served, uploads are answered voice_store_unavailable until the disk takes writes again
            if not e.disk_fault:
                raise CommandError(f"--voice-store: {e.message}") from None
            log.warning("--voice-store: %s: starting anyway (stored voices are served, new ones refused)", e.message)
    if args.keys:
        from talkgate.server.keys import KeysError, KeysFile
        try:
            KeysFile(args.keys)
        except KeysError as e:
            raise CommandError(str(e)) from None
        if args.api_key:
            raise CommandError("--api-key and --keys: give the keys in one place (the keys file)")
    if args.usage_log:
        from talkgate.server.usage import UsageLog
        try:
            UsageLog(args.usage_log).close()
        except OSError as e:
            raise CommandError(f"--usage-log {args.usage_log}: {e.strerror or e}") from None
    if args.audit_log:
        from talkgate.server.audit import AuditLog
        try:
            AuditLog(args.audit_log).close()
        except OSError as e:
            raise CommandError(f"--audit-log {args.audit_log}: {e.strerror or e}") from None
    tls = tls_context(args.ssl_certfile, args.ssl_keyfile)
    if args.trace_latency:
        try:
            with open(args.trace_latency, "a"):
                pass
        except OSError as e:
            raise CommandError(f"--trace-latency {args.trace_latency}: cannot append to it ({e.strerror})") from None
    specs = served_specs(args.model, args.models)
    if args.workers != 0:
        return run_supervised(args, specs)
    # one process runs one engine thread: several models (each an engine of its own) need engine processes
    if len(specs) > 1:
        names = ", ".join(spec.name for spec in specs)
        raise CommandError(f"--workers 0 serves one model; {len(specs)} are given ({names}): several models need "
                           "engine processes, leave out --workers 0")
    if specs[0].aliases or specs[0].gpus or specs[0].engines or specs[0].memory_share:
        raise CommandError(f"--models {args.models}: aliases, gpus, engines and memory_share need engine processes: "
                           "leave out --workers 0")
    models = [(specs[0].name, specs[0].path)]
    max_contexts = specs[0].max_contexts or args.max_contexts
    descriptors.reserve(open_connections(args.max_connections)[1] + descriptors.SPARE)  # before the engine's threads
    sockets = listen(args.host, args.port)
    try:
        device = cli_args.check_device(args.device)
        if args.model or args.models:
            from talkgate.synth.checkpoint_dir import resolve_path
            resolve_path(models[0][1])                  # CheckpointError: no such directory, not reachable, ...
        engine = single.load_engine(models[0][1] if args.model or args.models else str(default_checkpoint()), device,
                                    args.dtype, args.decoder_dtype, max_contexts, args.max_batch, args.seed,
                                    args.untrained_length)
        if args.keep_warm is not None:
            engine.set_keep_warm(args.keep_warm)
        config = server_config(args)
        host = f"[{args.host}]" if ":" in args.host else args.host
        url = f"{'https' if tls else 'http'}://{host}:{sockets[0].getsockname()[1]}"
        try:
            return asyncio.run(single.serve(engine, config, sockets, url, tls, args.warmup_stall))
        finally:
            engine.stop()
    finally:
        for s in sockets:
            s.close()


def server_config(args: argparse.Namespace):
    from talkgate.server.gateway import ServerConfig

    keys = tuple(args.api_key) + tuple(k for k in os.environ.get("TALKGATE_API_KEYS", "").split(",") if k)
    limits = Limits(max_message_bytes=args.max_message_bytes, max_messages_per_s=args.max_messages_per_s,
                    max_text_chars=args.max_text_chars, max_contexts_per_connection=args.max_contexts_per_connection,
                    max_connections=args.max_connections, idle_timeout_s=args.idle_timeout,
                    max_backlog_ms=args.max_backlog_ms, stream_lead_s=args.stream_lead or None)
    return ServerConfig(limits=limits, api_keys=keys, allowed_origins=tuple(args.allow_origin),
                        shutdown_deadline_s=args.shutdown_deadline, voice_map=args.voice_map,
                        voice_store=args.voice_store, admin_without_key=args.admin_without_key,
                        ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile, keys_file=args.keys,
                        audit_log=args.audit_log, usage_log=args.usage_log and os.path.abspath(args.usage_log),
                        trace_latency=args.trace_latency and os.path.abspath(args.trace_latency))


def default_workers(engines: int, cores: int | None = None) -> int:
    """Worker processes beside `engines` engine processes on `cores` cores: a core per engine process (its
    step loop) and one for the rest of the machine, the others for workers, 1 to MAX_DEFAULT_WORKERS."""
    cores = cores or usable_cores()
    return max(1, min(MAX_DEFAULT_WORKERS, cores - engines - 1))


def gpu_indices(text: str | None, count: int) -> list[int]:
    """--gpus: 'all' (or unset) or indices like 0,1 of the `count` visible GPUs."""
    if text in (None, "all"):
        return list(range(count))
    try:
        gpus = [int(g) for g in text.split(",")]
    except ValueError:
        raise CommandError(f"--gpus {text}: give 'all' or GPU indices like 0,1") from None
    if any(not 0 <= g < count for g in gpus) or len(set(gpus)) != len(gpus):
        raise CommandError(f"--gpus {text}: this machine shows {count} GPU(s), 0 to {count - 1}; each once")
    return gpus


def served_models(specs: list[str] | None) -> list[tuple[str, str]]:
    """--model [NAME=]DIR|ID, given any number of times -> [(name, checkpoint)], the default first; none given: the
    built-in default (its checkpoint is made later, only where it is used)."""
    from talkgate.sessions.models import MODEL_NAME, model_name

    models = []
    for spec in specs or [""]:
        name, sep, path = spec.partition("=")
        if not sep or "/" in name:              # a path or id holding '=' further on is a path
            name, path = model_name(spec) if spec else "default", spec
        if not MODEL_NAME.match(name):
            raise CommandError(f"--model {spec}: a model's name is letters, digits, '.', '_' and '-' (give NAME=DIR)")
        if any(name.lower() == n.lower() for n, _ in models):
            raise CommandError(f"--model {spec}: two models named {name!r}; name them apart with NAME=DIR")
        models.append((name, path))
    return models


def served_specs(model: list[str] | None, models: str | None) -> list[ModelSpec]:
    """The served models of --model (any number of times) or --models FILE, not both; neither: the built-in
    default (serve's and warmup's)."""
    if models and model:
        raise CommandError("--model and --models: give the models in one place (the models file)")
    return models_file.read(models) if models else [ModelSpec(*m) for m in served_models(model)]


def slots_args(spec: ModelSpec) -> list[str]:
    """A model's own slot flags (after the server's: the last --max-contexts wins)."""
    return ["--max-contexts", str(spec.max_contexts)] if spec.max_contexts else []


def engine_plan(specs: list[ModelSpec], device: str, gpus: str | None, engines: int, max_contexts: int | None,
                ids: list[str] = ()) -> list[dict]:
    """The engine processes to start (processes/supervisor.py's Plan.engines): each model's on its GPUs (its own or
    `gpus`, as --gpus; the visible GPUs' CUDA_VISIBLE_DEVICES ids are `ids`), `engines` (or its own) per GPU, on the
    CPU with device "cpu". Every engine process on a GPU has a share of its memory, its model's memory_share, else an
    even split of what the stated shares there leave (1 / N where none states one); the stated ones add up to at most
    1, and below 1 where some state none. An engine process of a model without max_contexts (its own or
    `max_contexts`) sizes its slots from its share ("memory_share") where the GPU has several engine processes or the
    model states one; else from the free memory (docs/operations.md "Several models")."""
    if device == "cpu":
        if gpus is not None or any(spec.gpus for spec in specs):
            raise CommandError("--gpus (or a model's gpus) needs a GPU (--device cuda)")
        return [{"device": "cpu", "cuda_visible": None, "model": m, "args": slots_args(spec)}
                for m, spec in enumerate(specs) for _ in range(spec.engines or engines)]
    plan = []
    for m, spec in enumerate(specs):
        which = spec.gpus or gpus
        indices = gpu_indices(which, len(ids)) if which or device == "cuda" else [int(device.split(":")[1])]
        plan += [{"device": "cuda", "cuda_visible": ids[g], "model": m, "args": slots_args(spec)}
                 for g in indices for _ in range(spec.engines or engines)]
    for gpu in dict.fromkeys(e["cuda_visible"] for e in plan):
        on_it = [e for e in plan if e["cuda_visible"] == gpu]
        counts = collections.Counter(e["model"] for e in on_it)       # engine processes of each model on it
        stated = sum(n * (specs[m].memory_share or 0.0) for m, n in counts.items())
        unstated = sum(n for m, n in counts.items() if not specs[m].memory_share)
        if stated > 1 + 1e-9 or (unstated and stated >= 1 - 1e-9):      # 3 x 0.3333333 fits, rounded or not
            shares = ", ".join(f"{specs[m].name} {n} x {specs[m].memory_share:.3g}" if specs[m].memory_share
                               else f"{specs[m].name} {n} x unstated" for m, n in counts.items())
            whole = "add up to more than the GPU" if stated > 1 + 1e-9 else "leave nothing for those without one"
            raise CommandError(f"GPU {gpu}: the memory shares of its engine processes ({shares}) {whole}: lower "
                               "the models' memory_share (docs/operations.md)")
        # what the stated shares leave, split evenly among the engine processes that state none
        share = {m: specs[m].memory_share or (1 - stated) / unstated for m in counts}
        for e in on_it:
            spec = specs[e["model"]]
            if (len(on_it) > 1 or spec.memory_share) and not (spec.max_contexts or max_contexts):
                e["memory_share"] = share[e["model"]]
    return plan


def run_supervised(args: argparse.Namespace, specs: list[ModelSpec]) -> int:
    """Engine processes and gateway workers under the supervisor (processes/supervisor.py): each model's on its GPUs
    (its own or --gpus), --engines (or its own) per GPU, with its max_contexts (or --max-contexts) slots each."""
    from talkgate.processes.supervisor import Plan, Supervisor

    # a port someone holds, with SO_REUSEPORT or not, is refused by a bind without it; the port is then held (bound,
    # not listening until the first worker listens) and its sockets handed to every worker (server/listen.py shared)
    reserved = listen(args.host, args.port, backlog=None)
    try:
        device = cli_args.check_device(args.device)
        if args.model or args.models:
            from talkgate.synth.checkpoint_dir import resolve_path
            for spec in specs:
                resolve_path(spec.path)
        else:
            from talkgate.sessions.models import model_name
            path = str(default_checkpoint())
            specs = [ModelSpec(model_name(path), path)]
        models = [(spec.name, spec.path) for spec in specs]
        ids = []
        if device != "cpu":
            count = cli_args.cuda_device_count()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")      # indices are of the visible GPUs
            ids = (visible.split(",") if visible else [str(g) for g in range(count)])[:count]
        engines = engine_plan(specs, device, args.gpus, args.engines, args.max_contexts, ids)
        engine_args = ["--untrained-length", args.untrained_length, "--warmup-stall", str(args.warmup_stall)]
        for flag, value in (("--dtype", args.dtype), ("--decoder-dtype", args.decoder_dtype),
                            ("--max-contexts", args.max_contexts), ("--max-batch", args.max_batch),
                            ("--seed", args.seed), ("--keep-warm", args.keep_warm)):
            if value is not None:
                engine_args += [flag, str(value)]
        workers = args.workers if args.workers is not None else default_workers(len(engines))
        config = server_config(args)
        plan = Plan(host=args.host, port=reserved[0].getsockname()[1], sockets=reserved, models=models, engines=engines,
                    workers=workers, mps=args.mps, engine_args=engine_args, server=dataclasses.asdict(config),
                    colocate=args.colocate,
                    aliases={spec.name: list(spec.aliases) for spec in specs if spec.aliases})
        try:
            return Supervisor(plan).run()
        except mps.MpsError as e:
            raise CommandError(f"--mps on: {e}") from None
    finally:
        for s in reserved:
            s.close()
