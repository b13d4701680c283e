"""The Qwen text tokenizer (byte-level BPE) and a streaming front end for text that arrives in pieces.

`QwenTokenizer.from_dir(d)` builds what transformers' Qwen2Tokenizer builds from the same files:
tokenizer.json when present, otherwise vocab.json + merges.txt with NFC, the Qwen pre-tokenizer
regex and byte-level mapping; then the added tokens of tokenizer_config.json (`added_tokens_decoder`)
on top, with their ids. No special tokens are added around the text.

`StreamingTokenizer` turns text deltas into token ids as early as possible without ever committing
an id that later text could change. BPE merges never cross pre-tokenizer pieces, and a piece that
ends in something other than whitespace, with text after it, is final: the last piece can still grow
("Hel" + "lo", "it'" + "s") and a whitespace run can still merge with what follows ("\n " + " \n").
So the cut is the start of the last piece that follows a non-whitespace character, and the ids
committed are those of the pieces before it, taken from the tokenization of the whole pending text
(a prefix tokenized alone can differ: "  " before "3" is two pieces, at the end of a text one). The
pending text is kept NFC-normalized as the tokenizer normalizes; the cut never sits just before a
combining mark, and never after the start of a tail that may still become an added token
("<|im_" + "end|>"). finish() releases the tail.
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
        self.added_ids = set(added.values())
        # the proper prefixes of the added tokens ("<|im_" of "<|im_end|>"): a text ending in one may
        # still become that token (a set: one lookup per suffix length, per streamed delta)
        self.added_prefixes = frozenset(c[:k] for c in added for k in range(1, len(c)))
        self.longest_prefix = max(map(len, self.added_prefixes), default=0)

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
        """Length of the longest prefix of `text` whose ids no continuation of the text can change.

        Added tokens split the text into segments tokenized apart. A tail that may still become an
        added token ("<|im_") may also end the segment before it, so the cut is the start of the last
        pre-tokenizer piece of the text between the last complete added token and that tail."""
        partial = len(text)
        for k in range(min(self.longest_prefix, len(text)), 0, -1):
            if text[-k:] in self.added_prefixes:
                partial = len(text) - k
                break
        segment_start = 0
        enc = self.tok.encode(text[:partial], add_special_tokens=False)
        for token_id, (_, end) in zip(enc.ids, enc.offsets):
            if token_id in self.added_ids:
                segment_start = end
        pieces = self.tok.pre_tokenizer.pre_tokenize_str(text[segment_start:partial])
        starts = [segment_start + start for _, (start, _) in pieces][1:]
        # a piece ending in whitespace may still merge with whitespace that follows ("\n " + " \n"
        # is one piece); NFC may compose a combining mark with the character before it
        return max((s for s in starts if not text[s - 1].isspace() and not unicodedata.combining(text[s])),
                   default=segment_start)


class StreamingTokenizer:
    """feed(delta) -> ids committed by this delta; finish() -> the ids of the held-back tail.

    The ids committed over a whole stream equal QwenTokenizer.encode of the whole text."""

    def __init__(self, tokenizer: QwenTokenizer):
        self.tokenizer = tokenizer
        self.pending = ""

    def feed(self, delta: str) -> list[int]:
        # kept NFC-normalized (NFC(NFC(a) + b) == NFC(a + b)) so that the pieces seen here are the
        # pieces the tokenizer sees
        self.pending = unicodedata.normalize("NFC", self.pending + delta)
        cut = self.tokenizer.stable_prefix(self.pending)
        if cut == 0:
            return []
        # the ids of the pieces before the cut, tokenized in context: a prefix tokenized alone can
        # differ ("  " before "3" is two pieces, at the end of a text one)
        enc = self.tokenizer.tok.encode(self.pending, add_special_tokens=False)
        ids = []
        for token_id, (_, end) in zip(enc.ids, enc.offsets):
            if end > cut:
                break
            ids.append(token_id)
        self.pending = self.pending[cut:]
        return ids

    def finish(self) -> list[int]:
        ids = self.tokenizer.encode(self.pending) if self.pending else []
        self.pending = ""
        return ids
