"""The load generator's text pacing against what the model needs: an infinitely fast server keeps up.

The model hears one text token per 80 ms frame: frame k can be computed once the server has committed
text token k (or the text has ended). So whether a benchmark's "0 underruns" can be met at all depends
on the pace of its text, not on the server. These tests run no server and no threads."""
from __future__ import annotations

import re

from bench.text_slack import ideal_server_underruns
from talkgate.loadgen import load
from talkgate.loadgen import measure
from talkgate.loadgen import prompts
from talkgate.loadgen.measure import text_slack


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


def test_slack_names_the_prompts_a_real_server_cannot_keep_up_with_unheld():
    """loadgen/measure.py text_slack (bench/text_slack.py): "下面是本周末..." commits "本" only once "的" proves that
    "本周" is not one token, 120 ms in, exactly when an ideal server's frame 1 plays. "The first transatlantic ..."
    commits " trans" once "atl" rules out every longer token (synth/tokenizer.py, the merges), not when " tele" ends
    the word (200 ms in, when frame 2 plays), and keeps 40 ms, as a text of short words does at every frame."""
    rate = load.Config().tokens_per_second
    text = {p["id"]: p["text"] for p in prompts.select()}
    assert text_slack(text["zh-long-00"], rate) == (0.0, 1)
    assert text_slack(text["en-long-06"], rate) == (40.0, 1)
    assert text_slack(text["en-long-00"], rate) == (40.0, 1)


def test_proofs_inside_words_only_ever_give_a_frame_more_time(monkeypatch):
    """synth/tokenizer.py proves boundaries inside words from a stream's second id on, never its first: a later id
    committed sooner only gives its own frame more time, where a first id committed sooner would move every later
    frame's due time up (it left "Достопримечательности ..." 120 ms short at frame 2, and three more texts short or
    with none). Over the bench's prompts and sentences in the model's other languages, each text's slack with the
    proofs is at least its slack without them, and en-long-06's grows."""
    import talkgate.synth.tokenizer as tokenizer
    from bench.tokenizer import OTHER_LANGUAGES
    rate = load.Config().tokens_per_second
    texts = {p["id"]: p["text"] for p in prompts.select()}
    texts.update({f"{lang}-{i}": t for lang, ts in OTHER_LANGUAGES.items() for i, t in enumerate(ts)})
    texts["ru-long-word"] = "Достопримечательности города открыты ежедневно."
    texts["de-long-word"] = "Donaudampfschifffahrtsgesellschaft fährt heute."
    with_proofs = {k: text_slack(t, rate)[0] for k, t in texts.items()}
    monkeypatch.setattr(tokenizer, "EARLY_WORD_IDS", 1)         # no id is in the window
    without = {k: text_slack(t, rate)[0] for k, t in texts.items()}
    assert all(with_proofs[k] >= without[k] for k in texts), {k: (with_proofs[k], without[k]) for k in texts
                                                              if with_proofs[k] < without[k]}
    assert with_proofs["en-long-06"] > without["en-long-06"]
    assert min(with_proofs.values()) >= 0
