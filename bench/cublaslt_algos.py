"""How much faster could the step's projections be with cuBLASLt's algorithm chosen by timing, not by its heuristic?
(issue 44)

    python3 -m bench.cublaslt_algos --rows 64,256,512 [--algos 32] [--workspace-mb 32]

PyTorch asks cuBLASLt's heuristic for one algorithm per multiply and runs it (runner.py prefers cuBLASLt on CUDA).
At 256 rows the code predictor's ~330 multiplies a frame take ~7 us each whatever their bytes (docs/benchmarks.md
"The narrow projections split over K"), and the heuristic's ranking is a model, not a measurement. For each projection
of the 1.7B Talker and of the code predictor (q/k/v and gate/up fused, bfloat16, F.linear's layout: out [M, N] = x
[M, K] @ W[N, K].T), this asks the heuristic for up to --algos candidates (tile shapes, split-K, stages ...), runs each
through cuBLASLt directly (ctypes, the library torch loaded), and times it, with F.linear (PyTorch's own call) beside
them: every way in a CUDA graph of calls over weight copies of >= 128 MB together (each call's weight read from HBM,
as in the step), us a multiply, the median of --reps replays. Prints a table: F.linear, the heuristic's first, the
best candidate (its rank in the heuristic's list, its algorithm, split-K, tile and stages ids, its workspace), and the
best's result checked against F.linear's. Written 2026-12-06 and not yet run (no device machine came that session).
"""
from __future__ import annotations

import argparse
import ctypes

import torch
import torch.nn.functional as F

from bench.persistent import graph_ms

# cublasLt / CUDA enums (cublasLt.h, library_types.h, cublas_api.h)
COMPUTE_32F = 68
R_32F, R_16BF = 0, 14
OP_N, OP_T = 0, 1
DESC_TRANSA, DESC_TRANSB = 3, 4
PREF_MAX_WORKSPACE_BYTES = 1
ALGO_CONFIG_ID, ALGO_CONFIG_TILE_ID, ALGO_CONFIG_SPLITK_NUM, ALGO_CONFIG_STAGES_ID = 0, 1, 2, 6   # AlgoConfigAttributes_t

# (name, K, N): 1.7B sizes (the 0.6B Talker's projections are the code predictor's shapes)
SHAPES = [("talker qkv", 2048, 4096), ("talker o", 2048, 2048), ("talker gate/up", 2048, 12288),
          ("talker down", 6144, 2048), ("predictor qkv", 1024, 4096), ("predictor o", 2048, 1024),
          ("predictor gate/up", 1024, 6144), ("predictor down", 3072, 1024), ("predictor head", 1024, 2048)]


class HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def loaded_cublaslt() -> ctypes.CDLL:
    """The libcublasLt torch loaded (it maps it on the first multiply)."""
    a = torch.ones(16, 16, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcublasLt" in line}
    if not paths:
        raise SystemExit("libcublasLt is not mapped in this process")
    return ctypes.CDLL(sorted(paths)[0])


def check(status: int, what: str):
    if status != 0:
        raise RuntimeError(f"{what}: cublasStatus {status}")


class Lt:
    def __init__(self, lib: ctypes.CDLL, workspace_bytes: int):
        self.lib = lib
        self.handle = ctypes.c_void_p()
        check(lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device="cuda")
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def layout(self, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        out = ctypes.c_void_p()
        check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(out), R_16BF, ctypes.c_uint64(rows),
                                                  ctypes.c_uint64(cols), ctypes.c_int64(ld)), "layout")
        return out

    def problem(self, M: int, K: int, N: int):
        """F.linear's out [M, N] = x [M, K] @ W [N, K].T, column-major: out.T [N, M] = op_T(W as [K, N]) @ x.T [K, M]."""
        desc = ctypes.c_void_p()
        check(self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, R_32F), "desc")
        for attr, op in ((DESC_TRANSA, OP_T), (DESC_TRANSB, OP_N)):
            value = ctypes.c_int32(op)
            check(self.lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(value), ctypes.c_size_t(4)),
                  "desc attribute")
        return desc, self.layout(K, N, K), self.layout(K, M, K), self.layout(N, M, N)

    def candidates(self, problem, count: int) -> list[HeuristicResult]:
        desc, a, b, c = problem
        pref = ctypes.c_void_p()
        check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
        size = ctypes.c_uint64(self.workspace.numel())
        check(self.lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(size),
                                                             ctypes.c_size_t(8)),
              "preference attribute")
        results, returned = (HeuristicResult * count)(), ctypes.c_int(0)
        check(self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, a, b, c, c, pref, count, results,
                                                      ctypes.byref(returned)), "heuristic")
        return [results[i] for i in range(returned.value) if results[i].state == 0]

    def config(self, result: HeuristicResult, attr: int) -> int:
        value, written = ctypes.c_uint32(0), ctypes.c_size_t(0)
        self.lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(result.algo), attr, ctypes.byref(value),
                                                      ctypes.c_size_t(4),
                                                      ctypes.byref(written))
        return value.value

    def matmul(self, problem, result: HeuristicResult, w: torch.Tensor, x: torch.Tensor, out: torch.Tensor):
        desc, a, b, c = problem
        check(self.lib.cublasLtMatmul(
            self.handle, desc, ctypes.byref(self.alpha), ctypes.c_void_p(w.data_ptr()), a,
            ctypes.c_void_p(x.data_ptr()), b, ctypes.byref(self.beta), ctypes.c_void_p(out.data_ptr()), c,
            ctypes.c_void_p(out.data_ptr()), c, ctypes.byref(result.algo), ctypes.c_void_p(self.workspace.data_ptr()),
            ctypes.c_size_t(self.workspace.numel()), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)),
            "cublasLtMatmul")


def us_a_call(calls, n_calls: int, reps: int) -> float:
    """calls() issues n_calls multiplies; captured in a CUDA graph, us a multiply (median of reps replays)."""
    return 1e3 * graph_ms(calls, reps=1, rounds=reps) / n_calls


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="64,256,512")
    p.add_argument("--algos", type=int, default=32, help="heuristic candidates asked for")
    p.add_argument("--workspace-mb", type=int, default=32)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--shapes", default="", help="comma-separated substrings of the shape names (default: all)")
    a = p.parse_args(argv)
    torch.backends.cuda.preferred_blas_library("cublaslt")                 # as runner.py sets it on CUDA
    lt = Lt(loaded_cublaslt(), a.workspace_mb << 20)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuBLASLt {lt.lib.cublasLtGetVersion()}, "
          f"workspace {a.workspace_mb} MB, up to {a.algos} candidates")
    print("| shape | rows | F.linear us | heuristic's first us | best us (index; algo, split-K, tile, stages ids; workspace KB) "
          "| best / F.linear | candidates | best's max error vs F.linear |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    wanted = [s for s in a.shapes.split(",") if s]
    for name, K, N in SHAPES:
        if wanted and not any(s in name for s in wanted):
            continue
        copies = max(2, -(-(128 << 20) // (N * K * 2)))
        weights = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5 for _ in range(copies)]
        for M in (int(r) for r in a.rows.split(",")):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            outs = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]

            def torch_calls():
                for w, o in zip(weights, outs):
                    torch.mm(x, w.T, out=o)
            base = us_a_call(torch_calls, copies, a.reps)
            want = F.linear(x, weights[0])
            problem = lt.problem(M, K, N)
            timed = []
            for i, result in enumerate(lt.candidates(problem, a.algos)):
                if result.workspaceSize > lt.workspace.numel():
                    continue

                def lt_calls(result=result):
                    for w, o in zip(weights, outs):
                        lt.matmul(problem, result, w, x, o)
                try:
                    timed.append((us_a_call(lt_calls, copies, a.reps), i, result))
                except RuntimeError as e:                                  # an algorithm that refuses the problem
                    print(f"  {name} M={M} candidate {i}: {e}")
            if not timed:
                print(f"| {name} | {M} | {base:.2f} | - | - | - | 0 | - |")
                continue
            first = next((t for t in timed if t[1] == 0), timed[0])
            best = min(timed, key=lambda t: t[0])
            lt.matmul(problem, best[2], weights[0], x, outs[0])
            err = (outs[0].float() - want.float()).abs().max().item()
            cfg = "/".join(str(lt.config(best[2], attr)) for attr in
                           (ALGO_CONFIG_ID, ALGO_CONFIG_SPLITK_NUM, ALGO_CONFIG_TILE_ID, ALGO_CONFIG_STAGES_ID))
            print(f"| {name} | {M} | {base:.2f} | {first[0]:.2f} | {best[0]:.2f} ({best[1]}; {cfg}; "
                  f"{best[2].workspaceSize >> 10}) | {best[0] / base:.2f} | "
                  f"{len(timed)} | {err:.2e} |", flush=True)
        del weights


if __name__ == "__main__":
    main()
