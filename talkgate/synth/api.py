"""The engine's public surface: what sessions/, server/ and ipc/ may import from synth.

Everything here is plain data (no tensors, no threads) so that callers and tests can build and
inspect it without a model, and the one interface every engine offers its clients (EngineInterface):
commands in (OpenContext, AppendText, FlushText, EndText, CancelContext, MakeVoice through submit), events
out (one deliver call per step). synth/engine.py's Engine implements it in-process; a gateway worker's
RemoteEngines (ipc/remote_engines.py) implements it over the engine processes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Union

import numpy as np

SAMPLE_RATE = 24000          # Code2Wav output rate
FRAME_SAMPLES = 1920         # samples per codec frame (12.5 frames/s)
FRAME_MS = 80


class EngineError(Exception):
    """An error a client can be told about: `code` is stable, `message` is readable."""

    code = "engine_error"

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class InvalidParams(EngineError):
    code = "invalid_params"


class UnknownVoice(InvalidParams):
    code = "unknown_voice"


class UnknownLanguage(InvalidParams):
    code = "unknown_language"


class EngineFull(EngineError):
    """No free context slot (or KV memory): refuse cleanly, try again later."""

    code = "engine_full"


class EngineStopped(EngineError):
    code = "engine_stopped"


SEED_RANGE = "-2^63 to 2^64 - 1"


def seed_fits(seed: int) -> bool:
    """Sampling seeds are 64-bit integers, signed or unsigned (synth.sampling hashes their 64 bits)."""
    return -(1 << 63) <= seed < 1 << 64


@dataclass(frozen=True)
class SamplingParams:
    """Per-context sampling; None means the checkpoint's generation_config.json value."""

    greedy: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None


@dataclass(frozen=True)
class VoicePrompt:
    """A cloned voice for a Base checkpoint, computed once from reference audio (synth.voice.make_voice_prompt)
    and reused by every context that speaks with it. Plain bytes, so it pickles small and hashes fast: a 30 s
    ICL voice is 4 KiB (0.6B) or 8 KiB (1.7B) of embedding + 12 KiB of codes.

    embedding: the speaker encoder's x-vector, float32 little-endian [enc_dim] (= the Talker's hidden size).
    codes: the reference audio's codec frames, uint16 little-endian [frames, 16] row-major, or None. With codes
    (and ref_text, the words spoken in the reference audio) the voice is cloned in-context (ICL): the prompt
    carries the reference text and frames and generation continues the reference audio. Without, x-vector
    only: the embedding alone."""

    embedding: bytes
    codes: bytes | None = None
    ref_text: str | None = None

    CODEBOOKS = 16

    def __post_init__(self):
        if not isinstance(self.embedding, bytes) or not self.embedding or len(self.embedding) % 4:
            raise InvalidParams("voice prompt: the embedding must be non-empty float32 bytes")
        if self.codes is not None:
            if not isinstance(self.codes, bytes) or not self.codes or len(self.codes) % (2 * self.CODEBOOKS):
                raise InvalidParams(f"voice prompt: codes must be non-empty uint16 bytes of [frames, {self.CODEBOOKS}]")
            if not (self.ref_text or "").strip():
                raise InvalidParams("voice prompt: reference codes need the reference text (ICL)")
        elif self.ref_text is not None:
            raise InvalidParams("voice prompt: a reference text needs the reference codes (ICL); "
                                "an x-vector-only voice has neither")

    @classmethod
    def from_arrays(cls, embedding, codes=None, ref_text: str | None = None) -> "VoicePrompt":
        """embedding: [enc_dim] floats; codes: [frames, 16] integers in [0, 65535] (a codec's are < 2048)."""
        emb = np.ascontiguousarray(embedding, dtype="<f4").reshape(-1)
        packed = None
        if codes is not None:
            c = np.asarray(codes)
            if c.ndim != 2 or c.shape[1] != cls.CODEBOOKS or (c.size and (c.min() < 0 or c.max() > 0xFFFF)):
                raise InvalidParams(f"voice prompt: codes must be [frames, {cls.CODEBOOKS}] integers in [0, 65535]")
            packed = np.ascontiguousarray(c, dtype="<u2").tobytes()
        return cls(emb.tobytes(), packed, ref_text)

    @property
    def dim(self) -> int:
        return len(self.embedding) // 4

    @property
    def frames(self) -> int:
        """Reference frames (0 for an x-vector-only voice)."""
        return len(self.codes) // (2 * self.CODEBOOKS) if self.codes is not None else 0

    @property
    def icl(self) -> bool:
        return self.codes is not None

    def embedding_array(self) -> np.ndarray:
        return np.frombuffer(self.embedding, dtype="<f4")

    def codes_array(self) -> np.ndarray | None:
        """[frames, 16] int64, or None."""
        if self.codes is None:
            return None
        return np.frombuffer(self.codes, dtype="<u2").reshape(-1, self.CODEBOOKS).astype(np.int64)


@dataclass(frozen=True)
class ContextParams:
    voice: str | None = None          # CustomVoice speaker name (case-insensitive); None: model default
    voice_prompt: VoicePrompt | None = None   # a cloned voice (Base checkpoints); excludes `voice`
    language: str = "auto"            # "auto" or a language name from ModelInfo.languages
    instructions: str | None = None   # VoiceDesign description / CustomVoice instruction
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Benchmarks with random weights (which never sample eos) fix the length: see
    # synth.request.frames_for_text for the documented text-length rule.
    fixed_frames: int | None = None
    trace_latency: bool = False       # the engine reports its first frame's stage times (StageTimes)
    # a client that plays the audio as it comes: the context runs at most this many seconds of audio ahead of its
    # player (synth/scheduler.py); None: as fast as the engine can (a client that wants the whole file)
    lead_s: float | None = None


# How a context ends when its request sets no fixed_frames (ModelInfo.end_of_speech): "model" for a trained
# checkpoint (the model samples eos; the runaway guard stops one that never does). Random weights never
# sample eos usefully, so an untrained checkpoint ends where the text-length rule puts it
# (synth.request.frames_for_text: a stand-in for a trained model's end of speech), or, chosen at load
# (serve --untrained-length runaway), runs to the runaway guard as a trained model that never ends would.
UNTRAINED_LENGTHS = {"text-rule": "text_length_rule", "runaway": "runaway_guard"}


def end_of_speech(untrained: bool, untrained_length: str = "text-rule") -> str:
    """ModelInfo.end_of_speech of a checkpoint: "model", "text_length_rule" or "runaway_guard"."""
    if untrained_length not in UNTRAINED_LENGTHS:
        raise ValueError(f"untrained_length must be one of {', '.join(UNTRAINED_LENGTHS)}, not {untrained_length!r}")
    return UNTRAINED_LENGTHS[untrained_length] if untrained else "model"


@dataclass(frozen=True)
class ModelInfo:
    name: str                  # directory or Hugging Face id it was loaded from
    model_type: str            # tts_model_type: custom_voice | base | voice_design
    size: str                  # tts_model_size: 0b6 | 1b7 | (preset name for generated checkpoints)
    untrained: bool            # True for random-weight checkpoints: say so wherever model info is shown
    voices: tuple[str, ...]
    languages: tuple[str, ...]  # includes "auto"
    sample_rate: int = SAMPLE_RATE
    device: str = "cpu"
    dtype: str = "float32"         # the Talker's and code predictor's
    decoder_dtype: str = "float32"  # the codec decoder's (synth/decoder_precision.py)
    end_of_speech: str = "model"   # what ends a context without fixed_frames: see end_of_speech()
    # a Base checkpoint's voice prompts' maker: a digest of its speaker encoder's and speech tokenizer encoder's
    # weights as stored ("" for other variants); a VoicePrompt is valid on the models of the same voice_key (speaks)
    voice_key: str = ""
    takes_instructions: bool = False    # the model reads instructions (synth/prompt.py takes_instructions)

    @property
    def clones(self) -> bool:
        """Whether this model makes and speaks cloned voices (a Base checkpoint): the one place that says so."""
        return self.model_type == "base"

    def speaks(self, made_by: dict) -> bool:
        """Whether a voice prompt made by the model `made_by` describes (a stored voice's `model`: its voice_key)
        is valid on this one. A prompt's x-vector comes from its maker's speaker encoder, trained with that
        checkpoint's Talker and fed to it raw as an input embedding (docs/voices.md): it means nothing to a Talker
        of another checkpoint, even one of the same size (0.6B and 1.7B Base share the speech tokenizer, so the
        reference codes would fit, but not their speaker encoders: 1024 and 2048 values). A voice stored before
        voice keys were recorded is taken on any Base model (the engine refuses an x-vector of another size)."""
        key = made_by.get("voice_key")
        return self.clones and (not key or key == self.voice_key)

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["voices"], d["languages"], d["clones"] = list(self.voices), list(self.languages), self.clones
        if self.untrained:
            d["notice"] = "random untrained weights: the audio is noise, not speech"
        return d


@dataclass(frozen=True)
class AudioChunk:
    """PCM for frames [first_frame, first_frame + n_frames) of one context, mono float32 at 24 kHz."""

    context: int
    pcm: np.ndarray
    first_frame: int
    n_frames: int
    t_emitted: float          # time.perf_counter() when the engine handed it over
    step_s: float = 0.0       # the engine's step then (seconds, engine.mean_step_ms): about how long a running context's
                              # next frame takes


# A traced context's (ContextParams.trace_latency) engine stages of its first frame, in order: its first text (ids,
# a flush or the end) reached Engine.submit, a step took it into its prefill, that step was launched (on the CPU:
# run), the step's codes reached the host (prefill, Talker and code predictor of frame 0), its PCM did (the codec
# decoder), the events went to the client's deliver.
ENGINE_STAGES = ("engine_received", "scheduled", "launched", "codes", "decoded", "handed")


@dataclass(frozen=True)
class StageTimes:
    """The ENGINE_STAGES times (time.monotonic_ns) of a traced context's first frame, delivered with its first
    AudioChunk. `stamps` is a list that the engine and then the gateway worker append to: CLOCK_MONOTONIC is one
    clock for every process of the machine, so the engine's and the worker's times compare directly."""

    context: int
    stamps: list


@dataclass(frozen=True)
class ContextDone:
    """The context ended by itself: reason is "eos", "length" (fixed_frames reached), "length_rule"
    (an untrained checkpoint's stand-in for end of speech: the text-length rule's frames for its text,
    ModelInfo.end_of_speech "text_length_rule") or "budget" (runaway guard: frame budget for its text
    length, or the slot's capacity). Last event of the context."""

    context: int
    reason: str
    frames: int


@dataclass(frozen=True)
class ContextFailed:
    """The engine could not continue this context (last event of the context)."""

    context: int
    code: str
    message: str


@dataclass(frozen=True)
class VoiceMade:
    """The answer to MakeVoice: the cloned voice, and the engine thread's milliseconds making it."""

    request: int
    voice: VoicePrompt
    ms: float = 0.0


@dataclass(frozen=True)
class VoiceFailed:
    """MakeVoice refused: `code` as the EngineError classes (invalid_params: a model that cannot clone, audio
    out of range, a reference text too long; engine_full: too many voices queued; engine_stopped)."""

    request: int
    code: str
    message: str


@dataclass(frozen=True)
class TextSpoken:
    """The audio of the text up to a FlushText is all out (its last AudioChunk came before): the context
    stays open and waits for more text. reason: "eos" (the model's end of speech), "length_rule" (an
    untrained checkpoint's, or a fixed length's, text-length rule for the text so far), "budget" (the
    runaway guard for the text so far) or "empty" (no text since the last flush)."""

    context: int
    reason: str
    frames: int


EngineEvent = Union[AudioChunk, ContextDone, ContextFailed, TextSpoken, VoiceMade, VoiceFailed, StageTimes]


def event_key(ev: EngineEvent) -> int:
    """The id a client chose that an event answers: its context's, or a MakeVoice's request."""
    return ev.request if isinstance(ev, (VoiceMade, VoiceFailed)) else ev.context
# called by the engine once per step per client with that step's events of the client's contexts (and the
# answers to its MakeVoice commands)
Deliver = Callable[[list[EngineEvent]], None]


# ----- commands (client -> engine): `context` is chosen by the client and never reused by it (an event of a
# cancelled context made before its cancel may still arrive after it: the client drops it) -----
@dataclass(frozen=True)
class OpenContext:
    """Start a context. Never refused by an exception: a bad voice, a full engine, ... come back as
    ContextFailed(context, code, message) with the codes of the EngineError classes above."""

    context: int
    params: ContextParams
    model: str | None = None          # the served model whose engine takes it (server/model_engines.py); None: the
                                      # default. An engine never reads it: it is the one model it runs


@dataclass(frozen=True)
class AppendText:
    """Committed text token ids (synth.tokenizer.StreamingTokenizer.feed) and the text-length rule's
    seconds of the text they came from (synth.request.text_seconds)."""

    context: int
    ids: tuple[int, ...]
    seconds: float = 0.0


@dataclass(frozen=True)
class EndText:
    """The last ids (StreamingTokenizer.finish: the held-back tail) and seconds; no more text."""

    context: int
    ids: tuple[int, ...] = ()
    seconds: float = 0.0


@dataclass(frozen=True)
class FlushText:
    """Speak the text so far and keep the context open: the last ids (StreamingTokenizer.finish: the
    held-back tail) and seconds. The model finishes the words it has (its text track runs on past the
    text with tts_eos, then tts_pad, as at the end of a text) until its end of speech (an untrained
    checkpoint: the text-length rule of the text so far), then TextSpoken; text sent meanwhile waits
    for it and then continues the same context, from its last frame. EndText still ends the context."""

    context: int
    ids: tuple[int, ...] = ()
    seconds: float = 0.0


@dataclass(frozen=True)
class CancelContext:
    """Stop now (idempotent): once submitted, no further event of the context reaches its client."""

    context: int


@dataclass(frozen=True)
class MakeVoice:
    """Make a cloned voice (Base checkpoints) from reference audio: `audio` is mono float32 little-endian
    samples at SAMPLE_RATE, 1-30 s (resampling and mixing are the client's: synth.voice.to_mono_24k);
    with `ref_text`, the words spoken in it, an in-context (ICL) voice, else x-vector only. Answered by
    VoiceMade or VoiceFailed with the same `request` (chosen by the client; ids of its own, apart from
    context ids). Plain bytes and a string, so it crosses a process boundary as a value; the engine
    thread makes one voice per step boundary."""

    request: int
    audio: bytes
    ref_text: str | None = None
    model: str | None = None          # as OpenContext.model; None: the first Base model


EngineCommand = Union[OpenContext, AppendText, FlushText, EndText, CancelContext, MakeVoice]



class EngineInterface(Protocol):
    """What a client sees of an engine. Contexts are keyed by (client, the context id the client chose): a client
    opens one without a round trip. submit never blocks and never raises for a context: a refusal comes back as
    ContextFailed (VoiceFailed for MakeVoice) through deliver."""

    info: ModelInfo
    # step batches a client may have been handed and not yet routed (its `behind()` counts them) before `hold`
    # stops the engine (in-process: before its next step) or the reading of steps (over IPC)
    max_behind: int
    # called before each step (in-process) or each read (over IPC): while it returns True, nothing more is handed
    # to the client; it must not block
    hold: Callable[[], bool] | None

    def new_tokenizer(self):
        """A StreamingTokenizer of the model's text (synth.tokenizer): the client tokenizes, the engine takes ids."""

    def connect(self, deliver: Deliver) -> int:
        """A new client's id; deliver(events) gets each step's events of its contexts, in order."""

    def disconnect(self, client: int) -> None:
        """Cancel the client's open contexts and forget it."""

    def submit(self, client: int, commands: list[EngineCommand]) -> None:
        """Queue commands, in order, for the engine's next step boundary."""

    def send_now(self) -> None:
        """The commands submitted so far go to the engine now: over IPC they otherwise leave at the end of the
        event loop's turn, with the turn's others in one message (in-process, submit has handed them over)."""

    def stats(self) -> dict:
        """At least free_slots and slots (the capacity /ready and /metrics report)."""
