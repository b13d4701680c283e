"""Estimated character and word timings of an utterance's audio (ElevenLabs alignment, Cartesia
word timestamps).

The engine does not know when each character is spoken, so these times are an ESTIMATE: the text
handed to the engine is laid out at a fixed speaking rate (`CHARS_PER_SECOND`) over the audio as it
is produced, never ahead of the audio and never before the text arrived. Characters still unplaced
when a segment's audio ends are reported at its end with zero duration.

ElevenLabs clients (pipecat) advance their word clock by each message's alignment span
(start + duration of its last character), so each reported span starts where the previous one ended
and its last character ends exactly at the end of the audio chunk it rides with: the clients' clock
stays on the audio's clock even though chunks without characters carry no alignment.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

CHARS_PER_SECOND = 14.0     # typical conversational English, ~150 words per minute


@dataclass(frozen=True)
class CharSpan:
    """Characters with times (ms, integers) relative to the end of the previous span."""

    chars: list[str]
    starts_ms: list[int]
    durations_ms: list[int]
    origin_ms: int = 0      # where the previous span ended: the times above count from here

    def as_elevenlabs(self) -> dict:
        return {"chars": self.chars, "charStartTimesMs": self.starts_ms, "charDurationsMs": self.durations_ms}

    def as_elevenlabs_http(self) -> dict:
        """ElevenLabs' HTTP form: seconds from the start of the utterance's audio."""
        starts = [self.origin_ms + s for s in self.starts_ms]
        return {"characters": self.chars, "character_start_times_seconds": [s / 1000 for s in starts],
                "character_end_times_seconds": [(s + d) / 1000 for s, d in zip(starts, self.durations_ms)]}


@dataclass(frozen=True)
class Word:
    text: str
    start_s: float      # from the start of the utterance's audio
    end_s: float


class Timeline:
    def __init__(self, chars_per_second: float = CHARS_PER_SECOND, speed: float = 1.0):
        """`speed`: the delivered audio's tempo (sessions/session.py): the characters go that much faster."""
        self.ms_per_char = 1000.0 / (chars_per_second * speed)
        self.pending: deque[str] = deque()    # characters handed to the engine, not yet placed
        self.audio_ms = 0.0         # audio so far
        self.cursor_ms = 0.0        # estimated start of the next character
        self.reported_ms = 0        # end of the last reported span
        self._word = ""
        self._word_start = 0.0
        self._word_end = 0.0

    def add_text(self, text: str) -> None:
        self.pending.extend(text)

    def audio(self, duration_ms: float) -> tuple[CharSpan | None, list[Word]]:
        """Audio of this length follows: the characters it (estimatedly) speaks, and the words completed."""
        start, end = self.audio_ms, self.audio_ms + duration_ms
        self.audio_ms = end
        self.cursor_ms = max(self.cursor_ms, start)     # text that came after its audio had started
        placed: list[tuple[str, float]] = []
        while self.pending and self.cursor_ms < end:
            placed.append((self.pending.popleft(), self.cursor_ms))
            self.cursor_ms += self.ms_per_char
        return self._span(placed, end)

    def end_segment(self) -> tuple[CharSpan | None, list[Word]]:
        """The segment's audio is over: report what is left at its end, and complete the last word."""
        placed = [(c, self.audio_ms) for c in self.pending]
        self.pending.clear()
        self.cursor_ms = self.audio_ms
        span, words = self._span(placed, self.audio_ms)
        if self._word:
            words.append(Word(self._word, round(self._word_start / 1000, 3), round(self._word_end / 1000, 3)))
            self._word = ""
        return span, words

    def _span(self, placed: list[tuple[str, float]], end_ms: float) -> tuple[CharSpan | None, list[Word]]:
        if not placed:
            return None, []
        origin = self.reported_ms
        starts = [max(origin, round(t)) for _, t in placed]
        ends = starts[1:] + [max(starts[-1], round(end_ms))]   # the last character reaches the chunk's end
        self.reported_ms = ends[-1]
        words = []
        for (c, _), s, e in zip(placed, starts, ends):
            if c.isspace():
                if self._word:
                    words.append(Word(self._word, round(self._word_start / 1000, 3), round(self._word_end / 1000, 3)))
                    self._word = ""
            else:
                if not self._word:
                    self._word_start = s
                self._word += c
                self._word_end = e
        return CharSpan([c for c, _ in placed], [s - origin for s in starts],
                        [e - s for s, e in zip(starts, ends)], origin), words
