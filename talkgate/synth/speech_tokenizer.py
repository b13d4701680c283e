"""What a speech_tokenizer directory holds, read for the codec's two halves.

speech_tokenizer/config.json (model_type qwen3_tts_tokenizer_12hz): `decoder_config`, the decoder's
(synth/codec_decoder.py), and `encoder_config`, the voice-cloning encoder's (synth/codec_encoder.py), each
parsed by its half from what read_codec_config returns. speech_tokenizer/model.safetensors: the decoder's
`decoder.*` and the encoder's `encoder.*` tensors, each half's taken by read_half. Every error names the file
(and the tensor).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

MODEL_TYPE = "qwen3_tts_tokenizer_12hz"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"

_FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
NEEDED_FOR = {"decoder": "decoder: codes to audio", "encoder": "voice-cloning encoder: audio to codes"}


class CodecCheckpointError(ValueError):
    """A speech_tokenizer directory that cannot be loaded; the message names the file and tensor."""


def check_model_type(config: dict, source: str) -> None:
    """A whole speech_tokenizer config (read from `source`) of the 12 Hz tokenizer, or CodecCheckpointError."""
    if config.get("model_type") != MODEL_TYPE:
        raise CodecCheckpointError(f"{source}: model_type {config.get('model_type')!r} is not {MODEL_TYPE!r} "
                                   "(only the 12 Hz speech tokenizer is supported)")


def read_codec_config(path: Path) -> dict:
    """The JSON of a speech_tokenizer's config.json at `path`, for a half's config class to parse."""
    if not path.is_file():
        raise CodecCheckpointError(f"{path}: missing (expected the speech tokenizer's config)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CodecCheckpointError(f"{path}: not valid JSON ({e})") from None


def digest(h, name: str, tensor: torch.Tensor) -> None:
    """Add one tensor as stored (name, dtype, shape, bytes) to the hash `h` (a model's voice_key: loader.py)."""
    h.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
    h.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())


def read_half(root: Path, model: torch.nn.Module, prefix: str, what: str, known: set[str] = frozenset()) -> dict:
    """The tensors of one half of a speech_tokenizer's model.safetensors (decoder. or encoder.): every tensor of
    `model`'s state dict under `prefix`, shape and float dtype checked; tensors under `prefix` that are neither the
    model's nor in `known` are an error (a config that does not fit the file). `what` ("decoder", "encoder")
    names the half in errors."""
    from safetensors import safe_open

    weights = root / WEIGHTS_FILE
    if not weights.is_file():
        raise CodecCheckpointError(f"{weights}: missing (expected the speech tokenizer's weights)")
    expected, state = model.state_dict(), {}
    with safe_open(str(weights), framework="pt", device="cpu") as f:
        present = set(f.keys())
        for name, like in expected.items():
            key = prefix + name
            if key not in present:
                raise CodecCheckpointError(f"{weights}: missing tensor {key!r} (the {NEEDED_FOR[what]})")
            sl = f.get_slice(key)
            shape, kind = list(sl.get_shape()), sl.get_dtype()
            if shape != list(like.shape):
                raise CodecCheckpointError(f"{weights}: tensor {key!r} has shape {shape}, expected {list(like.shape)}")
            if kind not in _FLOAT_DTYPES:
                raise CodecCheckpointError(f"{weights}: tensor {key!r} has dtype {kind}, expected a float type")
            state[name] = f.get_tensor(key)
    unexpected = sorted(k for k in present if k.startswith(prefix) and k[len(prefix):] not in expected
                        and k[len(prefix):] not in known)
    if unexpected:
        raise CodecCheckpointError(f"{weights}: unexpected {what} tensors {unexpected[:5]} ({len(unexpected)}; "
                                   f"is its config right for this file?)")
    return state
