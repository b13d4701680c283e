"""The SSML subset talkgate speaks (ElevenLabs `enable_ssml_parsing`), read incrementally from streamed text.

    reader = SsmlReader()
    for item in reader.feed('Hi <break time="500ms"/> there'):   # text deltas; a tag may span two of them
        ...     # str: text to speak; Pause(ms): silence there; Rate(factor): the tempo from there on
    reader.finish()                 # the end of input: an unclosed tag is an error

- `<speak>` ... `</speak>`: dropped (the text inside is spoken).
- `<break time="500ms"/>`, `time="1.5s"`, `strength="none|x-weak|weak|medium|strong|x-strong"`: Pause, that much
  silence after the audio of the text before it (at most 5 s, ElevenLabs' limit; the strengths 0, 100, 200, 400,
  700, 1000 ms).
- `<prosody rate="x-slow|slow|medium|fast|x-fast|N%">` ... `</prosody>`: Rate, the pitch-kept tempo times 0.6,
  0.8, 1, 1.25, 1.5 or N/100 (20% to 400%) from there to its end tag (nested rates multiply).
- `<say-as interpret-as="characters|spell-out|verbatim|digits">X</say-as>`: X spelled, its characters (or digits)
  one by one, separated by spaces.
- any other `interpret-as`, any other tag (`<phoneme>`, `<emphasis>`, ...): SsmlError, not spoken; the client is told.
- `&amp; &lt; &gt; &quot; &apos;`: the character.

Pure: no I/O. A SsmlError says what was wrong; the reader has dropped the bad tag and goes on.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass

MAX_BREAK_MS = 5000                 # ElevenLabs' longest break
STRENGTHS = {"none": 0, "x-weak": 100, "weak": 200, "medium": 400, "strong": 700, "x-strong": 1000}
RATES = {"x-slow": 0.6, "slow": 0.8, "medium": 1.0, "fast": 1.25, "x-fast": 1.5}
SPELLED = ("characters", "spell-out", "verbatim", "digits")
MAX_TAG_CHARS = 200                 # a '<' not closed within this many characters is not a tag in progress
_TAG = re.compile(r"<\s*(/?)\s*([A-Za-z][\w:-]*)((?:\s+[\w:-]+\s*=\s*(?:\"[^\"]*\"|'[^']*'))*)\s*(/?)\s*>\Z")
_ATTR = re.compile(r"([\w:-]+)\s*=\s*(?:\"([^\"]*)\"|'([^']*)')")
_TIME = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(ms|s)\Z")
_PERCENT = re.compile(r"([0-9]+(?:\.[0-9]+)?)%\Z")


class SsmlError(ValueError):
    pass


@dataclass(frozen=True)
class Pause:
    ms: float


@dataclass(frozen=True)
class Rate:
    factor: float           # of the context's own speed


class SsmlReader:
    def __init__(self):
        self._partial = ""          # a tag begun and not yet closed ('<' ... without '>')
        self._rates: list[float] = []
        self._spell: str | None = None      # inside say-as: its text, spoken spelled at its end tag

    def feed(self, text: str) -> list:
        out: list = []
        text = self._partial + text
        self._partial = ""
        while text:
            lt = text.find("<")
            if lt < 0:
                self._text(out, text)
                break
            if lt:
                self._text(out, text[:lt])
            gt = text.find(">", lt)
            if gt < 0:
                if len(text) - lt > MAX_TAG_CHARS:
                    raise SsmlError(f"a tag is not closed within {MAX_TAG_CHARS} characters")
                self._partial = text[lt:]
                break
            tag, text = text[lt:gt + 1], text[gt + 1:]
            self._tag(out, tag)
        return _merged(out)

    def finish(self) -> list:
        if self._partial:
            raise SsmlError(f"the input ends inside a tag: {self._partial[:40]!r}")
        if self._spell is not None:
            raise SsmlError("the input ends inside <say-as>")
        return []

    def _text(self, out: list, text: str) -> None:
        text = html.unescape(text)
        if self._spell is not None:
            self._spell += text
        elif text:
            out.append(text)

    def _tag(self, out: list, tag: str) -> None:
        m = _TAG.match(tag)
        if m is None:
            raise SsmlError(f"not a well-formed tag: {tag[:40]!r}")
        closing, name, attrs, empty = m.group(1) == "/", m.group(2).lower(), m.group(3), m.group(4) == "/"
        attr = {k.lower(): a or b for k, a, b in _ATTR.findall(attrs)}
        if name == "speak":
            return
        if name == "break" and not closing:
            out.append(Pause(_break_ms(attr)))
        elif name == "prosody" and not closing and not empty:
            if "rate" not in attr or set(attr) - {"rate"}:
                raise SsmlError("<prosody> takes rate only (pitch and volume are not applied)")
            self._rates.append(_rate(attr["rate"]))
            out.append(Rate(_product(self._rates)))
        elif name == "prosody" and closing:
            if not self._rates:
                raise SsmlError("</prosody> without <prosody>")
            self._rates.pop()
            out.append(Rate(_product(self._rates)))
        elif name == "say-as" and not closing and not empty:
            kind = attr.get("interpret-as")
            if kind not in SPELLED:
                raise SsmlError(f"<say-as interpret-as={kind!r}> is not supported: use {', '.join(SPELLED)}")
            if self._spell is not None:
                raise SsmlError("<say-as> inside <say-as>")
            self._spell = ""
        elif name == "say-as" and closing:
            if self._spell is None:
                raise SsmlError("</say-as> without <say-as>")
            spelled = " ".join(ch for ch in self._spell if not ch.isspace())
            self._spell = None
            if spelled:
                out.append(f" {spelled} ")
        else:
            raise SsmlError(f"<{'/' if closing else ''}{name}> is not supported: talkgate speaks <break>, "
                            "<prosody rate>, <say-as interpret-as=characters|spell-out|verbatim|digits> and <speak>")


def _break_ms(attr: dict) -> float:
    if "time" in attr:
        m = _TIME.match(attr["time"].strip())
        if m is None:
            raise SsmlError(f"<break time={attr['time']!r}>: use milliseconds (500ms) or seconds (1.5s)")
        ms = float(m.group(1)) * (1 if m.group(2) == "ms" else 1000)
        if ms > MAX_BREAK_MS:
            raise SsmlError(f"<break> of {ms:g} ms: at most {MAX_BREAK_MS} ms")
        return ms
    strength = attr.get("strength", "medium")
    if strength not in STRENGTHS:
        raise SsmlError(f"<break strength={strength!r}>: use {', '.join(STRENGTHS)}")
    return float(STRENGTHS[strength])


def _rate(value: str) -> float:
    value = value.strip().lower()
    if value in RATES:
        return RATES[value]
    m = _PERCENT.match(value)
    if m is None or not 20 <= float(m.group(1)) <= 400:
        raise SsmlError(f"<prosody rate={value!r}>: use x-slow, slow, medium, fast, x-fast or 20% to 400%")
    return float(m.group(1)) / 100


def _product(rates: list[float]) -> float:
    out = 1.0
    for r in rates:
        out *= r
    return out


def _merged(items: list) -> list:
    """Adjacent text joined, adjacent pauses summed."""
    out: list = []
    for item in items:
        if out and isinstance(item, str) and isinstance(out[-1], str):
            out[-1] += item
        elif out and isinstance(item, Pause) and isinstance(out[-1], Pause):
            out[-1] = Pause(out[-1].ms + item.ms)
        else:
            out.append(item)
    return out
