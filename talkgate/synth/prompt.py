"""Voice, language and instruction resolution, and the Talker prefill, as the reference's generate builds them.

Text is tokenized inside the chat template `<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n`:
its first 3 ids are the role, ids[3:-5] the text. The template's control tokens are put in by id and the
text between them tokenized as client text (QwenTokenizer.encode), so an added token's string in the text
or the instructions stays text; for other text the ids are the reference's, which tokenizes the whole
template string. Prefill (non_streaming_mode=False):

    [instruction]  projected `<|im_start|>user\n{instructions}<|im_end|>\n` (VoiceDesign; CustomVoice 1.7B)
    role           projected <|im_start|> assistant \n
    codec prefix   (tts_pad x (k-1), tts_bos) + codec_embedding(c_1..c_k), with c = think or nothink,
                   think_bos, [language], think_eos, [speaker], pad
    first text     projected text id 0 + codec_embedding(codec bos)

Frame n's Talker input is then the embedding sum of frame n-1's 16 codes plus the projected text id n
(tts_eos after the last text id, tts_pad after that).

Resolution rules (the reference's generate and its Qwen3TTSModel wrapper):
- language: "auto" or a non-dialect name of codec_language_id (case-insensitive). "auto" puts no
  language id and `nothink` instead of `think`. A dialect speaker (spk_is_dialect) asked for in
  "chinese" or "auto" gets its dialect's language id instead.
- voice: a CustomVoice speaker name (case-insensitive); None means the model's default speaker, the
  first of spk_id. VoiceDesign and Base checkpoints have no named voices: voice must be None. A Base
  (voice clone) model would take an x-vector from reference audio; talkgate does not implement the
  speaker encoder, so Base runs with no speaker embedding, which the reference also allows.
- instructions: VoiceDesign and 1.7B CustomVoice use them; the reference ignores them for 0.6B
  CustomVoice (tts_model_size "0b6"), and Base takes none (an error here).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from talkgate.synth.api import ContextParams, InvalidParams, UnknownLanguage, UnknownVoice
from talkgate.synth.config import TTSConfig
from talkgate.synth.tokenizer import QwenTokenizer

PREFIX_CACHE = 256          # prompts (voice, language, instructions) whose prefill prefix is kept


@dataclass(frozen=True)
class Prompt:
    """A resolved context prompt: everything of the prefill but the first text token."""

    voice: str | None
    language: str
    instruction_ids: tuple[int, ...]     # () when no instruction
    codec_ids: tuple[int, ...]           # the codec prefix, ending with pad (bos is added with text id 0)

    @property
    def length(self) -> int:
        """Prefill length, first text token included."""
        return len(self.instruction_ids) + 3 + len(self.codec_ids) + 1


class Prompts:
    def __init__(self, config: TTSConfig, tokenizer: QwenTokenizer, talker):
        self.config, self.tokenizer, self.talker = config, tokenizer, talker
        t = config.talker
        self.voices = tuple(t.speakers)
        self.languages = ("auto",) + tuple(name for name in t.languages if "dialect" not in name)
        self.role_ids = (config.im_start, tokenizer.token_id("assistant"), tokenizer.encode("\n")[0])
        self._prefixes: OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    def resolve(self, params: ContextParams) -> Prompt:
        t, cfg = self.config.talker, self.config
        language = (params.language or "auto").lower()
        if language not in self.languages:
            raise UnknownLanguage(f"unknown language {params.language!r}; available: {', '.join(self.languages)}")
        voice = params.voice.lower() if params.voice else None
        if voice is not None and voice not in t.speakers:
            if not self.voices:
                raise UnknownVoice(f"this {cfg.model_type} model has no named voices (voice {params.voice!r}); "
                                   "leave the voice unset" + (" (voice cloning from reference audio is not "
                                                             "supported)" if cfg.model_type == "base" else ""))
            raise UnknownVoice(f"unknown voice {params.voice!r}; available: {', '.join(self.voices)}")
        if voice is None and self.voices:
            voice = self.voices[0]
        instructions = params.instructions or ""
        if instructions and cfg.model_type == "base":
            raise InvalidParams("the base (voice clone) model takes no instructions")
        if cfg.model_type == "custom_voice" and cfg.model_size in "0b6":
            instructions = ""                      # as the reference: no instructions for 0.6B CustomVoice
        instruction_ids = self.instruction_ids(instructions) if instructions else ()
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
        return Prompt(voice=voice, language=language, instruction_ids=instruction_ids, codec_ids=tuple(codec))

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

    @torch.inference_mode()
    def prefill(self, prompt: Prompt, first_text_id: int, role_ids: tuple[int, ...] | None = None) -> torch.Tensor:
        """[prompt.length, H] Talker input embeddings (device and dtype of the Talker). Everything but
        the first text token depends only on the prompt: computed once per prompt and kept (a new
        context's prefill is on its time to first audio)."""
        prefix, codec_bos = self._prefix(prompt, role_ids or self.role_ids)
        first = self.talker.embed_text(self._ids([first_text_id]))[0] + codec_bos
        return torch.cat([prefix, first])

    def _ids(self, values) -> torch.Tensor:
        return torch.tensor([list(values)], device=self.talker.codec_embedding.weight.device)

    def _prefix(self, prompt: Prompt, role_ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """([prompt.length - 1, H] embeddings before the first text token, [1, H] codec bos embedding)."""
        key = (prompt, role_ids)
        hit = self._prefixes.get(key)
        if hit is not None:
            self._prefixes.move_to_end(key)
            return hit
        cfg, talker = self.config, self.talker
        parts = []
        if prompt.instruction_ids:
            parts.append(talker.embed_text(self._ids(prompt.instruction_ids))[0])
        parts.append(talker.embed_text(self._ids(role_ids))[0])
        bos, eos, pad = talker.embed_text(self._ids([cfg.tts_bos, cfg.tts_eos, cfg.tts_pad]))[0]
        codec = talker.codec_embedding(self._ids(prompt.codec_ids + (cfg.talker.codec_bos,)))[0]
        k = len(prompt.codec_ids)
        parts.append(torch.cat([pad.expand(k - 1, -1), bos[None]]) + codec[:k])
        hit = self._prefixes[key] = (torch.cat(parts), codec[k:])
        if len(self._prefixes) > PREFIX_CACHE:
            self._prefixes.popitem(last=False)
        return hit
