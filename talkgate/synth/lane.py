"""The first-frame lane: a new context's open and first frame launched beside the step in flight (issue 45).

Under load a new context used to wait for the running step to end before its first frame even started (the latency
budget's `engine_received`: 3.7 / 7.0 ms p50 / p95 at 20 req/s of 1.7B on an H200, docs/design.md). The lane is a
CUDA stream of the highest priority with a one-row set of static step buffers, its own open, Talker, code-predictor
and decoder graphs, and a memory pool of its own (graphs of one pool must not run at once). While the engine thread
waits for the running step's codes it takes the commands that arrived (Engine.poll) and launches a new context's
first frame there at once; the GPU's block scheduler gives the lane's kernels the SMs as the running step's blocks
finish. bench/first_lane.py measured it on an H200: the first frame done 4.3-5.7 ms after its launch beside 32-256
running rows, against 7.5-24 ms waiting for the step and then running; the running step about the lane's own time
longer (docs/benchmarks.md). So the engine uses it where first_frames_apart allows a first frame apart anyway: in
the engine, at 20 req/s of 1.7B, p95 first audio 15.7 -> 11.5 ms with the clean levels unchanged; beside up to
1,024 running rows the steps grew and the highest clean level fell (docs/benchmarks.md "The first-frame lane in the
engine").

What the lane touches of the shared per-slot pools is its own slot's rows (and the dummy slot's, garbage by design),
which no row of the step in flight writes: the engine gives it only contexts whose slot was not in that step, whose
prompt prefix is kept (their open is a copy: no prefill, whose buffers the main stream owns) and which need no
primed decoder state (an in-context cloned voice); or a context opened at a step boundary before its text came
(streamed text), whose first committed text arrives during the step: its slot holds its prompt's prefix already, so
the lane runs its first frame without the open. It reads the prefix store and the slots after the step boundary's
opens wrote them (it waits for `opened`), and the main stream waits for the lane (`_joined`) before its next launch
or open, which may take the lane's context or its slot. While a lane launch runs, the main stream holds its running
step's next part at a gate (synth/stream_gate.py), so that the lane's first frame waits only for the part in flight
when it comes, not for others that would start between its kernels.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from talkgate.synth.stream_gate import StreamGate

LANE_ROWS = 1                   # one new context a lane launch (one row runs the persistent kernels)
# Lane launches in flight at once: a context that arrives while another's first frame is on the lane is launched
# behind it on the lane's stream (in stream order: one set of step buffers, graphs and pool), not a step later. Each
# has a set of host buffers of its own (its inputs may still wait to be copied, its codes and PCM to be read, while
# the next is queued); the engine lands them in order
LANE_SETS = 2


@dataclass
class Lane:
    stream: object                  # torch.cuda.Stream of the highest priority (None on the CPU: eager, in order)
    pool: object                    # the lane graphs' memory pool (None on the CPU)
    bufs: object                    # runner.StepBuffers (its first LANE_ROWS rows used)
    open_ints_host: list            # the open's host blocks, a set a launch in flight (LANE_SETS)
    open_floats_host: list
    gate: object = None             # synth/stream_gate.py: up while a lane launch runs (None: no gate, the CPU)
    launches: int = 0

    @classmethod
    def on(cls, device: torch.device, bufs, open_ints_host: list, open_floats_host: list) -> "Lane":
        cuda = device.type == "cuda"
        stream = torch.cuda.Stream(device, priority=-100) if cuda else None    # clamped to the device's highest
        pool = torch.cuda.graph_pool_handle() if cuda else None
        return cls(stream, pool, bufs, open_ints_host, open_floats_host, StreamGate.on(device))
