"""Synthesis of a text known up front: one context, eager, on the model's device (CLI `synthesize`).

    wav, sr = synthesize(tts, "Hello.", voice="ryan", language="english")
    wav, sr = synthesize(base, "Hello.", voice_prompt=make_voice_prompt(base, audio, sr, ref_text))  # a clone

It runs the same pieces as the streaming engine (Prompts.prefill, Talker with a static cache,
model.sample_codes, the codec decoder) one frame at a time, as the reference's generate does with
non_streaming_mode=False: frame n's Talker input is frame n-1's embedding sum plus the next text track id
(synth/prompt.py: text ids, then tts_eos, then tts_pad; an ICL voice's reference text first). Codebook 0
may be eos from frame 2 on (the reference's min_new_tokens=2); eos ends the utterance. An ICL voice's
audio is decoded as the reference's generate_voice_clone does: its reference frames, then the generated
ones, in one sequence, and the reference frames' samples (1920 each) are cut off.
An untrained checkpoint (random weights never sample eos usefully) is cut where the text-length rule
puts it instead, as the engine does (ModelInfo.end_of_speech "text_length_rule").
"""
from __future__ import annotations

import numpy as np
import torch

from talkgate.synth.api import SAMPLE_RATE, ContextParams, InvalidParams, SamplingParams, VoicePrompt
from talkgate.synth.model import sample_codes
from talkgate.synth.request import frames_for_text
from talkgate.synth.sampling import FrameSampler, RowSampling

MIN_FRAMES_BEFORE_EOS = 2


@torch.inference_mode()
def generate_codes(tts, text: str, voice: str | None = None, language: str = "auto",
                   instructions: str | None = None, sampling: SamplingParams = SamplingParams(),
                   max_frames: int | None = None, ignore_eos: bool = False, logits: list | None = None,
                   voice_prompt: VoicePrompt | None = None, eos: bool = True) -> torch.Tensor:
    """Codes [frames, 16] int64 (eos not included).

    eos False: eos is never sampled, so the utterance is max_frames long (the engine's fixed lengths).
    ignore_eos: eos neither stops nor is banned in the first frames, which is what the reference
    does when given an eos_token_id inside the suppressed range (fixed-length runs for random
    weights and parity tests). logits: a list that receives (Talker logits [3072], code predictor
    logits [15, 2048]) per frame, float32 on the CPU."""
    talker, predictor, cfg = tts.talker, tts.code_predictor, tts.config
    max_frames = max_frames or tts.generation_config.max_new_tokens
    if max_frames < 1:
        raise InvalidParams("max_frames must be >= 1")
    prompt = tts.prompts.resolve(ContextParams(voice=voice, language=language, instructions=instructions,
                                               voice_prompt=voice_prompt))
    role_ids, text_ids = tts.prompts.tokenize_text(text)
    device = talker.codec_embedding.weight.device
    track = list(prompt.ref_text_ids) + text_ids + [cfg.tts_eos]       # then tts_pad
    P = prompt.text_positions
    track += [cfg.tts_pad] * max(0, P + max_frames - len(track))
    x = tts.prompts.prefill(prompt, track[:P], role_ids)
    prefill_len = x.shape[0]
    talker.setup_cache(1, prefill_len + max_frames, device, x.dtype)
    slots = torch.zeros(1, dtype=torch.long, device=device)
    hidden = talker(x[None], torch.arange(prefill_len, device=device)[None], slots, fresh=True)[:, -1]
    rows = RowSampling.build([sampling], tts.generation_config, device)
    seen = torch.zeros(1, cfg.talker.vocab_size, dtype=torch.bool, device=device)
    frames = []
    for n in range(max_frames):
        sampler = FrameSampler(rows, torch.tensor([n], device=device))
        allow_eos = torch.tensor([eos and (ignore_eos or n >= MIN_FRAMES_BEFORE_EOS)], device=device)
        codes, embed_sum, *step_logits = sample_codes(talker, predictor, hidden, sampler, seen, allow_eos,
                                                      return_logits=logits is not None)
        if logits is not None:
            logits.append((step_logits[0][0].cpu(), step_logits[1][0].cpu()))
        code0 = int(codes[0, 0])
        if code0 == cfg.talker.codec_eos and not ignore_eos:
            break
        seen[0, code0] = True           # the sampler marks every id but eos, which goes on here under ignore_eos
        frames.append(codes[0])
        if n + 1 == max_frames:
            break
        x = embed_sum + talker.embed_text(torch.tensor([track[P + n]], device=device))
        hidden = talker(x[:, None], torch.tensor([[prefill_len + n]], device=device), slots)[:, 0]
    if not frames:
        return torch.zeros(0, cfg.talker.num_code_groups, dtype=torch.long)
    return torch.stack(frames).cpu()


@torch.inference_mode()
def synthesize(tts, text: str, voice: str | None = None, language: str = "auto", instructions: str | None = None,
               sampling: SamplingParams = SamplingParams(), max_frames: int | None = None,
               voice_prompt: VoicePrompt | None = None, ignore_eos: bool = False) -> tuple[np.ndarray, int]:
    """(float32 waveform in [-1, 1], 24000). max_frames: at most this many frames (default: the
    checkpoint's max_new_tokens, or for an untrained checkpoint under the text rule its frames_for_text)."""
    length_rule = tts.info.end_of_speech == "text_length_rule" and not ignore_eos
    if length_rule:
        max_frames = min(max_frames or frames_for_text(text), frames_for_text(text))
    codes = generate_codes(tts, text, voice, language, instructions, sampling, max_frames, ignore_eos=ignore_eos,
                           voice_prompt=voice_prompt, eos=not length_rule)
    if codes.shape[0] == 0:
        return np.zeros(0, dtype=np.float32), SAMPLE_RATE
    decoder = tts.codec_decoder
    device = next(decoder.parameters()).device
    ref = voice_prompt.codes_array() if voice_prompt is not None and voice_prompt.icl else np.zeros((0, 16), np.int64)
    codes = torch.cat([torch.from_numpy(ref), codes])
    wav = decoder.decode(codes.T[None].to(device))[0]      # codebook 0 < 2048: control ids are banned
    return wav[len(ref) * decoder.config.frame_samples:].float().cpu().numpy(), SAMPLE_RATE
