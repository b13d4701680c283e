"""The engine processes' pure parts: every message kind across ipc/wire.py and back, the engine loop's slow-turn log
(ipc/engine_server.py), the worker counts and caps of `talkgate serve` (tests/system/test_engine_process.py runs real
engine processes)."""
from __future__ import annotations

import numpy as np
import pytest

from talkgate.ipc import wire
from talkgate.synth.api import (
    AppendText, AudioChunk, CancelContext, ContextDone, ContextFailed, ContextParams, EndText, FlushText, MakeVoice,
    OpenContext, SamplingParams, StageTimes, TextSpoken, VoiceFailed, VoiceMade, VoicePrompt,
)


def test_wire_round_trip():
    params = ContextParams(voice="ryan", language="english", instructions="calm",
                           sampling=SamplingParams(temperature=0.7, top_k=30, seed=(1 << 64) - 1), fixed_frames=12)
    icl = VoicePrompt.from_arrays(np.arange(8, dtype=np.float32), np.ones((13, 16), np.int64), "Hello there.")
    cmds = [OpenContext(3, params), AppendText(3, (1, 2, 3), 0.42), FlushText(3, (5,), 0.0), EndText(3, (4,), 0.06),
            CancelContext(3), OpenContext(3, ContextParams(voice_prompt=icl)),
            OpenContext(3, ContextParams(voice_prompt=VoicePrompt.from_arrays(np.ones(8, np.float32)))),
            OpenContext(4, ContextParams(trace_latency=True)), OpenContext(5, ContextParams(lead_s=2.0))]
    cmds.append(MakeVoice(99, b"\0" * 96000, "Hi."))
    frames = wire.commands_message(7, [wire.command_to_wire(c) for c in cmds])
    ack, decoded = wire.decode(frames[1])
    assert ack == 7 and [wire.command_from_wire(c) for c in decoded] == cmds
    assert not wire.encodable(wire.command_to_wire(OpenContext(1, ContextParams(fixed_frames=1 << 70))))
    rows = np.random.default_rng(0).standard_normal((3, 1920)).astype(np.float32)
    events = [AudioChunk(5, rows[0], 0, 1, 1.5, 0.016), AudioChunk(9, rows[1], 7, 1, 1.5, 0.016), ContextDone(9, "length", 8),
              StageTimes(11, [1, 2, 3, 4, 5, 6]), AudioChunk(11, rows[2], 2, 1, 1.5, 0.016), TextSpoken(11, "length_rule", 3),
              ContextFailed(12, "engine_full", "no room"), VoiceMade(4, icl, 12.5), VoiceFailed(5, "invalid_params", "silent")]
    kind, header, pcm = wire.step_message(4, 13, events)
    seq, t, step_s, free, contexts, first, got, ends, voices = wire.read_step(header, memoryview(pcm).cast("B"))
    assert (kind, seq, t, step_s, free) == (wire.STEP, 4, 1.5, 0.016, 13)
    assert contexts.tolist() == [5, 9, 11] and first.tolist() == [0, 7, 2]
    np.testing.assert_array_equal(got, rows)
    assert [wire.end_event(e) for e in ends] == [ContextDone(9, "length", 8), StageTimes(11, [1, 2, 3, 4, 5, 6]),
                                                  TextSpoken(11, "length_rule", 3),
                                                  ContextFailed(12, "engine_full", "no room")]
    assert [wire.voice_event(v) for v in voices] == [VoiceMade(4, icl, 12.5), VoiceFailed(5, "invalid_params", "silent")]


def test_slow_turns_are_counted_and_summed_in_one_line_at_most_every_few_seconds(caplog):
    from talkgate.ipc.engine_server import SLOW_TURN_LOG_S, SlowTurns

    slow = SlowTurns(engine=0)
    slow.report(now=100.0)                                  # none yet: nothing to say
    slow.add(0.001, 0.060, 0.002, gpu_wait=0.020, thread=(0.025, 0.035))
    slow.add(0.000, 0.045, 0.001, gpu_wait=0.040, thread=(0.044, 0.001))
    with caplog.at_level("WARNING", logger="talkgate.engine_process"):
        slow.report(now=100.0)
        slow.add(0.000, 0.050, 0.000, gpu_wait=0.045, thread=None)     # no schedstat
        slow.report(now=100.0 + SLOW_TURN_LOG_S / 2)                   # too soon: summed into the next line
        slow.report(now=100.0 + SLOW_TURN_LOG_S)
    first, second = [r.getMessage() for r in caplog.records]
    assert first == ("engine 0: 2 turn(s) over 40 ms since the last of these lines, the longest 63.0 ms, 109.0 ms in "
                     "all: receiving 1.0, stepping 105.0 (blocked on the GPU 60.0 of it); its thread on a CPU 69.0, "
                     "waiting for one (other processes on its cores) 36.0, neither (asleep, or stolen by the "
                     "hypervisor) 4.0")
    assert second.startswith("engine 0: 1 turn(s) over 40 ms") and second.endswith("its thread unknown (no schedstat)")
    assert slow.count == 3


def test_worker_counts_and_caps():
    from talkgate.cli.args import CommandError
    from talkgate.cli.serve import default_workers, gpu_indices
    from talkgate.processes.supervisor import worker_cap
    assert [default_workers(1, cores) for cores in (1, 2, 4, 16)] == [1, 1, 2, 14]
    assert default_workers(8, 128) == 32 and default_workers(2, 16) == 13
    assert worker_cap(1000, 1) == 1000 and worker_cap(1000, 8) == 188 and worker_cap(10, 2) == 8
    assert gpu_indices(None, 2) == [0, 1] and gpu_indices("all", 3) == [0, 1, 2] and gpu_indices("1", 2) == [1]
    for bad in ("2", "0,0", "x"):
        with pytest.raises(CommandError):
            gpu_indices(bad, 2)
