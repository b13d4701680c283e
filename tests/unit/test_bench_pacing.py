"""The load generator's text pacing against what the model needs: an infinitely fast server keeps up.

The model hears one text token per 80 ms frame: frame k can be computed once the server has committed
text token k (or the text has ended). So whether a benchmark's "0 underruns" can be met at all depends
on the pace of its text, not on the server. These tests run no server and no threads."""
from __future__ import annotations

import re

from talkgate.loadgen import load
from talkgate.loadgen import measure
from talkgate.loadgen import prompts
from talkgate.synth.request import frames_for_text
from talkgate.synth.tokenizer import StreamingTokenizer

FRAME_MS = 80.0


def commit_times(deltas: list[str], rate: float) -> tuple[list[float], float]:
    """Delta i sent at i / rate s, as load.native_request does, into the server's StreamingTokenizer
    -> (ms at which each token is committed, ms at which the text ends: the flush after the last delta)."""
    stream = StreamingTokenizer(measure.qwen_tokenizer())
    times = []
    for i, delta in enumerate(deltas):
        times += [1000 * i / rate] * len(stream.feed(delta))
    end = 1000 * (len(deltas) - 1) / rate
    return times + [end] * len(stream.finish()), end


def ideal_server_underruns(text: str, deltas: list[str], rate: float) -> int:
    """Underruns of the simulated player fed by an infinitely fast server: frame k the moment token k is
    committed, frames past the last token at the text's end, each frame no earlier than the one before."""
    times, end = commit_times(deltas, rate)
    chunks, ready = [], 0.0
    for k in range(frames_for_text(text)):
        ready = max(ready, times[k] if k < len(times) else end)
        chunks.append((ready, FRAME_MS))
    return measure.simulate_player(chunks)[0]


def old_deltas(text: str) -> list[str]:
    """The pacing this benchmark had before: one Han character a delta (anything else in runs)."""
    return re.findall(r"[\u4e00-\u9fff]|[^\u4e00-\u9fff]+", text)


def test_default_pacing_can_be_played_without_underruns():
    rate = load.Config().tokens_per_second
    for p in prompts.select():                   # every language and bucket
        assert ideal_server_underruns(p["text"], measure.token_deltas(p["text"]), rate) == 0, p["id"]


def test_old_pacing_of_chinese_could_not_be_met_by_any_server():
    """Why the pacing is in tokens: 20 Han characters a second commit only 11-15 tokens a second (two
    characters are often one token), about the 12.5 the model speaks and below it in places, so even an
    ideal server underruns on most Chinese texts (9 of the 10 of the medium bucket)."""
    texts = [p["text"] for p in prompts.select("zh", "medium")]
    assert all("".join(old_deltas(text)) == text for text in texts)
    underrunning = [text for text in texts if ideal_server_underruns(text, old_deltas(text), 20.0) > 0]
    assert len(underrunning) > len(texts) / 2
