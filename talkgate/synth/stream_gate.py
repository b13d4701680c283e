"""A gate between two CUDA streams: a flag in device memory that one stream raises and lowers in its own order and
that another stream waits for at chosen points, through the driver's stream memory operations (cuStreamWriteValue32,
cuStreamWaitValue32: the waiting stream holds no SM, and no host thread takes part).

The first-frame lane (synth/lane.py) raises it while its launch runs, and a running step's launch (runner.launch)
waits at the gate before each of its parts after the first (codes, decode): a part queued on the main stream would
otherwise start when the lane's kernel before it ends, ahead of the lane's next one, and the lane's first frame
would wait a whole part (a one-row code predictor kernel, 1.87 ms on an H200) in the middle. With the gate a lane
launch waits only for the main stream's kernel in flight when it comes.

The running step's one- and two-row persistent kernels also read the flag at their layer (Talker) and pass (code
predictor) boundaries and stop there while it is up; their launch waits at the gate inside its CUDA graph and a second
launch finishes them (synth/persistent.py, Yield): that needs the wait captured into a graph, which `in_graphs` says.

Where the driver has no stream memory operations (or on the CPU) there is no gate: StreamGate.on returns None.
"""
from __future__ import annotations

import ctypes
import functools
import logging

import torch

log = logging.getLogger("talkgate.gate")

CU_STREAM_WAIT_VALUE_EQ = 0x1
CU_STREAM_WRITE_VALUE_DEFAULT = 0x0
DOWN, UP = 0, 1


@functools.cache
def _driver():
    cuda = ctypes.CDLL("libcuda.so.1")
    for name in ("cuStreamWaitValue32_v2", "cuStreamWriteValue32_v2"):
        fn = getattr(cuda, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        fn.restype = ctypes.c_int
    return cuda


class StreamGateError(RuntimeError):
    pass


class StreamGate:
    """gate.up(s) / gate.down(s): queue the flag's raising / lowering on stream s; gate.wait(s): stream s goes on only
    once the flag is down."""

    def __init__(self, device: torch.device):
        self.flag = torch.zeros(1, dtype=torch.int32, device=device)
        self._cuda = _driver()
        self.in_graphs = False          # a wait at the gate can be captured into a CUDA graph (on: tried)

    @classmethod
    def on(cls, device: torch.device) -> "StreamGate | None":
        """A gate on `device`, tried once end to end; None on the CPU or where the driver refuses it."""
        if device.type != "cuda":
            return None
        try:
            gate = cls(device)
            side = torch.cuda.Stream(device)
            gate.up(side)
            gate.down(side)
            gate.wait(torch.cuda.current_stream(device))
            torch.cuda.synchronize(device)
        except (OSError, AttributeError, StreamGateError) as e:
            log.warning("no stream gate for the first-frame lane (%s): a running step's parts may start between the "
                        "lane's kernels", e)
            return None
        gate.in_graphs = gate._captured_wait_passes(device)
        return gate

    def _captured_wait_passes(self, device: torch.device) -> bool:
        """A graph of a wait at the (lowered) gate and a kernel after it, captured on a stream of its own and replayed:
        whether the kernel ran."""
        side = torch.cuda.Stream(device)
        x = torch.zeros(1, device=device)
        x.add_(1)                       # its kernel loaded before the capture
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(side):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    self.wait(side)
                    x.add_(1)
                finally:
                    graph.capture_end()
            graph.replay()
            torch.cuda.synchronize(device)
            return float(x.cpu()) == 2.0
        except (RuntimeError, StreamGateError) as e:
            log.warning("no wait at the stream gate inside a CUDA graph (%s): a running step's kernels do not give "
                        "way to the lane inside a part", e)
            return False

    def _call(self, fn, stream, value: int, flags: int) -> None:
        err = fn(ctypes.c_void_p(stream.cuda_stream), self.flag.data_ptr(), value, flags)
        if err != 0:
            raise StreamGateError(f"{fn.__name__} failed: CUDA error {err}")

    def up(self, stream) -> None:
        self._call(self._cuda.cuStreamWriteValue32_v2, stream, UP, CU_STREAM_WRITE_VALUE_DEFAULT)

    def down(self, stream) -> None:
        self._call(self._cuda.cuStreamWriteValue32_v2, stream, DOWN, CU_STREAM_WRITE_VALUE_DEFAULT)

    def wait(self, stream) -> None:
        self._call(self._cuda.cuStreamWaitValue32_v2, stream, DOWN, CU_STREAM_WAIT_VALUE_EQ)
