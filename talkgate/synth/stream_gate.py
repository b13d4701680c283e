"""A gate between two CUDA streams: a flag in device memory that one stream raises and lowers in its own order and
that another stream waits for at chosen points, through the driver's stream memory operations (cuStreamWriteValue32,
cuStreamWaitValue32: the waiting stream holds no SM, and no host thread takes part).

The first-frame lane (synth/lane.py) raises it while its launch runs, and a running step's launch (runner.launch)
waits at the gate before each of its parts after the first (codes, decode): a part queued on the main stream would
otherwise start when the lane's kernel before it ends, ahead of the lane's next one, and the lane's first frame
would wait a whole part (a one-row code predictor kernel, 1.87 ms on an H200) in the middle. With the gate a lane
launch waits only for the main stream's kernel in flight when it comes.

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
            return gate
        except (OSError, AttributeError, StreamGateError) as e:
            log.warning("no stream gate for the first-frame lane (%s): a running step's parts may start between the "
                        "lane's kernels", e)
            return None

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
