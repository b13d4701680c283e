"""The Qwen text tokenizer (byte-level BPE) and a streaming front end for text that arrives in pieces.

`QwenTokenizer.from_dir(d)` builds what transformers' Qwen2Tokenizer builds from the same files:
tokenizer.json when present, otherwise vocab.json + merges.txt with NFC, the Qwen pre-tokenizer
regex and byte-level mapping; then the added tokens of tokenizer_config.json (`added_tokens_decoder`)
on top, with their ids. No special tokens are added around the text.

`StreamingTokenizer` turns text deltas into token ids as early as possible without ever committing
an id that later text could change. BPE merges never cross pre-tokenizer pieces, so every piece but
the last is final once the text after it has started; the last piece can still grow ("Hel" + "lo",
"it'" + "s", "  " + "x"). The held-back tail also starts no later than any suffix that could be the
beginning of an added token ("<|im_" + "end|>") and never just before a combining mark (NFC may
compose it with the character before). finish() releases the tail.
"""
from __future__ import annotations

import json
import unicodedata
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

# transformers' Qwen2Tokenizer pre-tokenizer regex
PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                     r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


class TokenizerError(ValueError):
    """Tokenizer files missing or unreadable; the message names the file."""


class QwenTokenizer:
    def __init__(self, tokenizer: Tokenizer, added: dict[str, int]):
        self.tok = tokenizer
        self.added = added                     # added token content -> id

    @classmethod
    def from_dir(cls, path: str | Path) -> "QwenTokenizer":
        root = Path(path)
        config_file = root / "tokenizer_config.json"
        try:
            config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        except (OSError, ValueError) as e:
            raise TokenizerError(f"{config_file}: cannot read ({e})") from e
        if (root / "tokenizer.json").is_file():
            try:
                tok = Tokenizer.from_file(str(root / "tokenizer.json"))
            except Exception as e:  # the tokenizers library raises a plain Exception
                raise TokenizerError(f"{root / 'tokenizer.json'}: cannot read ({e})") from e
        else:
            for name in ("vocab.json", "merges.txt"):
                if not (root / name).is_file():
                    raise TokenizerError(f"{root / name}: missing (need tokenizer.json, or vocab.json and merges.txt)")
            try:
                model = BPE.from_file(str(root / "vocab.json"), str(root / "merges.txt"), dropout=None,
                                      unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                                      fuse_unk=False, byte_fallback=False)
            except Exception as e:
                raise TokenizerError(f"{root / 'vocab.json'} / merges.txt: cannot read ({e})") from e
            tok = Tokenizer(model)
            tok.normalizer = normalizers.NFC()
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=bool(config.get("add_prefix_space", False)),
                                         use_regex=False)])
            tok.decoder = decoders.ByteLevel()
        entries = sorted(((int(i), d) for i, d in (config.get("added_tokens_decoder") or {}).items()),
                         key=lambda e: e[0])
        for token_id, d in entries:
            content = d["content"]
            have = tok.token_to_id(content)
            if have is not None and have != token_id:
                raise TokenizerError(f"{config_file}: added token {content!r} has id {token_id} but the vocabulary "
                                     f"gives it {have}")
            if have is None:
                if tok.get_vocab_size(with_added_tokens=True) != token_id:
                    raise TokenizerError(f"{config_file}: added token {content!r} id {token_id} is not the next "
                                         f"free id {tok.get_vocab_size(with_added_tokens=True)}")
                token = AddedToken(content, single_word=d.get("single_word", False), lstrip=d.get("lstrip", False),
                                   rstrip=d.get("rstrip", False), normalized=d.get("normalized", False),
                                   special=d.get("special", True))
                tok.add_tokens([token])
        added = {t.content: i for i, t in tok.get_added_tokens_decoder().items()}
        return cls(tok, added)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def token_id(self, content: str) -> int:
        i = self.tok.token_to_id(content)
        if i is None:
            raise TokenizerError(f"token {content!r} is not in the vocabulary")
        return i

    def stable_prefix(self, text: str) -> int:
        """Length of the longest prefix of `text` whose ids no continuation of the text can change."""
        starts = [start for _, (start, _) in self.tok.pre_tokenizer.pre_tokenize_str(text)]
        if len(starts) < 2:
            return 0
        cut = starts[-1]
        while cut > 0 and self._unsafe_cut(text, cut):
            cut = max((s for s in starts if s < cut), default=0)
        return cut

    def _unsafe_cut(self, text: str, cut: int) -> bool:
        if unicodedata.combining(text[cut]):
            return True
        for content in self.added:
            # an added token straddling the cut, or a tail that may become one
            start = text.find(content, max(0, cut - len(content) + 1))
            if 0 <= start < cut < start + len(content):
                return True
            for k in range(1, len(content)):
                if text.endswith(content[:k]) and len(text) - k < cut:
                    return True
        return False


class StreamingTokenizer:
    """feed(delta) -> ids committed by this delta; finish() -> the ids of the held-back tail.

    The ids committed over a whole stream equal QwenTokenizer.encode of the whole text."""

    def __init__(self, tokenizer: QwenTokenizer):
        self.tokenizer = tokenizer
        self.pending = ""

    def feed(self, delta: str) -> list[int]:
        self.pending += delta
        cut = self.tokenizer.stable_prefix(self.pending)
        if cut == 0:
            return []
        ids = self.tokenizer.encode(self.pending[:cut])
        self.pending = self.pending[cut:]
        return ids

    def finish(self) -> list[int]:
        ids = self.tokenizer.encode(self.pending) if self.pending else []
        self.pending = ""
        return ids
