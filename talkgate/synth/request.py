"""Per-context CPU state: what the scheduler and the engine loop know about one context (no tensors).

Streaming text input (the model's own rule, see docs/engine.md): the Talker reads one text track id per
position: the track is `text_lead` (an ICL voice's reference text ids), the text's tokens, tts_eos, then
tts_pad. The prefill carries the track's first `prefill_text` ids (1, or 1 + the reference frames of an ICL
voice); frame k >= 1 is computed from frame k-1's codes plus track id prefill_text - 1 + k. So a context can
make frame k as soon as that id is committed, or once the text has ended: `ready` is exactly that.

A flush (FlushText) speaks the text so far and keeps the context open: while `flushing`, the track runs on
past the text as at its end (tts_eos, then tts_pad) until the model's eos (or the flush's length, see
`flush_limit`); then those ids become part of `text_ids` (`spoken`), so that text sent later is read from
the next frame on, in the same context. Commands that come while flushing are `held` until then.
"""
from __future__ import annotations

import enum
import re
from collections import deque
from dataclasses import dataclass, field

from talkgate.synth.api import FRAME_MS, ContextParams

FRAME_S = FRAME_MS / 1000


class Status(enum.Enum):
    WAITING = "waiting"      # opened, no KV yet: prefilled once its first text token is committed
    RUNNING = "running"      # prefilled: one frame per step while its next text token is there
    FINISHED = "finished"    # done, failed or cancelled: its slot is free


@dataclass(eq=False)
class Request:
    context: int                   # the id its client chose
    client: int                    # the engine client that opened it
    slot: int
    params: ContextParams
    prompt: object                 # synth.prompt's resolved prompt (voice, language, instructions)
    frame_limit: int               # capacity of the slot (max_frames_per_context) or fixed_frames
    budget_factor: float           # runaway guard: frames <= max(factor * frames_for_text, budget_min)
    budget_min: int
    text_lead: tuple[int, ...] = ()  # text track ids before the text: an ICL voice's reference text
    prefill_text: int = 1            # text track ids the prefill carries (synth.prompt.Prompt.text_positions)
    length_rule: bool = False      # untrained checkpoint: the text-length rule ends it, eos is never sampled
    # the track after the lead: the text's tokens and, after each spoken flush, the tts_eos / tts_pad ids read
    text_ids: list[int] = field(default_factory=list)
    text_ended: bool = False
    text_seconds: float = 0.0      # the frames_for_text rule's seconds, accumulated over the deltas
    flushing: bool = False         # a flush is being spoken: the track runs on past the text
    held: deque = field(default_factory=deque)   # (op, (ids, seconds)) that came while flushing
    spoken_upto: int = 0           # len(text_ids) when the last flush was spoken: text after it is new
    spoken_reason: str = "eos"     # how the last flush ended (what an EndText with nothing new ends with)
    status: Status = Status.WAITING
    prompt_len: int = 0            # Talker positions used by the prefill
    prefixed: bool = False         # its prompt but the last position is in its slot from its open (runner): frame 0
                                   # is a Talker step at the prompt's last position
    frames: int = 0                # frames generated (emitted or not) so far
    t_ready: float | None = None   # when frame 0 could first be computed: its audio deadline starts here
    cancelled: bool = False        # set under the engine lock: no event is emitted once it is True
    # a traced context (params.trace_latency): its first frame's api.ENGINE_STAGES times so far, until they go out
    # with that frame (then None); None for every other context, so an untraced one costs an `is None` per stage
    trace: list | None = None
    freed: bool = False            # its slot is given back (finished, failed or cancelled): set once
    pages: list[int] = field(default_factory=list)   # its Talker KV pages, in position order (synth/pages.py)

    @property
    def ready(self) -> bool:
        """Its next frame can be computed now (its text track id is committed, or the text ended or is
        being flushed)."""
        return (self.text_ended or self.flushing
                or len(self.text_lead) + len(self.text_ids) > self.prefill_text - 1 + self.frames)

    @property
    def next_position(self) -> int:
        """The Talker position its next frame writes: the prompt's last for frame 0 (a prefill writes those before it),
        then one more a frame."""
        prompt_len = self.prompt_len or (self.prompt.length if self.prompt is not None else 1)
        return max(prompt_len + self.frames - 1, 0)

    @property
    def has_new_text(self) -> bool:
        """Text came since the last flush was spoken (or since the start)."""
        return len(self.text_ids) > self.spoken_upto

    def spoken(self, reason: str, tts_eos: int, tts_pad: int) -> None:
        """The flush is spoken: the tts_eos / tts_pad ids the model read past the text join the track, so
        the next text token is the next frame's."""
        self.flushing = False
        past = self.prefill_text - 1 + self.frames - len(self.text_lead) - len(self.text_ids)
        if past > 0:
            self.text_ids += [tts_eos] + [tts_pad] * (past - 1)
        self.spoken_upto, self.spoken_reason = len(self.text_ids), reason

    @property
    def deadline(self) -> float:
        """When the client's audio runs dry if the next frame is late: start + audio emitted so far."""
        return (self.t_ready or 0.0) + self.frames * FRAME_S

    def track_id(self, k: int, tts_eos: int, tts_pad: int) -> int:
        """Text track id k: text_lead, then the text's tokens, tts_eos once, then tts_pad."""
        lead = len(self.text_lead)
        if k < lead:
            return self.text_lead[k]
        k, n = k - lead, len(self.text_ids)
        return self.text_ids[k] if k < n else tts_eos if k == n else tts_pad

    def next_text_id(self, tts_eos: int, tts_pad: int) -> int:
        """The text track id that goes with frame `frames` (frames >= 1)."""
        return self.track_id(self.prefill_text - 1 + self.frames, tts_eos, tts_pad)

    def prefill_track(self, tts_eos: int, tts_pad: int) -> list[int]:
        """The text track ids of the prefill's text positions."""
        return [self.track_id(k, tts_eos, tts_pad) for k in range(self.prefill_text)]

    @property
    def samples_eos(self) -> bool:
        """Whether the model's eos may end it: not with a fixed length (fixed_frames or the text rule)."""
        return self.params.fixed_frames is None and not self.length_rule

    def flush_limit(self) -> tuple[int, str]:
        """While flushing: (frames at which the text so far counts as spoken, reason), unless the model's
        eos comes first: the text-length rule of the text so far where the length is not the model's
        (an untrained checkpoint, fixed_frames), else the runaway guard's budget for it."""
        n = frames_for_seconds(self.text_seconds)
        if not self.samples_eos:
            return n, "length_rule"
        return max(round(self.budget_factor * n), self.budget_min), "budget"

    def limit(self) -> tuple[int, str]:
        """(frames at which it stops, reason): "length" for fixed_frames; once the text has ended,
        "length_rule" for the text-length rule, else "budget" (runaway guard); "budget" for the slot's
        capacity. The text rule's length is known only when the text has ended (streamed deltas count)."""
        fixed = self.params.fixed_frames
        if fixed is not None and fixed <= self.frame_limit:
            return fixed, "length"
        if fixed is None and self.text_ended:
            if self.length_rule:
                n = frames_for_seconds(self.text_seconds)
                return (n, "length_rule") if n <= self.frame_limit else (self.frame_limit, "budget")
            budget = max(round(self.budget_factor * frames_for_seconds(self.text_seconds)), self.budget_min)
            return min(budget, self.frame_limit), "budget"
        return self.frame_limit, "budget"


# kana, CJK ideographs (extension A, unified, compatibility) and Hangul syllables: the rule's "CJK" characters
CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")


def text_seconds(text: str) -> float:
    """Spoken seconds of text by the documented rule: 0.06 s per non-CJK character, 0.25 s per CJK one."""
    cjk = len(CJK.findall(text))         # on every request's text: 0.5 us for 110 characters, a loop 16
    return 0.25 * cjk + 0.06 * (len(text) - cjk)


def frames_for_seconds(seconds: float) -> int:
    return max(4, round(12.5 * seconds))


def frames_for_text(text: str) -> int:
    """Frames a text of this length is spoken in (benchmarks with random weights fix the length so):
    round(12.5 * seconds), seconds = 0.06 per non-CJK character + 0.25 per CJK character, at least 4."""
    return frames_for_seconds(text_seconds(text))
