#!/usr/bin/env python3
"""Eager PyTorch equivalents of bench_quant_rope.cu's ops, on the same shapes
and GPU, timed with CUDA events (median of each call between its own pair of
events, after warm-up). Prints one JSON object whose shape and op keys match
bench_quant_rope.cu's, so each op's speed-up is torch median / ours.

What each op is in eager PyTorch (bf16 activations, as in the bench):
  quant_block128         TurboDiffusion's 128x128 block format written in torch
                         ops: pad to 128, view as blocks, amax (floor 1e-8),
                         x * 128/amax, round (half to even), clamp [-128, 127]
  quant_token128         1x128 groups: amax/127, zero groups -> 0; scales
                         transposed to the K-block-major [K/128, M] layout
  quant_per_row          one amax/127 scale per row
  ln_mod_quant_token128  Wan's modulated LayerNorm in fp32 —
  ln_mod_quant_block128    F.layer_norm(x.float(), eps=1e-6) * (1 + scale) + shift —
                         followed by the quantizer above (the unfused sequence
                         the fused kernel replaces; target: fused >= 10x this).
                         bench_quant_rope.cu also times its portable block128
                         kernel as ln_mod_quant_block128_portable (same eager
                         baseline: ln_mod_quant_block128)
  qk_norm_rope_blhd      Wan's WanRMSNorm on q and k (fp32 norm, cast, * weight)
  qk_norm_rope_bhld        and rope_apply (fp64 view_as_complex products with the
                         per-axis freqs of rope_params, built per call as Wan
                         does), cast to bf16 for attention; bhld adds the
                         transpose(1, 2).contiguous() to (B, H, L, D)
  copy                   x.clone(): the copy bandwidth seen from PyTorch

  python3 bench/torch_quant_rope.py [--device cuda|cpu] [--small]
  (--small --device cpu: a tiny shape, to check the script runs without a GPU)
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F

SHAPES = [  # name, tokens, dim, (frames, height, width), heads, head_dim — as bench_quant_rope.cu
    ("wan13_480p", 32760, 1536, (21, 30, 52), 12, 128),
    ("wan14_720p", 75600, 5120, (21, 45, 80), 40, 128),
]
SMALL = [("small", 96, 256, (2, 4, 12), 2, 128)]
EPS = 1e-6
THETA = 10000.0


def cdiv(a, b):
    return (a + b - 1) // b


def quant_block128(x):
    m, k = x.shape
    mp, kp = cdiv(m, 128) * 128, cdiv(k, 128) * 128
    xp = F.pad(x, (0, kp - k, 0, mp - m)) if (mp, kp) != (m, k) else x
    blocks = xp.view(mp // 128, 128, kp // 128, 128)
    amax = blocks.abs().amax(dim=(1, 3)).float().clamp_min(1e-8)
    # 128.0 / amax would be reciprocal(amax) * 128 in torch: exact here (a power
    # of two), but spelled as a true division like the kernel's.
    inv = (torch.full_like(amax, 128.0) / amax)[:, None, :, None]
    q = (blocks.float() * inv).round().clamp(-128, 127).to(torch.int8).view(mp, kp)[:m, :k]
    return q, amax / 128.0


def quant_token128(x):
    m, k = x.shape
    kp = cdiv(k, 128) * 128
    xp = F.pad(x, (0, kp - k)) if kp != k else x
    g = xp.view(m, kp // 128, 128).float()
    amax = g.abs().amax(-1)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))  # true division
    q = (g * inv[..., None]).round().clamp(-127, 127).to(torch.int8).view(m, kp)[:, :k]
    return q, (amax / 127.0).t().contiguous()


def quant_per_row(x):
    xf = x.float()
    amax = xf.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    return (xf * inv).round().clamp(-127, 127).to(torch.int8), (amax / 127.0).squeeze(-1)


def ln_modulate(x, shift, scale):
    return F.layer_norm(x.float(), (x.shape[-1],), eps=EPS) * (1 + scale) + shift


def rope_params(max_seq_len, dim):  # Wan's
    freqs = torch.outer(torch.arange(max_seq_len),
                        1.0 / torch.pow(THETA, torch.arange(0, dim, 2).to(torch.float64).div(dim)))
    return torch.polar(torch.ones_like(freqs), freqs)


def wan_freqs(d, device):
    return torch.cat([rope_params(1024, d - 4 * (d // 6)), rope_params(1024, 2 * (d // 6)),
                      rope_params(1024, 2 * (d // 6))], dim=1).to(device)


def rope_apply(x, grid, freqs):  # Wan's, x [B, L, H, D]
    n, c = x.size(2), x.size(3) // 2
    freqs = freqs.split([c - 2 * (c // 3), c // 3, c // 3], dim=1)
    out = []
    f, h, w = grid
    for i in range(x.size(0)):
        seq_len = f * h * w
        x_i = torch.view_as_complex(x[i, :seq_len].to(torch.float64).reshape(seq_len, n, -1, 2))
        freqs_i = torch.cat([
            freqs[0][:f].view(f, 1, 1, -1).expand(f, h, w, -1),
            freqs[1][:h].view(1, h, 1, -1).expand(f, h, w, -1),
            freqs[2][:w].view(1, 1, w, -1).expand(f, h, w, -1),
        ], dim=-1).reshape(seq_len, 1, -1)
        out.append(torch.view_as_real(x_i * freqs_i).flatten(2))
    return torch.stack(out).float()


def wan_rms_norm(x, weight):  # WanRMSNorm.forward
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(dim=-1, keepdim=True) + EPS)).type_as(x) * weight


def qk_norm_rope(q, k, wq, wk, grid, heads, freqs, bhld):
    b, l, _ = q.shape
    qr = rope_apply(wan_rms_norm(q, wq).view(b, l, heads, -1), grid, freqs).to(torch.bfloat16)
    kr = rope_apply(wan_rms_norm(k, wk).view(b, l, heads, -1), grid, freqs).to(torch.bfloat16)
    if bhld:
        return qr.transpose(1, 2).contiguous(), kr.transpose(1, 2).contiguous()
    return qr, kr


def timer(device):
    if device == "cuda":
        def time_ms(fn, reps):
            fn()
            torch.cuda.synchronize()
            times = []
            for _ in range(reps):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            times.sort()
            return {"median_ms": times[len(times) // 2], "min_ms": times[0], "runs": reps}
    else:
        import time

        def time_ms(fn, reps):
            fn()
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            times.sort()
            return {"median_ms": times[len(times) // 2], "min_ms": times[0], "runs": reps}
    return time_ms


def bench_shape(name, tokens, dim, grid, heads, head_dim, device, reps):
    assert grid[0] * grid[1] * grid[2] == tokens and heads * head_dim == dim
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(tokens, dim, device=device, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(tokens, dim, device=device, dtype=torch.bfloat16, generator=gen)
    e0 = 0.3 * torch.randn(1, 6, dim, device=device, dtype=torch.float32, generator=gen)
    shift, scale = e0[:, 0], e0[:, 1]
    wq = torch.randn(dim, device=device, dtype=torch.float32, generator=gen)
    wk = torch.randn(dim, device=device, dtype=torch.float32, generator=gen)
    freqs = wan_freqs(head_dim, device)
    time_ms = timer(device)
    elems = tokens * dim
    ops = {}

    def add(key, fn, nbytes):
        r = time_ms(fn, reps)
        r["bytes"] = nbytes
        r["gbps"] = nbytes / (r["median_ms"] * 1e-3) / 1e9
        ops[key] = r

    add("copy", lambda: x.clone(), 2 * elems * 2)
    add("quant_block128", lambda: quant_block128(x), 3 * elems)
    add("quant_token128", lambda: quant_token128(x), 3 * elems)
    add("quant_per_row", lambda: quant_per_row(x), 3 * elems)
    add("ln_mod_quant_token128", lambda: quant_token128(ln_modulate(x, shift, scale)), 3 * elems)
    add("ln_mod_quant_block128", lambda: quant_block128(ln_modulate(x, shift, scale)), 3 * elems)
    q3, k3 = x.view(1, tokens, dim), k.view(1, tokens, dim)
    add("qk_norm_rope_blhd", lambda: qk_norm_rope(q3, k3, wq, wk, grid, heads, freqs, False), 2 * elems * 4)
    add("qk_norm_rope_bhld", lambda: qk_norm_rope(q3, k3, wq, wk, grid, heads, freqs, True), 2 * elems * 4)
    return {"tokens": tokens, "dim": dim, "heads": heads, "head_dim": head_dim, "grid": list(grid), "ops": ops}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--small", action="store_true", help="a tiny shape instead of Wan's")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"bench": "torch_quant_rope", "error": "no CUDA device visible to PyTorch"}))
        return
    out = {"bench": "torch_quant_rope", "torch": torch.__version__, "dtype": "bf16"}
    if args.device == "cuda":
        p = torch.cuda.get_device_properties(0)
        out["device"] = {"name": p.name, "cc": f"{p.major}.{p.minor}", "sms": p.multi_processor_count}
    else:
        out["device"] = {"name": "cpu"}
    out["shapes"] = {}
    for shape in (SMALL if args.small else SHAPES):
        out["shapes"][shape[0]] = bench_shape(*shape, args.device, args.reps)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
