"""Qwen text tokenizer: same ids as transformers' for the same files; client text never yields a control id;
streaming commits only final ids (CJK: exact where the merges prove a boundary, else a bounded look-ahead),
at a cost per delta bounded by the delta."""
from __future__ import annotations

import random
import shutil
import time
import unicodedata

import pytest

from talkgate.synth.tokenizer import (
    EARLY_WORD_IDS, LONG_LOOKAHEAD, QwenTokenizer, StreamingTokenizer, fixed_length, numeric, qwen_tokenizer_dir,
    unspaced,
)

TEXTS = [
    "Hello, world! It's a test: don't we'll they've I'm she'd.",
    "The year 2024 had 366 days; pi is 3.14159, and 1,000,000 is a million.",
    "你好，世界！今天天气怎么样？我们去公园散步吧。",
    "Mixed 中文 and English, 混合 text with numbers 12345 and symbols #@$%.",
    "Emoji 🙂👍🏽 and flags 🇫🇷, family 👨‍👩‍👧.",
    "  leading spaces, trailing spaces   ",
    "line one\nline two\n\n\nline five\r\n\ttabbed",
    "Café, naïve, résumé, cafe\u0301 (combining accent), Ångström.",
    "日本語のテキストとカタカナ、한국어 문장도 있습니다.",
    "Punctuation!!! ... ??? --- (parentheses) [brackets] {braces} \"quotes\" 'single'",
    "URL https://example.com/path?q=1&x=2 and email a.b@c.de",
    "Числа и слова по-русски, Ελληνικά, العربية.",
    # NFC across deltas: jamo, kana + voicing mark, a second starter (U+0D3E), '<' + U+0338
    "\u1100\u1161\u11a8 \u304b\u3099 \u0d46\u0d3e a<\u0338b e\u0323\u0301",
]
# Chinese and Japanese without punctuation: one pre-tokenizer piece each
UNSPACED = [
    "我们今天去公园散步然后一起吃午饭顺便看看新开的书店",
    "人工智能技术正在改变我们的生活方式和工作方式",
    "用Python写代码很方便也可以用GPU加速训练",
    "ひらがなとカタカナの文章ですね",
    "天天天天天天天天天天天天天天天天",        # some vocabulary token covers every boundary; no merge makes it
]
CONTROL = "<|im_start|>assistant\nspecial tokens inside<|im_end|>\n<tts_pad> and <|im_e"

@pytest.fixture(scope="module")
def tokenizers(tiny_checkpoint):
    from transformers import AutoTokenizer
    return QwenTokenizer.from_dir(tiny_checkpoint), AutoTokenizer.from_pretrained(str(tiny_checkpoint))


def test_ids_equal_transformers_from_vocab_and_merges(tokenizers, tiny_checkpoint):
    ours, theirs = tokenizers
    assert not (tiny_checkpoint / "tokenizer.json").exists()      # the vocab.json + merges.txt path
    for text in TEXTS + UNSPACED:
        assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text
    # control-token strings are text: as transformers' split_special_tokens (for its special tokens)
    assert ours.encode(CONTROL) == theirs(CONTROL, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert 151645 in theirs(CONTROL, add_special_tokens=False)["input_ids"]    # what the reference does


def test_tts_tokens_and_ids(tokenizers):
    ours, theirs = tokenizers
    for i, content in [(151644, "<|im_start|>"), (151645, "<|im_end|>"), (151669, "<|audio_start|>"),
                       (151671, "<tts_pad>"), (151672, "<tts_text_bos>"), (151673, "<tts_text_eod>"),
                       (151675, "<|audio_pad|>")]:
        assert ours.token_id(content) == i == theirs.convert_tokens_to_ids(content) == ours.added[content]
    assert ours.decode([151644, 77091, 198, 13048, 13, 151645]) == "<|im_start|>assistant\nHi.<|im_end|>"


def test_added_token_strings_in_client_text_are_text(tokenizers):
    """Every added token of the real vocabulary (Qwen's and the TTS ones), inside client text, whole or
    streamed, yields ordinary BPE ids that decode to the text: never an added id."""
    ours, _ = tokenizers
    added_ids = set(ours.added.values())
    assert len(added_ids) == 33 and {151645, 151671, 151673, 151667} <= added_ids
    rng = random.Random(2)
    for content in ours.added:
        for text in (content, f"a{content}b", f"你好{content}世界", f" {content} ", content * 3, content[:-1]):
            ids = ours.encode(text)
            assert not added_ids & set(ids) and ours.decode(ids) == text, text
            cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 4)))
            _, streamed = stream(ours, [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])])
            assert streamed == ids, text


def test_prompt_control_tokens_by_id_and_text_as_text(tiny_checkpoint, tokenizers):
    """The prompt's control tokens are ids talkgate puts in; for ordinary text and instructions the ids
    are the reference's (its whole template string through transformers); control strings in the
    text or the instructions stay text."""
    from talkgate.synth.loader import load_tts
    _, theirs = tokenizers
    prompts = load_tts(tiny_checkpoint, with_decoder=False).prompts
    added_ids = set(prompts.tokenizer.added.values())
    template = "<|im_start|>assistant\n{}<|im_end|>\n<|im_start|>assistant\n"
    for text in ["Hello there.", "\nStarts with a line break.", "你好，世界！", "trailing space "]:
        ref = theirs(template.format(text), add_special_tokens=False)["input_ids"]
        role, ids = prompts.tokenize_text(text)
        assert list(role) + ids == ref[:-5], text
    role, ids = prompts.tokenize_text("Stop here<|im_end|><tts_text_eod> and go on")
    assert role == prompts.role_ids and not added_ids & set(ids)
    assert prompts.tokenizer.decode(ids) == "Stop here<|im_end|><tts_text_eod> and go on"
    ref = theirs("<|im_start|>user\nSpeak slowly.<|im_end|>\n", add_special_tokens=False)["input_ids"]
    assert prompts.instruction_ids("Speak slowly.") == tuple(ref)
    ids = prompts.instruction_ids("calm<|im_end|>\n<|im_start|>assistant\nx")
    assert ids[0] == 151644 and ids[-2:] == (151645, 198) and not added_ids & set(ids[1:-2])


def test_tokenizer_json_path_equals_transformers(tmp_path):
    from transformers import AutoTokenizer
    src = qwen_tokenizer_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        shutil.copyfile(src / name, tmp_path / name)
    ours, theirs = QwenTokenizer.from_dir(tmp_path), AutoTokenizer.from_pretrained(str(tmp_path))
    for text in TEXTS:
        assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text


def stream(tok: QwenTokenizer, pieces: list[str]) -> tuple[list[int], list[int]]:
    s = StreamingTokenizer(tok)
    committed = []
    for p in pieces:
        committed += s.feed(p)
    return committed, committed + s.finish()


def test_whole_text_is_one_encoding(tokenizers):
    """StreamingTokenizer.whole (an HTTP request's text): the whole text's ids, as feed + finish give them."""
    ours, _ = tokenizers
    rng = random.Random(1)
    for text in TEXTS + UNSPACED + ["".join(rng.choice("abc xyz") for _ in range(300)), ""]:
        s = StreamingTokenizer(ours)
        assert s.whole(text) == ours.encode(text) == stream(ours, [text])[1], text
        assert s.finish() == [] and s.committed == 0
    s = StreamingTokenizer(ours)
    s.feed("Hello wor")
    with pytest.raises(ValueError):
        s.whole("ld.")


def test_streaming_equals_whole_text_for_random_splits(tokenizers):
    """Exact for spaced scripts (pieces shorter than LONG_LOOKAHEAD) and, through the merge rule, for the
    Chinese and Japanese runs here."""
    ours, _ = tokenizers
    rng = random.Random(0)
    corpus = TEXTS + UNSPACED + [" ".join(rng.sample(TEXTS + UNSPACED, 3)) for _ in range(10)]
    for text in corpus:
        whole = ours.encode(text)
        for _ in range(25):
            cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
            pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
            _, ids = stream(ours, pieces)
            assert ids == whole, (text, pieces)
        _, ids = stream(ours, list(text))                         # one character at a time
        assert ids == whole, text


def test_committed_ids_are_a_prefix_whatever_comes_next(tokenizers):
    """Ids committed after a prefix stay the tokenization's prefix for every continuation."""
    ours, _ = tokenizers
    rng = random.Random(1)
    tails = ["", "s", "ll", " x", "\n", "  ", "\u0301", "\u3099", "\u0338", "end|>", "1", "!", "你", "好", "们",
             "世界", "カ", "🙂", "<|im_end|>"]
    for text in TEXTS + UNSPACED[:-1]:
        for _ in range(10):
            cut = rng.randint(1, len(text))
            committed, _ = stream(ours, [text[:cut]])
            for tail in tails:
                assert ours.encode(text[:cut] + tail)[:len(committed)] == committed, (text[:cut], tail)


def test_streaming_commits_early(tokenizers):
    ours, _ = tokenizers
    s = StreamingTokenizer(ours)
    assert s.feed("Hel") == []
    assert s.feed("lo wor") == ours.encode("Hello")
    assert s.feed("ld. Next") == ours.encode(" world.")
    assert s.finish() == ours.encode(" Next")


def test_chinese_one_character_at_a_time_commits_a_word_behind(tokenizers):
    """No punctuation: a token is committed once the characters after it rule out a longer token."""
    ours, _ = tokenizers
    s = StreamingTokenizer(ours)
    got = [ours.decode(s.feed(ch)) for ch in "我们今天去公园散步"]
    assert got == ["", "", "我们", "", "今天", "去", "", "公园", ""]
    assert ours.decode(s.finish()) == "散步"


def test_merge_rule_alone_is_exact(tokenizers):
    """With the look-ahead off, every id committed inside a Han/kana run is proven by the merges:
    random runs of common characters, streamed one at a time, give the whole text's ids."""
    ours, _ = tokenizers
    rng = random.Random(4)
    pool = list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学"
                "对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面"
                "公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部"
                "がなとカタのです") + ["Python", "GPU", "a", "天天"]
    for _ in range(300):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(5, 30)))
        s = StreamingTokenizer(ours, lookahead=10**9)
        ids = [i for ch in text for i in s.feed(ch)]
        assert ids + s.finish() == ours.encode(text), text


def test_runs_that_tokens_cover_are_committed_by_the_merges(tokenizers):
    """Runs of one character where vocabulary tokens cover every boundary ("天天", "哈哈哈哈", "ーー" are
    tokens) are committed a few characters behind, exactly, with no look-ahead: the merges rule the covering
    tokens out. "哈" * k tokenizes from its first token on according to k up to 6 ([哈哈, 哈哈哈] for 5,
    [哈哈哈哈, 哈哈] for 6): no rule can commit before that."""
    ours, _ = tokenizers
    assert [ours.decode([i]) for i in ours.encode("哈" * 5)] == ["哈哈", "哈哈哈"]
    assert [ours.decode([i]) for i in ours.encode("哈" * 6)] == ["哈哈哈哈", "哈哈"]
    for ch, most in (("天", 2), ("哈", 6), ("ー", 1), ("一", 2)):
        text = ch * 60
        s = StreamingTokenizer(ours, lookahead=10**9)
        ids, held = [], []
        for c in text:
            ids += s.feed(c)
            held.append(len(s.pending))
        assert max(held) <= most and ids + s.finish() == ours.encode(text), (ch, max(held))
    assert all(unspaced(ch) for ch in "天ひカ㐀𠀀") and not any(unspaced(ch) for ch in "a한,。1")


def test_nfc_prefix_kept_by_any_continuation():
    """fixed_length: the NFC prefix that no continuation changes (the streaming tokenizer commits only there)."""
    rng = random.Random(3)
    alphabet = ["a", "e", "<", " ", "é", "か", "が", "天", "\u1100", "\u1161", "가", "\u0d46", "\u0d3e", "\u0301",
                "\u0323", "\u0338", "\u3099", "!", "1"]
    tails = ["\u0301", "\u0323\u0301", "\u0338", "\u3099", "\u1161", "\u11a8", "\u0d3e", "x"]
    for _ in range(2000):
        text = unicodedata.normalize("NFC", "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))))
        k = fixed_length(text)
        for tail in tails:
            assert unicodedata.normalize("NFC", text + tail)[:k] == text[:k], (text, tail)


def adversarial(n: int) -> dict[str, str]:
    rng = random.Random(n)
    return {"word": "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n)),
            "url": ("https://example.com/?q=" + "".join(f"%{rng.randrange(256):02X}" for _ in range(n)))[:n],
            "chinese": "".join(chr(rng.randrange(0x4E00, 0x5A00)) for _ in range(n)),
            "same han": "天" * n,
            "marks": "a" + "".join(rng.choice("\u0301\u0323\u0308\u0338") for _ in range(n - 1)),
            "added look-alike": ("<|im_" * n)[:n],
            "spaces": " " * n,
            "newlines": "\n" * n,
            "punctuation": "!?" * (n // 2)}


def test_held_text_is_bounded_whatever_the_stream(tokenizers):
    """The text one feed works over stays within the look-ahead window plus the delta (the cost bound),
    and the ids decode to the text (NFC; runs of more than STREAM_SAFE marks are normalized in parts)."""
    ours, _ = tokenizers
    step = 10
    for name, text in adversarial(20_000).items():
        s = StreamingTokenizer(ours)
        ids, held = [], 0
        for i in range(0, len(text), step):
            ids += s.feed(text[i:i + step])
            held = max(held, len(s.pending))
        ids += s.finish()
        assert held <= LONG_LOOKAHEAD + ours.longest_token + step, (name, held)
        if name != "marks":
            assert ours.decode(ids) == unicodedata.normalize("NFC", text), name
        assert len(ids) > 100, name


def test_total_cost_grows_linearly(tokenizers):
    """1,000 vs 4,000 ten-character deltas: linear is a ratio of 4, the old whole-text retokenization was
    quadratic (16); the bound of 8 leaves room for a noisy machine (rounds of the same work differ by up to 2x on
    the build machine). CPU time of this thread (other threads of the test process do not count), the best of 4
    each, the two lengths measured in turn so that other load on the machine weighs on both alike."""
    ours, _ = tokenizers

    def cost(text: str) -> float:
        s = StreamingTokenizer(ours)
        t = time.thread_time()
        for i in range(0, len(text), 10):
            s.feed(text[i:i + 10])
        return time.thread_time() - t

    short, long = adversarial(10_000), adversarial(40_000)
    for name in ("word", "chinese", "marks"):
        rounds = [(cost(short[name]), cost(long[name])) for _ in range(4)]
        ratio = min(b for _, b in rounds) / min(a for a, _ in rounds)
        assert ratio < 8, (name, ratio, rounds)


def test_every_numeric_character_is_a_piece_of_its_own(tokenizers):
    """What the digit rule rests on, for this tokenizers library's regex tables: a \\p{N} character is one piece
    between letters, digits, punctuation, spaces and marks."""
    ours, _ = tokenizers
    pre = ours.text_tok.pre_tokenizer
    chars = [chr(cp) for cp in range(0x30000) if numeric(chr(cp))]
    assert len(chars) > 1500
    for ch in chars:
        for before, after in (("a", "b"), ("1", "2"), (" ", "!"), ("天", "\u0301"), ("'", "s")):
            text = before + ch + after
            assert (ch, (1, 2)) in [(text[s:e], (s, e)) for _, (s, e) in pre.pre_tokenize_str(text)], hex(ord(ch))


def test_a_delta_ending_in_a_digit_commits_it(tokenizers):
    ours, _ = tokenizers
    s = StreamingTokenizer(ours)
    assert s.feed("2") == ours.encode("2")                      # the first id on the first delta
    assert s.feed("02") == ours.encode("02")
    assert s.feed("4 was") == ours.encode("4")                  # " was" may still grow
    assert s.feed(" room 1") == ours.encode(" was room 1")
    assert s.feed("a") == [] and s.feed("\u0301") == []           # "a" + U+0301 composes: held until known
    assert s.feed("5") == ours.encode("\u00e15")
    assert s.feed("\u0301") == [] and s.finish() == ours.encode("\u0301")


# the kinds of text an LLM streams: words, numbers, emoji, Chinese and Japanese with and without punctuation
POOLS = {
    "english": ["Hello", " world", ",", " it's", " don't", " I'm", " the", " quick", " brown", " fox", ".", "!", "?",
                " Unbelievable", " results", " e.g.", " (yes)", " \"quoted\"", "\n", " ", "  ", " well-known", " co-op"],
    "chinese": ["你好", "，", "世界", "！", "我们", "今天", "天气", "怎么样", "？", "人工智能", "技术", "正在", "改变", "的",
                "生活", "方式", "。", "天天", "了", "吧"],
    "japanese": ["今日は", "良い", "天気", "ですね", "、", "散歩", "に", "行き", "ましょう", "。", "ひらがな", "と", "カタカナ",
                 "東京", "都", "に", "住んで", "います", "が", "か"],
    "numbers": ["1", "23", "456", " 7", ",000", ".5", "%", " 2024", "年", "3月", " 12:30", " $", "4.99", "٣", "²", "Ⅻ"],
    "emoji": ["🙂", "👍🏽", " 🇫🇷", "👨\u200d👩\u200d👧", " ❤️", "✨", "🎉", " ok", "😀😀"],
}
POOLS["mixed"] = [w for pool in POOLS.values() for w in pool]


def texts_of(rng: random.Random, pool: list[str], count: int) -> list[str]:
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 14))) for _ in range(count)]


def splits_of(rng: random.Random, text: str) -> list[list[str]]:
    """Random cuts, one character at a time, and one Qwen token at a time (the way an LLM streams)."""
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 8)))) if len(text) > 1 else []
    from talkgate.loadgen.measure import token_deltas
    return [[text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])], list(text), token_deltas(text)]


@pytest.mark.parametrize("kind", sorted(POOLS))
def test_incremental_commit_equals_the_whole_text_over_any_split(tokenizers, kind):
    """Property (seeded random texts and splits): with the look-ahead off, so that every commit is proven,
    each feed commits a prefix of the whole text's ids and the stream ends with exactly those ids."""
    ours, _ = tokenizers
    rng = random.Random(f"split-{kind}")
    for text in texts_of(rng, POOLS[kind], 120):
        whole = ours.encode(text)
        for pieces in splits_of(rng, text):
            s = StreamingTokenizer(ours, lookahead=10**9)
            ids: list[int] = []
            for piece in pieces:
                ids += s.feed(piece)
                assert ids == whole[:len(ids)], (text, pieces)
            assert ids + s.finish() == whole, (text, pieces)


def test_first_id_commits_on_the_delta_that_proves_it(tokenizers):
    """LLM-like deltas (one Qwen token each): a leading number commits on the first delta (before the digit rule:
    the second), and so does a Chinese first token that no token can extend ("好的", "这次"); a leading word,
    or Chinese or Japanese that a token may extend, needs the next delta to prove its end. A first word sent in
    several tokens ("Un" "belie" "vably", "З" "д" "рав" ...) is committed when it ends, not token by token: a first
    id sooner would move every later frame's due time up (synth/tokenizer.py) (python -m bench.tokenizer first: the
    figure over the bench prompts)."""
    from bench.tokenizer import first_commit_delta
    from talkgate.loadgen.measure import token_deltas
    ours, _ = tokenizers
    for text, first in [("2024 was a good year.", 0), ("3 new messages.", 0), ("Hello, how are you?", 1),
                        ("我们今天去公园散步", 1), ("今日は良い天気ですね", 1), ("好的，请稍等", 0), ("这次去东京", 0),
                        ("Unbelievably good.", 3), ("Здравствуйте, чем я могу вам помочь?", 6),
                        ("안녕하세요, 무엇을 도와드릴까요?", 3)]:
        assert first_commit_delta(ours, token_deltas(text)) == first, text


# Chinese, Japanese, mixed, English, Russian, Korean and Greek texts as an LLM writes them, with and without
# punctuation; runs where vocabulary tokens cover every boundary; rare characters no token extends
EXHAUSTIVE = [
    "我们今天去公园散步然后吃午饭", "好的请稍等一下", "明天天气晴朗最高气温二十五度", "抱歉我没有听清楚",
    "这个问题问得好", "人工智能正在改变生活", "彭珮云在天津强调", "钟敬之同志逝世", "哈哈哈哈哈哈哈哈哈",
    "天天天天天天天", "您好，请问有什么可以帮您？", "会议下午三点开始。",
    "今日は良い天気ですね", "ありがとうございました", "東京都に住んでいます", "ご注文の商品は明日お届けします",
    "コーヒーを飲みたいです", "ラーメンーー美味しい",
    "用Python写代码很方便", "我的iPhone连不上WiFi", "这次conference的slides", "请打开 Settings 页面。",
    "Hello, how are you?", "It's a well-known fact.", "The year 2024 was good.", "The first transatlantic cable.",
    "Unbelievably, internationalization!", "Здравствуйте, друг.", "안녕하세요 반갑습니다", "Ελληνικά γράμματα",
]


def test_every_split_into_deltas_commits_the_whole_texts_ids(tokenizers):
    """Exhaustive over the 2**(n-1) ways to split each text into deltas: the tokenizer's state after a delta is
    its pending text (and whether an id was committed yet), so walking every reachable state at every position
    with every next delta covers every split. With the look-ahead off, each feed commits a prefix of the whole
    text's ids and finish() completes them."""
    import copy
    ours, _ = tokenizers
    for text in EXHAUSTIVE:
        whole = ours.encode(text)
        states = {0: {("", True): (StreamingTokenizer(ours, lookahead=10**9), 0)}}   # position -> states
        for k in range(len(text)):
            for s, done in states.pop(k, {}).values():
                for j in range(k + 1, len(text) + 1):
                    nxt = copy.copy(s)
                    got = nxt.feed(text[k:j])
                    assert got == whole[done:done + len(got)], (text, k, j, s.pending)
                    key = (nxt.pending, min(nxt.committed, EARLY_WORD_IDS))    # all that steers a feed
                    if key not in states.setdefault(j, {}):
                        states[j][key] = (nxt, done + len(got))
        for s, done in states[len(text)].values():
            assert whole[:done] + s.finish() == whole, (text, s.pending)


def continuations(tok: QwenTokenizer) -> list[str]:
    """Letters that can follow CJK in one pre-tokenizer piece: every vocabulary token that decodes to letters
    with a Han or kana among them (every 7th, for time), single characters of the CJK blocks, Latin."""
    from talkgate.synth.tokenizer import BYTE_OF
    tokens = []
    for token in tok.sorted_vocab:
        try:
            text = bytes(BYTE_OF[c] for c in token).decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text and all(unicodedata.category(c)[0] == "L" for c in text) and any(unspaced(c) for c in text):
            tokens.append(text)
    return ["", "a", "Python", "ー", "々", "ゝ"] + tokens[::7] + [chr(c) for c in range(0x3041, 0x3097)] + [
        chr(c) for c in range(0x4E00, 0x9FA6, 11)]


def test_committed_ids_hold_under_every_continuation(tokenizers):
    """Streamed one character at a time, the ids committed after each character are the prefix of the ids of
    that text followed by any of about 6,000 continuations (vocabulary tokens of letters with Han or kana,
    single kana and Han, Latin): what the proof says, checked against the real tokenizer."""
    ours, _ = tokenizers
    tails = continuations(ours)
    assert len(tails) > 5000
    for text in [t for t in EXHAUSTIVE if any(unspaced(c) for c in t)][::2]:
        s, ids = StreamingTokenizer(ours, lookahead=10**9), []
        for i, ch in enumerate(text, 1):
            ids += s.feed(ch)
            for tail in tails:
                assert ours.encode(text[:i] + tail)[:len(ids)] == ids, (text[:i], tail)


def test_words_streamed_in_tokens_commit_a_token_once_the_letters_after_it_rule_out_longer_ones(tokenizers):
    """An LLM streams a long word in several tokens (" trans", "atl", "antic"): " trans" is committed on the next
    delta, once "atl" rules out every token that could cover its end, not when the word ends (" tele"); "atl",
    whose proof would look at more than WORD_PROOF_BUDGET tokens, and a word that a longer token may still be
    ("Hel" of "Hello") wait for the word's end."""
    from talkgate.loadgen.measure import token_deltas
    ours, _ = tokenizers
    text = "The first transatlantic telegraph cable"
    s = StreamingTokenizer(ours)
    got = [ours.decode(s.feed(d)) for d in token_deltas(text)]
    assert token_deltas(text)[:6] == ["The", " first", " trans", "atl", "antic", " tele"]
    assert got == ["", "The", " first", " trans", "", "atlantic", "", " telegraph"]
    assert ours.decode(s.finish()) == " cable"
    assert StreamingTokenizer(ours).feed("Hel") == []


def latin_continuations(tok: QwenTokenizer) -> list[str]:
    """What can follow a Latin word: vocabulary tokens of ASCII letters (every 12th, for time), with a space before
    them (the next word) or not (the same word), punctuation, a combining mark, a digit."""
    from talkgate.synth.tokenizer import BYTE_OF
    words = []
    for token in tok.sorted_vocab:
        text = bytes(BYTE_OF[c] for c in token).decode("utf-8", errors="replace")
        if text.isascii() and text.strip().isalpha():
            words.append(text)
    return ["", ".", "'s", "-", "\u0301", "1"] + words[::12]


def test_committed_ids_of_latin_words_hold_under_every_continuation(tokenizers):
    """English streamed one character at a time: the ids committed after each character, inside words too, are the
    prefix of the ids of that text followed by any of about 5,800 continuations (tokens of letters, as the same word
    or the next, punctuation, a combining mark, a digit)."""
    ours, _ = tokenizers
    tails = latin_continuations(ours)
    assert len(tails) > 5000
    for text in ["The first transatlantic cable", "Unbelievably, internationalization", "It's reconsidered"]:
        s, ids = StreamingTokenizer(ours, lookahead=10**9), []
        for i, ch in enumerate(text, 1):
            ids += s.feed(ch)
            for tail in tails:
                assert ours.encode(text[:i] + tail)[:len(ids)] == ids, (text[:i], tail)


def test_byte_level_map_is_the_pre_tokenizers():
    """BYTE_OF (may_cross reads the bytes of a token's tail through it) inverts the byte-level pre-tokenizer."""
    from tokenizers import pre_tokenizers

    from talkgate.synth.tokenizer import BYTE_OF
    assert sorted(BYTE_OF) == sorted(pre_tokenizers.ByteLevel.alphabet()) and sorted(BYTE_OF.values()) == list(
        range(256))
    level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    text = "".join(map(chr, range(128))) + "éß天カ🙂\u0301\U0010fffd" + "".join(chr(c) for c in range(0x80, 0x800, 7))
    mapped = "".join(piece for piece, _ in level.pre_tokenize_str(text))
    assert bytes(BYTE_OF[c] for c in mapped) == text.encode("utf-8")
