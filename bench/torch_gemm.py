"""PyTorch side of bench_gemm: the same Wan linear shapes on the same GPU,
timed with CUDA events after warm-up (median of each run between its own pair
of events), printed as one JSON object whose shape keys match bench_gemm.cu's.

What each variant is:
  linear_bf16    F.linear(X, W), bf16 X[M,K], W[N,K] (cuBLAS, fp32 accumulation)
  int_mm         torch._int_mm(A, W^T): int8 x int8 -> int32, no scales
                 (W stored [N,K] and passed transposed: the TN layout it wants)
  scaled_mm_fp8  torch._scaled_mm(A8, W8^T, scale_a, scale_b, out_dtype=bf16):
                 fp8 e4m3 per-tensor scales, cuBLASLt's FP8 GEMM
Each reports median_ms, TOP/s and speedup_vs_bf16 (linear_bf16 time / own time).
Inputs rotate among copies when one set is smaller than twice the L2.

  python3 bench/torch_gemm.py [--small-only | --large-only]
"""

import argparse
import json

import torch
import torch.nn.functional as F

SHAPES = [("1.3B_qkv", 32760, 1536, 1536), ("1.3B_ffn1", 32760, 1536, 8960), ("1.3B_ffn2", 32760, 8960, 1536),
          ("14B_qkv", 75600, 5120, 5120), ("14B_ffn1", 75600, 5120, 13824), ("14B_ffn2", 75600, 13824, 5120)]


def time_ms(fn, large):
    warmup, reps = (3, 15) if large else (20, 100)
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(warmup + i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2], times[0]


def rotation_count(nbytes):
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(8, -(-2 * l2 // max(nbytes, 1))))


def bench_shape(M, K, N):
    large = M > 4096
    flop = 2.0 * M * N * K
    sets = rotation_count(M * K * 3 + N * K * 3 + M * N * 2)
    g = torch.Generator(device="cuda").manual_seed(0)
    xs = [torch.randn(M, K, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(sets)]
    ws = [torch.randn(N, K, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02 for _ in range(sets)]
    res = {"M": M, "K": K, "N": N, "gflop": flop / 1e9, "input_sets": sets}

    def record(name, fn):
        try:
            ms, mn = time_ms(fn, large)
        except Exception as ex:  # e.g. a PyTorch build without this kernel
            res[name] = {"error": str(ex)[:200]}
            return
        r = {"median_ms": ms, "min_ms": mn, "tops": flop / (ms * 1e-3) / 1e12}
        if "linear_bf16" in res and "median_ms" in res["linear_bf16"]:
            r["speedup_vs_bf16"] = res["linear_bf16"]["median_ms"] / ms
        res[name] = r

    record("linear_bf16", lambda i: F.linear(xs[i % sets], ws[i % sets]))
    a8 = [torch.randint(-128, 128, (M, K), device="cuda", generator=g, dtype=torch.int8) for _ in range(sets)]
    w8 = [torch.randint(-128, 128, (N, K), device="cuda", generator=g, dtype=torch.int8) for _ in range(sets)]
    record("int_mm", lambda i: torch._int_mm(a8[i % sets], w8[i % sets].t()))
    del a8, w8
    f8 = [x.to(torch.float8_e4m3fn) for x in xs]
    wf8 = [(w * 50).to(torch.float8_e4m3fn) for w in ws]
    one = torch.tensor(1.0, device="cuda")
    record("scaled_mm_fp8",
           lambda i: torch._scaled_mm(f8[i % sets], wf8[i % sets].t(), one, one, out_dtype=torch.bfloat16))
    del f8, wf8, xs, ws
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small-only", action="store_true")
    ap.add_argument("--large-only", action="store_true")
    args = ap.parse_args()
    p = torch.cuda.get_device_properties(0)
    out = {"bench": "torch_gemm", "device": {"name": p.name, "cc": f"{p.major}.{p.minor}",
                                             "sms": p.multi_processor_count},
           "torch": torch.__version__, "cuda": torch.version.cuda, "shapes": {}}
    for name, M, K, N in SHAPES:
        if not args.small_only:
            out["shapes"][name] = bench_shape(M, K, N)
        if not args.large_only:
            out["shapes"][name + "_M512"] = bench_shape(512, K, N)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
