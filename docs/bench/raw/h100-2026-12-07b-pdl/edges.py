"""kernels-plain.txt against kernels-pdl.txt edge by edge: for each graph and each (kind of kernel, kind of the next),
the edges, their gaps summed and the next kernels' time summed, us a replay.

    python3 edges.py > edges.txt
"""
import re
from collections import defaultdict

LINE = re.compile(r"\s*\d+\s+([\d.]+) gap\s+([\d.]+) grid .*? block \[.*?\] (.*)")   # bench/decoder_kernels.py's rows


def kind(name: str) -> str:
    if "nvjet" in name:
        return "nvjet"                                           # cuBLAS
    if "xmma" in name or "cudnn" in name:
        return "cudnn"
    if name.startswith("triton_"):
        return "triton_ind"                                      # Inductor's
    if name.split()[0].endswith("_kernel") and "at::" not in name and "void" not in name:
        return "ours"                                            # talkgate's Triton kernels
    return "aten"


def kernels(path: str, graph: str) -> list[tuple[float, float, str]]:
    """(duration, gap before it, kind) of each kernel of one replay of `graph`."""
    rows, inside = [], False
    for line in open(path):
        if re.match(r"^\w+ graph B=", line):
            inside = line.startswith(f"{graph} graph B=")
        elif inside and (m := LINE.match(line)):
            rows.append((float(m.group(1)), float(m.group(2)), kind(m.group(3))))
    return rows


def edges(rows) -> dict:
    """(kind, next kind) -> [edges, gaps summed, next kernels' time summed]."""
    out = defaultdict(lambda: [0, 0.0, 0.0])
    for (_, _, before), (dur, gap, after) in zip(rows, rows[1:]):
        e = out[before, after]
        e[0] += 1
        e[1] += gap
        e[2] += dur
    return out


for graph in ("talker", "codes", "decode"):
    print("==", graph)
    plain, pdl = (edges(kernels(f"kernels-{name}.txt", graph)) for name in ("plain", "pdl"))
    for k in sorted(set(plain) | set(pdl)):
        a, b = plain.get(k, [0, 0, 0]), pdl.get(k, [0, 0, 0])
        print(f"{k[0]:>10} -> {k[1]:<10} n={a[0]:4d}/{b[0]:4d} gap {a[1]:7.1f} -> {b[1]:7.1f}   "
              f"next-kernel time {a[2]:8.1f} -> {b[2]:8.1f}")
