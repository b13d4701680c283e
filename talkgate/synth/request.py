"""Per-context CPU state: what the scheduler and the engine loop know about one context (no tensors).

Streaming text input (the model's own rule, see docs/engine.md): frame k is computed from frame k-1's
codes plus text token k; after the last token comes tts_eos, then tts_pad. Frame 0 comes from the
prefill, whose last position carries text token 0. So a context can make frame k as soon as token k
is committed, or once the text has ended: `ready` is exactly that.
"""
from __future__ import annotations

import enum
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
    text_ids: list[int] = field(default_factory=list)
    text_ended: bool = False
    text_seconds: float = 0.0      # the frames_for_text rule's seconds, accumulated over the deltas
    status: Status = Status.WAITING
    prompt_len: int = 0            # Talker positions used by the prefill
    frames: int = 0                # frames generated (emitted or not) so far
    t_ready: float | None = None   # when frame 0 could first be computed: its audio deadline starts here
    cancelled: bool = False        # set under the engine lock: no event is emitted once it is True
    freed: bool = False            # its slot is given back (finished, failed or cancelled): set once

    @property
    def ready(self) -> bool:
        """Its next frame can be computed now (text token `frames` is committed, or the text ended)."""
        return self.text_ended or len(self.text_ids) > self.frames

    @property
    def deadline(self) -> float:
        """When the client's audio runs dry if the next frame is late: start + audio emitted so far."""
        return (self.t_ready or 0.0) + self.frames * FRAME_S

    def next_text_id(self, tts_eos: int, tts_pad: int) -> int:
        """The text token that goes with frame `frames` (token k, then tts_eos once, then tts_pad)."""
        k, n = self.frames, len(self.text_ids)
        return self.text_ids[k] if k < n else tts_eos if k == n else tts_pad

    def limit(self) -> tuple[int, str]:
        """(frames at which it stops, reason): "length" for fixed_frames, else "budget"."""
        fixed = self.params.fixed_frames
        if fixed is not None and fixed <= self.frame_limit:
            return fixed, "length"
        if fixed is None and self.text_ended:
            budget = max(round(self.budget_factor * frames_for_seconds(self.text_seconds)), self.budget_min)
            return min(budget, self.frame_limit), "budget"
        return self.frame_limit, "budget"


def is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (0x3040 <= o <= 0x30FF or 0x3400 <= o <= 0x4DBF or 0x4E00 <= o <= 0x9FFF
            or 0xF900 <= o <= 0xFAFF or 0xAC00 <= o <= 0xD7AF)


def text_seconds(text: str) -> float:
    """Spoken seconds of text by the documented rule: 0.06 s per non-CJK character, 0.25 s per CJK one."""
    cjk = sum(1 for ch in text if is_cjk(ch))
    return 0.25 * cjk + 0.06 * (len(text) - cjk)


def frames_for_seconds(seconds: float) -> int:
    return max(4, round(12.5 * seconds))


def frames_for_text(text: str) -> int:
    """Frames a text of this length is spoken in (benchmarks with random weights fix the length so):
    round(12.5 * seconds), seconds = 0.06 per non-CJK character + 0.25 per CJK character, at least 4."""
    return frames_for_seconds(text_seconds(text))
