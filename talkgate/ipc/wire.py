"""What crosses between a gateway worker and an engine process: messages of a few parts (ipc/channel.py carries
them) whose first part names the kind, msgpack headers, and audio as raw float32 bytes. Pure functions, no sockets.

Worker -> engine (each worker's own connection to the engine process):
    HELLO     [b"H", msgpack([worker index, pid])]          first message of a worker (re)connected to it
    COMMANDS  [b"C", msgpack([ack, [command, ...]])]        command: [OPEN, context, params]
                                                            | [TEXT, context, ids, seconds]
                                                            | [FLUSH, context, ids, seconds]
                                                            | [END, context, ids, seconds] | [CANCEL, context]
                                                            | [VOICE, request, audio f32 bytes, ref_text]
    ACK       [b"A", msgpack(ack)]                          ack: the last STEP seq the worker has handled
Engine -> worker:
    WELCOME   [b"W", msgpack(dict)]      engine index, incarnation (its pid), ModelInfo, checkpoint directory,
                                         its stats (state, free slots: a worker can place at once)
    STEP      [b"S", msgpack([seq, t_emitted, step_s, free_slots, contexts int64 bytes, frames int32 bytes,
                         ends, voices]),
               pcm float32 bytes [rows * 1920]]             one per engine step per worker that has events;
                                                            ends: [[context, DONE, reason, frames] |
                                                                   [context, FAILED, code, message] |
                                                                   [context, SPOKEN, reason, frames] |
                                                                   [context, STAGES, stamps, 0]] (SPOKEN:
                                                            a flush's audio is out, the context goes on;
                                                            STAGES: a traced context's StageTimes);
                                                            voices: answers to VOICE, [[request, MADE,
                                                            embedding, codes, ref_text, ms] |
                                                            [request, VOICE_FAILED, code, message]]
    STATS     [b"T", msgpack(dict)]      Engine.stats() plus the step-time histogram, every STATS_INTERVAL_S

A context's audio rows come before its end in a STEP (an end is its last event), so a worker applies
rows first. Per step the engine builds one header and one contiguous PCM buffer per worker, and the
worker reads the rows as views of the received buffer: no object is pickled, nothing is copied per row.
"""
from __future__ import annotations

import msgpack
import numpy as np

from talkgate.synth.api import (
    FRAME_SAMPLES, AppendText, AudioChunk, CancelContext, ContextDone, ContextFailed, ContextParams, EndText,
    EngineCommand, EngineEvent, FlushText, MakeVoice, ModelInfo, OpenContext, SamplingParams, StageTimes, TextSpoken,
    VoiceFailed, VoiceMade, VoicePrompt,
)

HELLO, COMMANDS, ACK, WELCOME, STEP, STATS = b"H", b"C", b"A", b"W", b"S", b"T"
OPEN, TEXT, END, CANCEL, FLUSH, VOICE = 0, 1, 2, 3, 4, 5
DONE, FAILED, SPOKEN, STAGES = 0, 1, 2, 3
MADE, VOICE_FAILED = 0, 1
STATS_INTERVAL_S = 0.1
# engine step-time histogram buckets (seconds): engines count steps in them, workers render them (metrics.py)
STEP_BUCKETS = (.001, .002, .003, .005, .0075, .01, .015, .02, .03, .04, .06, .1, .2, .5)
# the engine process's loop, by phase (seconds): taking the workers' messages, the engine's turns (steps and
# captures), the workers' backlogs and the stats, waiting for a message
LOOP_PHASES = ("receive", "turn", "peers", "idle")

_pack = msgpack.Packer(use_bin_type=True).pack


def _unpack(data) -> object:
    return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False)


# ----- commands -----
def voice_to_wire(v: VoicePrompt | None) -> list | None:
    return None if v is None else [v.embedding, v.codes, v.ref_text]


def voice_from_wire(w: list | None) -> VoicePrompt | None:
    return None if w is None else VoicePrompt(*w)


def params_to_wire(p: ContextParams) -> list:
    s = p.sampling
    return [p.voice, p.language, p.instructions,
            [s.greedy, s.temperature, s.top_k, s.top_p, s.repetition_penalty, s.seed], p.fixed_frames,
            voice_to_wire(p.voice_prompt), p.trace_latency, p.lead_s]


def params_from_wire(w: list) -> ContextParams:
    voice, language, instructions, s, fixed, voice_prompt, trace_latency, lead_s = w
    return ContextParams(voice=voice, language=language, instructions=instructions,
                         sampling=SamplingParams(*s), fixed_frames=fixed, voice_prompt=voice_from_wire(voice_prompt),
                         trace_latency=trace_latency, lead_s=lead_s)


def command_to_wire(cmd: EngineCommand) -> list:
    """One command; its ids (a context's, a voice request's) are the worker's: one client per worker."""
    if isinstance(cmd, AppendText):
        return [TEXT, cmd.context, list(cmd.ids), cmd.seconds]
    if isinstance(cmd, FlushText):
        return [FLUSH, cmd.context, list(cmd.ids), cmd.seconds]
    if isinstance(cmd, EndText):
        return [END, cmd.context, list(cmd.ids), cmd.seconds]
    if isinstance(cmd, CancelContext):
        return [CANCEL, cmd.context]
    if isinstance(cmd, OpenContext):
        return [OPEN, cmd.context, params_to_wire(cmd.params)]
    if isinstance(cmd, MakeVoice):
        return [VOICE, cmd.request, cmd.audio, cmd.ref_text]
    raise TypeError(f"not an engine command: {cmd!r}")


def encodable(cmd: list) -> bool:
    """False when msgpack cannot carry it (an integer beyond 64 bits in the params)."""
    try:
        _pack(cmd)
    except (OverflowError, TypeError, ValueError):
        return False
    return True


def commands_message(ack: int, commands: list[list]) -> list[bytes]:
    return [COMMANDS, _pack([ack, commands])]


def command_from_wire(w: list) -> EngineCommand:
    op, context = w[0], w[1]
    if op == TEXT:
        return AppendText(context, tuple(w[2]), w[3])
    if op == FLUSH:
        return FlushText(context, tuple(w[2]), w[3])
    if op == VOICE:
        return MakeVoice(context, w[2], w[3])
    if op == END:
        return EndText(context, tuple(w[2]), w[3])
    if op == CANCEL:
        return CancelContext(context)
    if op == OPEN:
        return OpenContext(context, params_from_wire(w[2]))
    raise ValueError(f"unknown command {op!r}")


def hello_message(worker: int, pid: int) -> list[bytes]:
    return [HELLO, _pack([worker, pid])]


def ack_message(ack: int) -> list[bytes]:
    return [ACK, _pack(ack)]


def decode(frame) -> object:
    """A msgpack part (bytes or a view of a received buffer)."""
    return _unpack(frame)


# ----- engine -> worker -----
def welcome_message(engine: int, incarnation: int, info: ModelInfo, checkpoint: str, stats: dict) -> list[bytes]:
    return [WELCOME, _pack({"engine": engine, "incarnation": incarnation, "info": info_to_wire(info),
                            "checkpoint": checkpoint, "stats": stats})]


def info_to_wire(info: ModelInfo) -> dict:
    return {k: getattr(info, k) for k in info.__dataclass_fields__}


def info_from_wire(d: dict) -> ModelInfo:
    return ModelInfo(**{**d, "voices": tuple(d["voices"]), "languages": tuple(d["languages"])})


def stats_message(stats: dict) -> list[bytes]:
    return [STATS, _pack(stats)]


def _end(ev: EngineEvent) -> list:
    if isinstance(ev, ContextDone):
        return [ev.context, DONE, ev.reason, ev.frames]
    if isinstance(ev, TextSpoken):
        return [ev.context, SPOKEN, ev.reason, ev.frames]
    if isinstance(ev, StageTimes):
        return [ev.context, STAGES, ev.stamps, 0]
    return [ev.context, FAILED, ev.code, ev.message]


def _voice_answer(ev: EngineEvent) -> list:
    if isinstance(ev, VoiceMade):
        return [ev.request, MADE, *voice_to_wire(ev.voice), ev.ms]
    return [ev.request, VOICE_FAILED, ev.code, ev.message]


def step_message(seq: int, free_slots: int, events: list[EngineEvent]) -> list:
    """One step's events for one worker: [STEP, header, pcm] with the rows' PCM in one buffer."""
    chunks = [ev for ev in events if isinstance(ev, AudioChunk)]
    voices = [_voice_answer(ev) for ev in events if isinstance(ev, (VoiceMade, VoiceFailed))]
    ends = [_end(ev) for ev in events if isinstance(ev, (ContextDone, ContextFailed, TextSpoken, StageTimes))]
    n = len(chunks)
    contexts = np.fromiter((c.context for c in chunks), np.int64, n)
    frames = np.fromiter((c.first_frame for c in chunks), np.int32, n)
    pcm = np.stack([c.pcm for c in chunks]) if n else np.zeros((0, FRAME_SAMPLES), np.float32)
    t, step_s = (chunks[0].t_emitted, chunks[0].step_s) if n else (0.0, 0.0)
    header = _pack([seq, t, step_s, free_slots, contexts.tobytes(), frames.tobytes(), ends, voices])
    return [STEP, header, pcm]


def read_step(header, pcm) -> tuple[int, float, float, int, np.ndarray, np.ndarray, np.ndarray, list, list]:
    """(seq, t_emitted, step_s, free_slots, contexts, frames, pcm [rows, 1920] (a view of `pcm`), ends, voices)."""
    seq, t, step_s, free, contexts, frames, ends, voices = _unpack(header)
    rows = np.frombuffer(pcm, np.float32).reshape(-1, FRAME_SAMPLES)
    return (seq, t, step_s, free, np.frombuffer(contexts, np.int64), np.frombuffer(frames, np.int32), rows, ends,
            voices)


def end_event(end: list) -> EngineEvent:
    """A STEP's end entry as an event: its context's last (DONE, FAILED), a flush's end (SPOKEN: the context
    goes on) or a traced context's stage times (STAGES)."""
    context, kind, a, b = end
    return (ContextDone(context, a, b) if kind == DONE else TextSpoken(context, a, b) if kind == SPOKEN
            else StageTimes(context, a) if kind == STAGES else ContextFailed(context, a, b))


def voice_event(answer: list) -> EngineEvent:
    """A STEP's answer to a VOICE command as an event."""
    if answer[1] == MADE:
        request, _, embedding, codes, ref_text, ms = answer
        return VoiceMade(request, VoicePrompt(embedding, codes, ref_text), ms)
    request, _, code, message = answer
    return VoiceFailed(request, code, message)
