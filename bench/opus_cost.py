"""libopus's encode time for one 20-ms packet as talkgate encodes (24 kHz mono, RESTRICTED_LOWDELAY, 48 kbit/s:
talkgate/codecs/opus.py) at complexities 3-10, for each libopus given (default: the one ctypes finds), the best of
three passes over 6 s of a voiced tone with noise (issue 44: libopus is ~60% of a gateway worker's CPU at 512 Opus
streams). Standard library only, so that it runs on a bare GPU host before any setup:

    python3 bench/opus_cost.py [/path/to/libopus.so.0 ...]
"""
from __future__ import annotations

import array
import ctypes
import ctypes.util
import math
import random
import sys
import time

RATE, PACKET = 24000, 480
RESTRICTED_LOWDELAY, SET_BITRATE, SET_COMPLEXITY = 2051, 4002, 4010      # opus_defines.h
COMPLEXITIES = (3, 4, 5, 6, 10)


def signal() -> array.array:
    random.seed(0)
    return array.array("f", (0.3 * math.sin(2 * math.pi * 180 * (i / RATE) * (1 + 0.1 * math.sin(3 * i / RATE)))
                             + 0.01 * random.gauss(0, 1) for i in range(RATE * 6)))


def packet_us(lib: ctypes.CDLL, x: array.array, complexity: int) -> float:
    err = ctypes.c_int()
    enc = ctypes.c_void_p(lib.opus_encoder_create(RATE, 1, RESTRICTED_LOWDELAY, ctypes.byref(err)))
    lib.opus_encoder_ctl(enc, SET_BITRATE, ctypes.c_int(48000))
    lib.opus_encoder_ctl(enc, SET_COMPLEXITY, ctypes.c_int(complexity))
    out, addr, packets = ctypes.create_string_buffer(4000), x.buffer_info()[0], 0
    t0 = time.perf_counter()
    for i in range(0, len(x) - PACKET, PACKET):
        lib.opus_encode_float(enc, addr + 4 * i, PACKET, out, 4000)
        packets += 1
    us = (time.perf_counter() - t0) / packets * 1e6
    lib.opus_encoder_destroy(enc)
    return us


def main() -> None:
    x = signal()
    for path in sys.argv[1:] or [ctypes.util.find_library("opus")]:
        lib = ctypes.CDLL(path)
        lib.opus_encoder_create.restype = ctypes.c_void_p
        lib.opus_get_version_string.restype = ctypes.c_char_p
        lib.opus_encode_float.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p,
                                          ctypes.c_int32]
        lib.opus_encoder_destroy.argtypes = [ctypes.c_void_p]
        best = {c: min(packet_us(lib, x, c) for _ in range(3)) for c in COMPLEXITIES}
        print(f"{lib.opus_get_version_string().decode()} ({path}): "
              + ", ".join(f"complexity {c} {us:.1f} us" for c, us in best.items()))


if __name__ == "__main__":
    main()
