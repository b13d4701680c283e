"""Qwen text tokenizer: same ids as transformers' for the same files; streaming commits only final ids."""
from __future__ import annotations

import random
import shutil

import pytest

from talkgate.synth.checkpoint import _qwen_tokenizer_dir
from talkgate.synth.tokenizer import QwenTokenizer, StreamingTokenizer

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
    "<|im_start|>assistant\nspecial tokens inside<|im_end|>\n<tts_pad> and <|im_e",
    "Punctuation!!! ... ??? --- (parentheses) [brackets] {braces} \"quotes\" 'single'",
    "URL https://example.com/path?q=1&x=2 and email a.b@c.de",
    "Числа и слова по-русски, Ελληνικά, العربية.",
]


@pytest.fixture(scope="module")
def tokenizers(tiny_checkpoint):
    from transformers import AutoTokenizer
    return QwenTokenizer.from_dir(tiny_checkpoint), AutoTokenizer.from_pretrained(str(tiny_checkpoint))


def test_ids_equal_transformers_from_vocab_and_merges(tokenizers, tiny_checkpoint):
    ours, theirs = tokenizers
    assert not (tiny_checkpoint / "tokenizer.json").exists()      # the vocab.json + merges.txt path
    for text in TEXTS:
        assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text


def test_tts_tokens_and_template_ids(tokenizers):
    ours, theirs = tokenizers
    for i, content in [(151669, "<|audio_start|>"), (151671, "<tts_pad>"), (151672, "<tts_text_bos>"),
                       (151673, "<tts_text_eod>"), (151675, "<|audio_pad|>")]:
        assert ours.token_id(content) == i == theirs.convert_tokens_to_ids(content)
    ids = ours.encode("<|im_start|>assistant\nHi.<|im_end|>\n<|im_start|>assistant\n")
    assert ids[:3] == [151644, 77091, 198] and ids[-5:] == [151645, 198, 151644, 77091, 198]


def test_tokenizer_json_path_equals_transformers(tmp_path):
    from transformers import AutoTokenizer
    src = _qwen_tokenizer_dir()
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


def test_streaming_equals_whole_text_for_random_splits(tokenizers):
    ours, _ = tokenizers
    rng = random.Random(0)
    corpus = TEXTS + [" ".join(rng.sample(TEXTS, 3)) for _ in range(10)]
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
    tails = ["", "s", "ll", " x", "\n", "  ", "\u0301", "end|>", "1", "!", "你", "🙂", "<|im_end|>"]
    for text in TEXTS:
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
