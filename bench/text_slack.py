"""How much time the load generator's streamed text leaves a server, prompt by prompt (issues 44 and 45).

    python -m bench.text_slack [--rate 25] [--show 12]

The model hears one text token per 80-ms frame: frame k can be made once the server has committed text token k
(synth/tokenizer.py StreamingTokenizer proves a token complete only when the text after it does) or the text has
ended. With the text paced as `talkgate bench` paces it (one token a delta, --tokens-per-second), an infinitely fast
server that makes frame 0 the moment token 0 is committed has, at frame k, first-token commit + 80 k - commit of
token k to spare: the least of those over k >= 1 is the prompt's slack (loadgen/measure.py text_slack), what a real
server's time from a commit to its audio at the player may take before that player runs dry. 0 means any real
server underruns on that prompt unless its first audio waits (sessions/session.py FIRST_HOLD_S holds a first token
that its own delta committed). `talkgate bench` prints the slack of the prompts with underrun requests. No server.
"""
from __future__ import annotations

import argparse
import itertools

from talkgate.loadgen import load, prompts
from talkgate.loadgen.measure import FRAME_MS, frame_ready_ms, least_slack, simulate_player, token_deltas


def ideal_server_underruns(text: str, deltas: list[str], rate: float) -> int:
    """Underruns of the simulated player fed by an infinitely fast server: each frame the moment it can be made
    (frame_ready_ms), no earlier than the one before."""
    ready = itertools.accumulate(frame_ready_ms(text, deltas, rate), max)
    return simulate_player([(t, FRAME_MS) for t in ready])[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=load.Config().tokens_per_second, help="tokens a second")
    p.add_argument("--show", type=int, default=12, help="the prompts with the least slack")
    a = p.parse_args(argv)
    rows = []
    for prompt in prompts.select():
        ready = frame_ready_ms(prompt["text"], token_deltas(prompt["text"]), a.rate)
        rows.append((*least_slack(ready), prompt["id"], ready[:4]))
    rows.sort()
    print(f"{a.rate:g} tokens a second; {sum(r[0] <= 0 for r in rows)} of {len(rows)} prompts with no slack")
    print("| prompt | slack ms | at frame | frames 0-3 can be made at ms |")
    print("| --- | --- | --- | --- |")
    for ms, frame, pid, first in rows[:a.show]:
        print(f"| {pid} | {ms:.0f} | {frame} | {', '.join(f'{t:.0f}' for t in first)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
