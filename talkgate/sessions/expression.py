"""The vendors' emotion and style controls as Qwen3-TTS instructions: the one mapping table (docs/compat.md
"Emotion and style").

Qwen3-TTS 1.7B CustomVoice and VoiceDesign take a natural-language instruction (tone, emotion, pace) before the
text; 0.6B CustomVoice ignores one (as the reference does) and Base refuses one (ModelInfo.takes_instructions). A
vendor's emotion or style becomes a phrase here; the session joins the phrases of a context into one instruction
after the client's own instructions (Session.start), and refuses a context with phrases on a checkpoint that takes no
instructions (`expression_unsupported`), so an emotion the client asked for is never dropped silently. The neutral
settings (Cartesia `neutral`, ElevenLabs `style` 0, Deepgram `expressivity` 0) make no phrase and work everywhere.
Pure: no I/O.
"""
from __future__ import annotations

from talkgate.sessions.fields import SessionError, show

# Cartesia's generation_config.emotion (Sonic-3's list, as the cartesia SDK types it) -> the instruction phrase
EMOTIONS = {
    "neutral": None,
    "happy": "happy", "excited": "excited", "enthusiastic": "enthusiastic", "elated": "elated",
    "euphoric": "euphoric", "triumphant": "triumphant", "amazed": "amazed", "surprised": "surprised",
    "flirtatious": "flirtatious", "curious": "curious", "content": "content", "peaceful": "peaceful",
    "serene": "serene", "calm": "calm", "grateful": "grateful", "affectionate": "affectionate",
    "trust": "trusting", "sympathetic": "sympathetic", "anticipation": "expectant",
    "mysterious": "mysterious", "angry": "angry", "mad": "mad", "outraged": "outraged", "frustrated": "frustrated",
    "agitated": "agitated", "threatened": "threatened", "disgusted": "disgusted", "contempt": "contemptuous",
    "envious": "envious", "sarcastic": "sarcastic", "ironic": "ironic", "sad": "sad", "dejected": "dejected",
    "melancholic": "melancholic", "disappointed": "disappointed", "hurt": "hurt", "guilty": "guilty",
    "bored": "bored", "tired": "tired", "rejected": "rejected", "nostalgic": "nostalgic", "wistful": "wistful",
    "apologetic": "apologetic", "hesitant": "hesitant", "insecure": "insecure", "confused": "confused",
    "resigned": "resigned", "anxious": "anxious", "panicked": "panicked", "alarmed": "alarmed", "scared": "scared",
    "proud": "proud", "confident": "confident", "distant": "distant", "skeptical": "skeptical",
    "contemplative": "contemplative", "determined": "determined",
}
# ElevenLabs voice_settings.style (0 to 1, "style exaggeration"): the least value of each band -> its phrase
STYLE_BANDS = ((0.67, "very expressively, with exaggerated emotion"), (0.34, "expressively"),
               (1e-9, "slightly more expressively than usual"))
# Deepgram Flux `expressivity` (-2 to 2) -> its phrase
EXPRESSIVITY = {-2: "in a flat, reserved tone", -1: "calmly, with restrained expression", 0: None,
                1: "expressively", 2: "very expressively, animated"}


def emotion_phrase(emotion: str, context_id: str | None = None, code: str = "invalid_generation_config") -> str | None:
    """A Cartesia emotion -> its phrase ("Speak in a sad tone."); None for neutral; raises SessionError `code`."""
    key = emotion.lower()
    if key not in EMOTIONS:
        raise SessionError(code, f"unknown emotion {show(emotion)}: use one of {', '.join(EMOTIONS)}", context_id)
    word = EMOTIONS[key]
    return None if word is None else f"Speak in {'an' if word[0] in 'aeiou' else 'a'} {word} tone."


def style_phrase(style: float) -> str | None:
    """An ElevenLabs style (0 to 1) -> its phrase; None for 0."""
    for least, words in STYLE_BANDS:
        if style >= least:
            return f"Speak {words}."
    return None


def expressivity_phrase(level: int) -> str | None:
    words = EXPRESSIVITY[level]
    return None if words is None else f"Speak {words}."


def instructions(own: str | None, phrases: tuple[str, ...]) -> str | None:
    """The model's instruction: the client's own instructions, then the vendor controls' phrases."""
    parts = ([own] if own else []) + list(phrases)
    return " ".join(parts) or None


def unsupported(phrases: tuple[str, ...], model_type: str, size: str, context_id: str | None) -> SessionError:
    return SessionError("expression_unsupported", f"emotion and style controls ({' '.join(phrases)}) need a checkpoint "
                        "that takes instructions (Qwen3-TTS 1.7B CustomVoice or VoiceDesign); this model is "
                        f"{model_type} {size}: leave them out or use the neutral setting", context_id)
