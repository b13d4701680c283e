"""Voice, language and instruction resolution, and the Talker prefill, as the reference's generate builds them.

Text is tokenized inside the chat template `<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n`:
its first 3 ids are the role, ids[3:-5] the text. The template's control tokens are put in by id and the
text between them tokenized as client text (QwenTokenizer.encode), so an added token's string in the text
or the instructions stays text; for other text the ids are the reference's, which tokenizes the whole
template string. Prefill (non_streaming_mode=False):

    [instruction]  projected `<|im_start|>user\n{instructions}<|im_end|>\n` (VoiceDesign; CustomVoice 1.7B)
    role           projected <|im_start|> assistant \n
    codec prefix   (tts_pad x (k-1), tts_bos) + codec_embedding(c_1..c_k), with c = think or nothink,
                   think_bos, [language], think_eos, [speaker], pad; a cloned voice's x-vector (raw, the
                   speaker encoder's output) takes the speaker's place
    text positions text track id j + codec part j, for j = 0 .. P-1: P = 1 with codec part codec bos, or, for
                   an in-context (ICL) clone of a voice with R reference frames, P = R + 1 with codec parts
                   codec bos, then each reference frame's embedding sum (its 16 codes' embeddings)

The text track is the reference text's ids (ICL only; `<|im_start|>assistant\n{ref_text}<|im_end|>\n`
tokenized, ids[3:-2]), then the text's ids, then tts_eos, then tts_pad forever. The prefill carries its first
P ids; frame n's Talker input (n >= 1) is the embedding sum of frame n-1's 16 codes plus track id P-1+n. So
an ICL context's first frame needs R + 1 - (reference text ids) text ids, or the text's end (a short text ends
inside the prefill and every frame then gets tts_pad); an x-vector or named voice needs one.

Resolution rules (the reference's generate and its Qwen3TTSModel wrapper):
- language: "auto" or a non-dialect name of codec_language_id (case-insensitive). "auto" puts no
  language id and `nothink` instead of `think`. A dialect speaker (spk_is_dialect) asked for in
  "chinese" or "auto" gets its dialect's language id instead.
- voice: a CustomVoice speaker name (case-insensitive); None means the model's default speaker, the
  first of spk_id. VoiceDesign and Base checkpoints have no named voices: voice must be None. A Base
  checkpoint speaks with a cloned voice (ContextParams.voice_prompt, synth/voice.py), or with no speaker
  at all, which the reference also allows. A voice prompt on another variant, with a voice name, with an
  embedding of another size, or with reference frames outside MIN_REF_FRAMES..MAX_REF_FRAMES (1-30 s) or
  codes outside the codebooks, is InvalidParams.
- instructions: VoiceDesign and 1.7B CustomVoice use them; the reference ignores them for 0.6B
  CustomVoice (tts_model_size "0b6"), and Base takes none (an error here).
"""
from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from talkgate.synth.api import ContextParams, InvalidParams, UnknownLanguage, UnknownVoice, VoicePrompt
from talkgate.synth.config import TTSConfig
from talkgate.synth.tokenizer import QwenTokenizer

PREFIX_CACHE = 256              # prompts whose embeddings are kept ...
PREFIX_CACHE_POSITIONS = 32768  # ... holding at most this many positions together (ICL prompts are long)
MIN_REF_FRAMES = 13             # 1 s of reference audio (ceil(24000 / 1920))
MAX_REF_FRAMES = 375            # 30 s
MAX_REF_TEXT_IDS = 1024         # reference text, in tokens
# the longest clone prompt: role (3), think, think_bos, language, think_eos, x-vector, pad, then the text positions
CLONE_MAX_PROMPT = 3 + 6 + MAX_REF_FRAMES + 1
CODEBOOK_SIZE = 2048


def takes_instructions(cfg) -> bool:
    """The checkpoint (its config.py config) reads instructions: VoiceDesign, and CustomVoice but 0.6B's (the
    reference gives 0.6B CustomVoice none); Base refuses them."""
    return cfg.model_type == "voice_design" or (cfg.model_type == "custom_voice" and cfg.model_size not in "0b6")


@dataclass(frozen=True)
class Prompt:
    """A resolved context prompt: everything of the prefill but the text track."""

    voice: str | None
    language: str
    instruction_ids: tuple[int, ...]     # () when no instruction
    codec_ids: tuple[int, ...]           # the codec control prefix, ending with pad (a clone's x-vector goes before pad)
    clone: VoicePrompt | None = None     # a cloned voice (Base)
    ref_text_ids: tuple[int, ...] = ()   # ICL: the text track's first ids

    @property
    def text_positions(self) -> int:
        """Prefill positions that carry a text track id: 1, or 1 + reference frames (ICL)."""
        return 1 + (self.clone.frames if self.clone is not None else 0)

    @property
    def length(self) -> int:
        """Prefill length, text positions included."""
        return (len(self.instruction_ids) + 3 + len(self.codec_ids) + (self.clone is not None)
                + self.text_positions)


class Prompts:
    def __init__(self, config: TTSConfig, tokenizer: QwenTokenizer, talker, predictor):
        self.config, self.tokenizer, self.talker, self.predictor = config, tokenizer, talker, predictor
        t = config.talker
        self.voices = tuple(t.speakers)
        self.languages = ("auto",) + tuple(name for name in t.languages if "dialect" not in name)
        self.role_ids = (config.im_start, tokenizer.token_id("assistant"), tokenizer.encode("\n")[0])
        self._cache: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self._cached_positions = 0

    def resolve(self, params: ContextParams) -> Prompt:
        t, cfg = self.config.talker, self.config
        language = (params.language or "auto").lower()
        if language not in self.languages:
            raise UnknownLanguage(f"unknown language {params.language!r}; available: {', '.join(self.languages)}")
        clone = params.voice_prompt
        voice = params.voice.lower() if params.voice else None
        if clone is not None and voice is not None:
            raise InvalidParams("give a voice name or a voice prompt (a cloned voice), not both")
        if voice is not None and voice not in t.speakers:
            if not self.voices:
                raise UnknownVoice(f"this {cfg.model_type} model has no named voices (voice {params.voice!r}); "
                                   "leave the voice unset" + (" or give a cloned voice prompt"
                                                             if cfg.model_type == "base" else ""))
            raise UnknownVoice(f"unknown voice {params.voice!r}; available: {', '.join(self.voices)}")
        if voice is None and self.voices:
            voice = self.voices[0]
        instructions = params.instructions or ""
        if instructions and cfg.model_type == "base":
            raise InvalidParams("the base (voice clone) model takes no instructions")
        if cfg.model_type == "custom_voice" and not takes_instructions(cfg):
            instructions = ""                      # as the reference: no instructions for 0.6B CustomVoice
        instruction_ids = self.instruction_ids(instructions) if instructions else ()
        ref_text_ids = self._check_clone(clone) if clone is not None else ()
        language_id = None if language == "auto" else t.languages[language]
        if voice in t.speaker_dialect and language in ("chinese", "auto"):
            language_id = t.languages[t.speaker_dialect[voice]]
        if language_id is None:
            codec = [t.codec_nothink, t.codec_think_bos, t.codec_think_eos]
        else:
            codec = [t.codec_think, t.codec_think_bos, language_id, t.codec_think_eos]
        if voice is not None:
            codec.append(t.speakers[voice])
        codec.append(t.codec_pad)
        return Prompt(voice=voice, language=language, instruction_ids=instruction_ids, codec_ids=tuple(codec),
                      clone=clone, ref_text_ids=ref_text_ids)

    def _check_clone(self, clone: VoicePrompt) -> tuple[int, ...]:
        """InvalidParams unless this model can speak with the voice prompt; its reference text ids."""
        cfg = self.config
        if cfg.model_type != "base":
            raise InvalidParams(f"a cloned voice (voice prompt) needs a Base checkpoint; this model is "
                                f"{cfg.model_type}")
        hidden = cfg.talker.dims.hidden_size
        if clone.dim != hidden:
            raise InvalidParams(f"the voice prompt's speaker embedding has {clone.dim} values; this model's has "
                                f"{hidden} (a voice made with another model size?)")
        if not np.isfinite(clone.embedding_array()).all():
            raise InvalidParams("the voice prompt's speaker embedding has NaN or infinite values")
        if not clone.icl:
            return ()
        if not MIN_REF_FRAMES <= clone.frames <= MAX_REF_FRAMES:
            raise InvalidParams(f"the voice prompt's reference audio is {clone.frames} frames ({clone.frames * 0.08:.2f}"
                                f" s); reference audio must be {MIN_REF_FRAMES}..{MAX_REF_FRAMES} frames (1-30 s)")
        if int(clone.codes_array().max()) >= CODEBOOK_SIZE:
            raise InvalidParams(f"the voice prompt's reference codes must be < {CODEBOOK_SIZE}")
        ids = self.ref_text_ids(clone.ref_text)
        if len(ids) > MAX_REF_TEXT_IDS:
            raise InvalidParams(f"the voice prompt's reference text is {len(ids)} tokens, at most {MAX_REF_TEXT_IDS}")
        return ids

    @functools.lru_cache(maxsize=256)
    def ref_text_ids(self, ref_text: str) -> tuple[int, ...]:
        """An ICL reference text's ids, as the reference tokenizes it (`<|im_start|>assistant\n{ref_text}
        <|im_end|>\n`, ids[3:-2]; a control token's string in the text stays text)."""
        return tuple(self.tokenizer.encode(f"assistant\n{ref_text}"))[2:]

    @staticmethod
    def check_fits(prompt: Prompt, max_prompt: int) -> None:
        """InvalidParams when the prefill would not fit the engine's max_prompt positions."""
        if prompt.length <= max_prompt:
            return
        if prompt.clone is not None and prompt.clone.icl:
            frames = max_prompt - (prompt.length - prompt.clone.frames)
            raise InvalidParams(f"the voice prompt's reference audio is too long for this engine: "
                                f"{prompt.clone.frames} frames make a prompt of {prompt.length} positions, at most "
                                f"{max_prompt} (max_prompt: at most {max(frames, 0)} frames, "
                                f"{max(frames, 0) * 0.08:.2f} s)")
        raise InvalidParams(f"instructions too long: the prompt takes {prompt.length} positions, at most {max_prompt}")

    def instruction_ids(self, instructions: str) -> tuple[int, ...]:
        """`<|im_start|>user\n{instructions}<|im_end|>\n` as the reference tokenizes it (a control token's
        string in the instructions stays text)."""
        cfg, encode = self.config, self.tokenizer.encode
        return (cfg.im_start, *encode(f"user\n{instructions}"), cfg.im_end, *encode("\n"))

    def tokenize_text(self, text: str) -> tuple[tuple[int, ...], list[int]]:
        """(role ids, text ids) as the reference tokenizes them, inside the chat template. The role is
        self.role_ids unless the text starts with a line break, which merges with the role's."""
        cfg, encode = self.config, self.tokenizer.encode
        ids = [cfg.im_start, *encode(f"assistant\n{text}")]
        if len(ids) <= 3:
            raise InvalidParams("empty text")
        return tuple(ids[:3]), ids[3:]

    def prefill(self, prompt: Prompt, track: Sequence[int], role_ids: tuple[int, ...] | None = None) -> torch.Tensor:
        """[prompt.length, H] Talker input embeddings (device and dtype of the Talker). track: the text
        track's first prompt.text_positions ids (reference text ids first, for ICL). Everything but the
        text's part of the track depends only on the prompt: computed once per prompt and kept (a new
        context's prefill is on its time to first audio)."""
        return self.prefills([(prompt, track)], role_ids)[0]

    @torch.inference_mode()
    def prefills(self, items: list[tuple[Prompt, Sequence[int]]],
                 role_ids: tuple[int, ...] | None = None) -> list[torch.Tensor]:
        """prefill of several (prompt, track): their text ids embedded in one call (the engine thread's
        cost is per call, not per id). The engine's runner does the same inside its prefill graph: base(), with
        text_part()'s ids embedded and added at their positions."""
        bases, parts, ids = [], [], []
        for prompt, track in items:
            base = self.base(prompt, role_ids)
            at, text = self.text_part(prompt, track)
            bases.append(base)
            parts.append((at, len(text)))
            ids += text
        text = self.talker.embed_text(self._ids(ids))[0]              # [sum of m, H]
        out, k = [], 0
        for base, (at, m) in zip(bases, parts):
            out.append(torch.cat([base[:at], base[at:] + text[k:k + m]]))
            k += m
        return out

    def text_part(self, prompt: Prompt, track: Sequence[int]) -> tuple[int, Sequence[int]]:
        """(position, ids): the track's ids after its reference text's, which the prefill adds, embedded, to
        base(prompt) from that position to its end (the reference text's are in base already)."""
        if len(track) != prompt.text_positions:
            raise ValueError(f"the prefill takes {prompt.text_positions} text track ids, got {len(track)}")
        text = track[min(len(prompt.ref_text_ids), len(track)):]
        return prompt.length - len(text), text

    def _ids(self, values) -> torch.Tensor:
        # queued, not waited for: a prefill runs on the engine thread while the GPU works on the step before
        return torch.tensor([list(values)], dtype=torch.long).to(self.talker.codec_embedding.weight.device,
                                                                 non_blocking=True)

    def frame_embeddings(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [T, 16] -> [T, H]: the sum of each frame's codebook embeddings (codebook 0 from the Talker's
        table, 1..15 from the code predictor's), the Talker input a frame makes."""
        parts = [self.talker.codec_embedding(codes[:, 0])]
        parts += [self.predictor.codec_embedding[g](codes[:, g + 1]) for g in range(codes.shape[1] - 1)]
        return torch.stack(parts, dim=1).sum(1)

    def base(self, prompt: Prompt, role_ids: tuple[int, ...] | None = None) -> torch.Tensor:
        """[prompt.length, H] the prompt's Talker input embeddings but for its text ids (text_part): instructions,
        role, the codec prefix, then the text positions' codec parts with the reference text's embeddings added at
        theirs; kept for the last prompts."""
        role_ids = role_ids or self.role_ids
        key = (prompt, role_ids)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        cfg, talker = self.config, self.talker
        parts = []
        if prompt.instruction_ids:
            parts.append(talker.embed_text(self._ids(prompt.instruction_ids))[0])
        parts.append(talker.embed_text(self._ids(role_ids))[0])
        bos, pad = talker.embed_text(self._ids([cfg.tts_bos, cfg.tts_pad]))[0]
        codec = talker.codec_embedding(self._ids(prompt.codec_ids))[0]
        tail = talker.codec_embedding(self._ids([cfg.talker.codec_bos]))[0]
        clone = prompt.clone
        if clone is not None:
            speaker = torch.from_numpy(clone.embedding_array().copy()).to(codec.device, codec.dtype)
            codec = torch.cat([codec[:-1], speaker[None], codec[-1:]])
            if clone.icl:
                codes = torch.from_numpy(clone.codes_array()).to(codec.device)
                tail = torch.cat([tail, self.frame_embeddings(codes)])
        k = codec.shape[0]
        parts.append(torch.cat([pad.expand(k - 1, -1), bos[None]]) + codec)
        n = min(len(prompt.ref_text_ids), tail.shape[0])
        if n:
            tail = torch.cat([tail[:n] + talker.embed_text(self._ids(prompt.ref_text_ids[:n]))[0], tail[n:]])
        hit = self._cache[key] = torch.cat([*parts, tail])
        self._cached_positions += prompt.length
        while len(self._cache) > PREFIX_CACHE or self._cached_positions > PREFIX_CACHE_POSITIONS:
            (old, _), _ = self._cache.popitem(last=False)
            self._cached_positions -= old.length
        return hit
