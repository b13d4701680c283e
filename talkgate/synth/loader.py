"""Load a Qwen3-TTS 12 Hz checkpoint (official layout, local directory or Hugging Face id) into talkgate.

    tts = load_tts("path/or/Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", device="cuda", dtype=torch.bfloat16)
    tts.talker, tts.code_predictor, tts.codec_decoder      # synth.model / synth.codec_decoder modules
    tts.speaker_encoder, tts.codec_encoder                 # Base only (else None): voice cloning (synth/voice.py)
    tts.config, tts.generation_config, tts.tokenizer       # synth.config / synth.tokenizer
    tts.prompts                                            # synth.prompt.Prompts (voice/language, prefill)
    tts.info                                               # synth.api.ModelInfo (untrained flag...)

Layout: config.json (model_type qwen3_tts), generation_config.json, model.safetensors or
model.safetensors.index.json + shards, tokenizer files, speech_tokenizer/{config.json,
model.safetensors}. Tensors are matched by their official names; a missing, unexpected, misshaped
or non-float tensor is an error naming the file and the tensor, raised before any module is
returned. A Base checkpoint's speaker encoder (`speaker_encoder.*`, synth/speaker_encoder.py) and the
speech tokenizer's encoder (`encoder.*` in speech_tokenizer/model.safetensors, synth/codec_encoder.py) are
loaded with it (in `dtype` and `codec_encoder_dtype`); other variants cannot clone and skip both.

The modules are built on the meta device and the safetensors are memory-mapped and assigned
(load_state_dict(assign=True)), so a 1.7B checkpoint does not need twice its size in RAM.
The Talker's KV cache is not allocated here: call tts.talker.setup_cache(...).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from talkgate.synth.api import ModelInfo, end_of_speech
from talkgate.synth.checkpoint_dir import CheckpointError, resolve_path
from talkgate.synth.codec_decoder import load_codec_decoder
from talkgate.synth.codec_encoder import CodecEncoder, load_codec_encoder
from talkgate.synth.config import ConfigError, GenerationConfig, TTSConfig
from talkgate.synth.model import CodePredictor, Talker, fuse_projections
from talkgate.synth.prompt import Prompts, takes_instructions
from talkgate.synth.speaker_encoder import SpeakerEncoder
from talkgate.synth.speech_tokenizer import CodecCheckpointError, digest
from talkgate.synth.tokenizer import QwenTokenizer

_FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
UNUSED_PREFIXES = ("speaker_encoder.",)


@dataclass
class LoadedTTS:
    talker: Talker
    code_predictor: CodePredictor
    codec_decoder: torch.nn.Module
    config: TTSConfig
    generation_config: GenerationConfig
    tokenizer: QwenTokenizer
    prompts: Prompts
    info: ModelInfo
    path: Path
    speaker_encoder: SpeakerEncoder | None = None     # Base checkpoints
    codec_encoder: CodecEncoder | None = None         # Base checkpoints


def official_names(talker: Talker, predictor: CodePredictor,
                   speaker_encoder: SpeakerEncoder | None = None) -> dict[str, tuple[str, str]]:
    """official tensor name -> (module, parameter name) for every parameter of the modules."""
    names = {}
    for module_name, module in (("talker", talker), ("code_predictor", predictor), ("speaker_encoder", speaker_encoder)):
        for name, _ in (module.named_parameters() if module is not None else ()):
            if module_name == "talker":
                top = name.split(".")[0] in ("text_projection", "codec_head")
                official = ("talker." if top else "talker.model.") + name
            elif module_name == "code_predictor":
                top = name.split(".")[0] in ("lm_head", "small_to_mtp_projection")
                official = ("talker.code_predictor." if top else "talker.code_predictor.model.") + name
            else:
                official = "speaker_encoder." + name
            names[official] = (module_name, name)
    return names


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def weight_files(root: Path) -> dict[str, Path]:
    """tensor name -> safetensors file, from model.safetensors.index.json or model.safetensors."""
    from safetensors import safe_open

    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no weight_map")
        files = {name: root / file for name, file in weight_map.items()}
        for file in set(files.values()):
            if not file.is_file():
                raise CheckpointError(f"{file}: missing (listed in {index.name})")
        return files
    single = root / "model.safetensors"
    if not single.is_file():
        raise CheckpointError(f"{single}: missing (expected model.safetensors or model.safetensors.index.json)")
    with safe_open(str(single), framework="pt") as f:
        return {name: single for name in f.keys()}


def _load_lm(root: Path, config: TTSConfig, device, dtype, weights: bool = True
             ) -> tuple[Talker, CodePredictor, SpeakerEncoder | None, str]:
    """-> the modules and the speaker encoder's weights' digest (as stored; "" without one)."""
    from safetensors import safe_open

    with torch.device("meta"):
        talker = Talker(config.talker)
        predictor = CodePredictor(config.talker.predictor, config.talker.dims.hidden_size)
        speaker = SpeakerEncoder(config.speaker_encoder) if config.speaker_encoder is not None else None
    expected = official_names(talker, predictor, speaker)
    files = weight_files(root)
    missing = [name for name in expected if name not in files]
    if missing:
        where = root / ("model.safetensors.index.json" if (root / "model.safetensors.index.json").is_file()
                        else "model.safetensors")
        raise CheckpointError(f"{where}: missing tensor {missing[0]!r} ({len(missing)} missing"
                              + ("; a Base checkpoint's speaker encoder" if missing[0].startswith("speaker_encoder.")
                                 else "") + ")")
    unused = UNUSED_PREFIXES if speaker is None else ()
    unexpected = [name for name in files if name not in expected and not name.startswith(unused)]
    if unexpected:
        raise CheckpointError(f"{files[unexpected[0]]}: unexpected tensor {unexpected[0]!r} ({len(unexpected)} "
                              "unexpected; does config.json match the weights?)")
    modules = {"talker": talker, "code_predictor": predictor}
    if speaker is not None:
        modules["speaker_encoder"] = speaker
    states: dict[str, dict[str, torch.Tensor]] = {name: {} for name in modules}
    by_file: dict[Path, list[str]] = {}
    for name in expected:
        by_file.setdefault(files[name], []).append(name)
    speaker_digest = hashlib.blake2b(digest_size=16)
    for file, names in by_file.items():
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in sorted(names):
                module_name, param = expected[name]
                like = modules[module_name].get_parameter(param)
                sl = f.get_slice(name)
                shape, kind = tuple(sl.get_shape()), sl.get_dtype()
                if shape != tuple(like.shape):
                    raise CheckpointError(f"{file}: tensor {name!r} has shape {list(shape)}, "
                                          f"expected {list(like.shape)} from config.json")
                if kind not in _FLOAT_DTYPES:
                    raise CheckpointError(f"{file}: tensor {name!r} has dtype {kind}, expected a float type")
                if not weights:
                    states[module_name][param] = torch.zeros(shape, device=device, dtype=dtype)
                    continue
                tensor = f.get_tensor(name)
                if module_name == "speaker_encoder":
                    digest(speaker_digest, name, tensor)
                states[module_name][param] = tensor.to(device=device, dtype=dtype)
    for module_name, module in modules.items():
        module.load_state_dict(states[module_name], strict=True, assign=True)
        module.eval().requires_grad_(False)
    fuse_projections(talker, predictor)
    predictor.setup(device)
    return talker, predictor, speaker, speaker_digest.hexdigest() if speaker is not None else ""


def voice_key(speaker_digest: str, codec_encoder: CodecEncoder | None) -> str:
    """A Base model's voice_key (synth/api.py ModelInfo.speaks): what its voice prompts are made with, the speaker
    encoder (the x-vector) and the speech tokenizer's encoder (the reference codes), by their weights as stored
    (so one checkpoint has one key on every device and dtype). "" for a model that does not clone."""
    if not speaker_digest or codec_encoder is None:
        return ""
    return hashlib.blake2b(f"{speaker_digest} {codec_encoder.weights_digest}".encode(), digest_size=12).hexdigest()


def read_config(root: Path) -> TTSConfig:
    """config.json of a checkpoint directory, parsed (no weights are read: checks before a load use it)."""
    try:
        return TTSConfig.parse(_read_json(root / "config.json"))
    except ConfigError as e:
        raise CheckpointError(f"{root / 'config.json'}: {e}") from None


def load_tts(path_or_id: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
             decoder_dtype: torch.dtype = torch.float32, with_decoder: bool = True,
             untrained_length: str = "text-rule", weights: bool = True,
             codec_encoder_dtype: torch.dtype | None = None) -> LoadedTTS:
    """Load everything; the codec decoder runs in decoder_dtype (float32 by default, as the reference; the engine's
    load_runner chooses it: synth/decoder_precision.py), a Base checkpoint's codec encoder in codec_encoder_dtype
    (None: decoder_dtype).
    untrained_length: how an untrained checkpoint's utterances end (synth.api.end_of_speech), in info.
    weights False: the Talker's and code predictor's tensors are zeros of their checked shapes, not read (what
    a compile helper needs: synth/parallel_compile.py)."""
    end_of_speech(False, untrained_length)                  # a bad choice fails before the load
    root = resolve_path(path_or_id)
    device = torch.device(device)
    config = read_config(root)
    generation = GenerationConfig.parse(_read_json(root / "generation_config.json"))
    try:
        tokenizer = QwenTokenizer.from_dir(root)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    for token_id in (config.tts_pad, config.tts_bos, config.tts_eos, config.im_start, config.im_end):
        if token_id >= config.talker.text_vocab_size:
            raise CheckpointError(f"{root / 'config.json'}: token id {token_id} >= text_vocab_size")
    talker, predictor, speaker, speaker_digest = _load_lm(root, config, device, dtype, weights)
    decoder = codec_encoder = None
    st = root / "speech_tokenizer"
    if (with_decoder or speaker is not None) and not st.is_dir():
        raise CheckpointError(f"{st}: missing (the speech tokenizer's directory: codec decoder and encoder)")
    try:
        if with_decoder:
            decoder = load_codec_decoder(st, device, decoder_dtype)
        if speaker is not None:
            codec_encoder = load_codec_encoder(st, device, codec_encoder_dtype or decoder_dtype)
    except CodecCheckpointError as e:
        raise CheckpointError(str(e)) from None
    prompts = Prompts(config, tokenizer, talker, predictor)
    info = ModelInfo(name=str(path_or_id), model_type=config.model_type,
                     size=str(config.talkgate.get("preset") or config.model_size), untrained=config.untrained,
                     voices=prompts.voices, languages=prompts.languages, device=str(device),
                     dtype=str(dtype).removeprefix("torch."), decoder_dtype=str(decoder_dtype).removeprefix("torch."),
                     end_of_speech=end_of_speech(config.untrained, untrained_length),
                     voice_key=voice_key(speaker_digest, codec_encoder),
                     takes_instructions=takes_instructions(config))
    return LoadedTTS(talker=talker, code_predictor=predictor, codec_decoder=decoder, config=config,
                     generation_config=generation, tokenizer=tokenizer, prompts=prompts, info=info, path=root,
                     speaker_encoder=speaker, codec_encoder=codec_encoder)
