"""The codec decoder's precision on a GPU, chosen once at load from the weights themselves.

    planned = planned_dtype(device, model_dtype, given)       # load_runner: the compile cache's and helpers' dtype
    tts = load_tts(..., decoder_dtype=torch.float32 if probes(...) else planned)
    chosen, snr_db = settle(tts)                               # after the load: the decoder cast, or kept float32

The decoder is most of a large batch's step (docs/engine.md "Roofline"). In float16 it decodes as fast as in
bfloat16; on an H200 one 1.7B engine with it ran clean to 170 req/s against 140 in float32, and its first audio at 20
req/s was p95 15.9 against 17.8 ms (docs/benchmarks.md). What it costs is precision, and that depends on the weights:
on random weights float16 decodes at 41 dB SNR against float32, where bfloat16, the precision the reference's own
decoder runs in when its model is loaded in bfloat16 as its examples load it, gives 23 dB. Trained weights cannot be
measured here, and a trained decoder's activations might leave float16's range. So the loaded weights decide: a
probe decodes PROBE_ROWS x PROBE_FRAMES frames of seeded random codes on the device in float32 (as the engine runs
it: cuDNN's convolutions at PyTorch's TF32 setting) and in float16, and float16 is kept when its output is finite
and its SNR against float32 is at least MIN_SNR_DB; else float32, with the figure in the log either way. The probe
runs after the checkpoint's load, beside the compile helpers, which compile for float16 meanwhile (the planned
dtype): it adds nothing to a start but its decode, unless it falls back (then the float32 kernels compile at
warm-up, as on a fresh cache).

Only where the model runs in a half type on CUDA: a float32 model (a parity run) keeps a float32 decoder, the CPU
too, and a given `decoder_dtype` (serve --decoder-dtype) is taken as it is, without a probe.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import math

import torch

from talkgate.synth.codec_decoder import CodecDecoder

log = logging.getLogger("talkgate.runner")

MIN_SNR_DB = 30.0        # float16 kept at or above: 11 dB under random weights' 41, 7 above bfloat16's 23
PROBE_FRAMES = 24        # ~2 s of audio a row (a fraction of a second's work on a GPU)
PROBE_ROWS = 2
PROBE_SEED = 0
CANDIDATE = torch.float16


def snr_db(exact: torch.Tensor, got: torch.Tensor) -> float:
    """10 log10(signal power / error power) of got against exact; -inf where got is not finite."""
    if not torch.isfinite(got).all():
        return -math.inf
    err = (got.float() - exact.float()).pow(2).mean().item()
    signal = exact.float().pow(2).mean().item()
    return math.inf if err == 0 else 10 * math.log10(max(signal, 1e-30) / err)


def probe_snr_db(decoder: CodecDecoder, dtype: torch.dtype, frames: int = PROBE_FRAMES) -> float:
    """`decoder` (float32) against a copy of itself in `dtype`, on the same seeded random codes."""
    cfg = decoder.config
    gen = torch.Generator().manual_seed(PROBE_SEED)
    codes = torch.randint(0, cfg.codebook_size, (PROBE_ROWS, cfg.num_quantizers, frames), generator=gen)
    device = next(decoder.parameters()).device
    codes = codes.to(device)
    exact = decoder.decode(codes)
    low = copy.deepcopy(decoder).to(dtype)          # the float32 weights kept for a decoder that fails
    return snr_db(exact, low.decode(codes))


def planned_dtype(device: torch.device, model_dtype: torch.dtype, given: torch.dtype | None) -> torch.dtype:
    """The decoder's dtype unless a probe says otherwise: `given`; float32 on the CPU or for a float32 model; else
    CANDIDATE."""
    if given is not None:
        return given
    return torch.float32 if device.type != "cuda" or model_dtype == torch.float32 else CANDIDATE


def probes(device: torch.device, model_dtype: torch.dtype, given: torch.dtype | None) -> bool:
    """Whether the load's decoder (then float32) is probed before it is cast to CANDIDATE."""
    return given is None and planned_dtype(device, model_dtype, given) != torch.float32


def settle(tts) -> tuple[torch.dtype, float]:
    """Probe a loaded checkpoint's float32 decoder; keep it, or cast it to CANDIDATE (tts.codec_decoder, tts.info
    updated). -> (its dtype now, the probe's SNR in dB)."""
    with torch.inference_mode():
        snr = probe_snr_db(tts.codec_decoder, CANDIDATE)
    chosen = CANDIDATE if snr >= MIN_SNR_DB else torch.float32
    tts.codec_decoder.to(chosen)
    tts.info = dataclasses.replace(tts.info, decoder_dtype=str(chosen).removeprefix("torch."))
    log.info("codec decoder: %s (float16 against float32 over %d x %d frames of random codes: %.1f dB SNR; "
             "float16 from %.0f dB)", tts.info.decoder_dtype, PROBE_ROWS, PROBE_FRAMES, snr, MIN_SNR_DB)
    return chosen, snr
