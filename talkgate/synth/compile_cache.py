"""Where the compiled step's artifacts live, so that a restart reuses them instead of compiling again.

    folder = compile_cache.use(compile_cache.cache_key(tts, device, decoder_dtype))

torch.compile (Inductor's FX graph and AOTAutograd caches, the Triton kernels it generates and their tuned
launch settings) and Triton (synth/persistent.py, attention.py, sample_kernel.py, window_attention.py: one
binary per specialization) cache on disk, by default under /tmp and ~/.triton, which a new machine or
container does not have. `use` points both at one folder under the talkgate cache directory
(TALKGATE_CACHE, else ~/.cache/talkgate), named by what makes a binary reusable: the GPU (name, compute
capability), the library versions (torch, CUDA, cuDNN, Triton, Python) and the model's shape and dtypes. The
caches inside are content-addressed (a changed kernel or graph gets a new entry), so talkgate's own
version is not part of the name. The compiled functions themselves, traced, are kept in its FUNCTIONS
subfolder (synth/precompiled.py, per version of the model code), so that a start does not trace them again.
`talkgate warmup` fills a folder ahead of time (e.g. when an image is built). TORCHINDUCTOR_CACHE_DIR or
TRITON_CACHE_DIR set by the operator win. What is not kept: cuDNN's algorithm search (per process).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
from pathlib import Path

log = logging.getLogger("talkgate.compile_cache")

ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
FUNCTIONS = "functions"          # subfolder: the compiled functions with their traces (synth/precompiled.py)
OPERATOR = {var: os.environ.get(var) for var in ENV}    # set before talkgate ran: kept


def cache_root() -> Path:
    """The talkgate cache directory: TALKGATE_CACHE, else ~/.cache/talkgate."""
    return Path(os.environ.get("TALKGATE_CACHE") or Path.home() / ".cache" / "talkgate")


def cache_key(gpu: dict, versions: dict, shape: dict) -> str:
    """Folder name: readable GPU and torch version, then a digest of everything that decides the binaries."""
    digest = hashlib.sha256(json.dumps([gpu, versions, shape], sort_keys=True).encode()).hexdigest()[:16]
    name = re.sub(r"[^a-z0-9]+", "-", f"{gpu.get('name', 'gpu')} sm{gpu.get('capability', '')}".lower()).strip("-")
    return f"{name}-torch{versions.get('torch', '')}-{digest}"


def describe(config, root: Path, device, dtype, decoder_dtype) -> tuple[dict, dict, dict]:
    """(gpu, versions, shape) of a checkpoint (its TTSConfig and folder) in `dtype` on a CUDA device: what
    cache_key names."""
    import torch
    props = torch.cuda.get_device_properties(device)
    gpu = {"name": props.name, "capability": f"{props.major}{props.minor}", "sms": props.multi_processor_count}
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                "python": platform.python_version()}
    try:
        import triton
        versions["triton"] = triton.__version__
    except ImportError:
        versions["triton"] = None
    return gpu, versions, shape_of(config, root, dtype, decoder_dtype)


# a CustomVoice checkpoint's speaker names and ids: prompt tokens, nothing compiled depends on them
PROMPT_ONLY = ("spk_id", "spk_is_dialect")


def shape_of(config, root: Path, dtype, decoder_dtype) -> dict:
    """What of a checkpoint decides the compiled binaries: its Talker's and speech tokenizer's configs but the
    speaker tables, and the dtypes. The CustomVoice, Base and VoiceDesign checkpoints of one size share it, so that
    their engine processes on one GPU share one cache and one set of compile helpers (parallel_compile.py)."""
    talker = config.raw.get("talker_config")
    if isinstance(talker, dict):
        talker = {k: v for k, v in talker.items() if k not in PROMPT_ONLY}
    return {"talker": talker, "speech_tokenizer": _decoder_config(root), "dtype": str(dtype),
            "decoder_dtype": str(decoder_dtype)}


def _decoder_config(root: Path):
    try:
        return json.loads((root / "speech_tokenizer" / "config.json").read_text())
    except (OSError, ValueError):
        return None


def use(key: str, about: dict | None = None) -> Path:
    """Point Inductor's and Triton's caches at cache_root()/compile/<key> (unless the operator set them);
    the compiled functions and Triton kernels read these when they first compile. Returns the folder."""
    folder = cache_root() / "compile" / key
    folder.mkdir(parents=True, exist_ok=True)
    if about is not None and not (folder / "key.json").exists():
        (folder / "key.json").write_text(json.dumps(about, indent=1, default=str))
    for var, sub in zip(ENV, ("inductor", "triton")):
        if OPERATOR[var]:
            log.info("%s=%s set by the environment: kept", var, OPERATOR[var])
            continue
        os.environ[var] = str(folder / sub)
    return folder
