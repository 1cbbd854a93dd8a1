#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the shapes of bench_attention.cu:
the cuDNN backend (the `original` target: ours must be >= 1.0x it) and the
FlashAttention-2 backend, each forced with torch.nn.attention.sdpa_kernel.

BF16, head_dim 128, no mask, default scale 1/sqrt(D). Tensors are made in the
same memory order as our bench ("BLHD": (B, L, H, D) viewed as (B, H, L, D)
through transpose(1, 2), as a model's QKV projection gives them; "BHLD":
contiguous (B, H, L, D)). CUDA events around each call, median after one
warm-up call, repetitions sized to ~1 s per backend and shape (3 at least).
Prints one JSON object.

  python3 bench/torch_attention.py [name-filter-substring] [--out FILE]
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [  # name, B, H, Lq, Lk, D, layout  (same list as bench_attention.cu)
    ("wan1.3b_480p_self", 1, 12, 32760, 32760, 128, "BLHD"),
    ("wan1.3b_480p_self_bhld", 1, 12, 32760, 32760, 128, "BHLD"),
    ("wan14b_480p_self", 1, 40, 32760, 32760, 128, "BLHD"),
    ("wan14b_720p_self", 1, 40, 75600, 75600, 128, "BLHD"),
    ("wan1.3b_480p_cross", 1, 12, 32760, 512, 128, "BLHD"),
    ("wan14b_720p_cross", 1, 40, 75600, 512, 128, "BLHD"),
]
BACKENDS = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]


def make(B, H, L, D, layout, gen):
    if layout == "BLHD":
        return torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
    return torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=gen)


def time_ms(fn, reps):
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2], times[0], reps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("filter", nargs="?", default="", help="only shapes whose name contains this")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()

    props = torch.cuda.get_device_properties(0)
    out = {
        "bench": "torch_attention",
        "device": {"name": props.name, "sms": props.multi_processor_count},
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "flops_formula": "4*B*H*Lq*Lk*D",
        "results": [],
    }
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, B, H, Lq, Lk, D, layout in SHAPES:
        if args.filter and args.filter not in name:
            continue
        q = make(B, H, Lq, D, layout, gen)
        k = make(B, H, Lk, D, layout, gen)
        v = make(B, H, Lk, D, layout, gen)
        flop = 4.0 * B * H * Lq * Lk * D
        r = {"name": name, "batch": B, "heads": H, "len_q": Lq, "len_kv": Lk, "head_dim": D, "layout": layout,
             "gflop": flop / 1e9}
        outputs = {}
        for key, backend in BACKENDS:
            try:
                with sdpa_kernel([backend]):
                    fn = lambda: F.scaled_dot_product_attention(q, k, v)
                    outputs[key] = fn()  # warm-up
                    one, _, _ = time_ms(fn, 1)
                    reps = max(3, min(50, int(1000.0 / max(one, 1e-3))))
                    med, mn, n = time_ms(fn, reps)
                r[f"{key}_ms"] = med
                r[f"{key}_min_ms"] = mn
                r[f"{key}_runs"] = n
                r[f"{key}_tflops"] = flop / (med * 1e-3) / 1e12
            except Exception as e:  # a backend that refuses the shape is reported, not fatal
                r[f"{key}_error"] = str(e)[:300]
        if "cudnn" in outputs and "flash" in outputs:
            a, b = outputs["flash"].float(), outputs["cudnn"].float()
            r["flash_vs_cudnn_rel_l2"] = float((a - b).norm() / b.norm())
        del q, k, v, outputs
        torch.cuda.empty_cache()
        out["results"].append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
