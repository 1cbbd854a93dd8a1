"""PyTorch side of bench_norm: the same ops at the same Wan shapes (bf16
activations) on the same GPU, timed with CUDA events after warm-up (median of
50 runs, each between its own pair of events), with the same byte counts
(each input read once, each output written once), so its JSON lines up key
for key with bench/bench_norm.cu's.

What each op is in PyTorch:
  rms_norm, layer_norm: F.rms_norm / F.layer_norm (fused; bf16 parameters)
  adaln_modulate: the eager fp32 modulated LayerNorm Wan / diffusers run:
      (F.layer_norm(x.float(), (D,), eps=1e-6) * (1 + scale) + shift).to(bf16)
  residual_gate_norm_bf16: diffusers' bf16 residual stream:
      x = (x.float() + y * gate).to(bf16); out = modulated LN of x as above
  residual_gate_norm_f32res: Wan's fp32 residual stream:
      x = x + y * gate (fp32); out = (F.layer_norm(x, ...) * (1 + scale) + shift).to(bf16)
  gelu_tanh, silu: F.gelu(approximate='tanh'), F.silu
  add_full: x + y; add_vector: x + b[D]; mul_per_sample: x * s[1, D] (bf16 vectors,
      so the output stays bf16 as in the CUDA kernels)
"""

import json

import torch
import torch.nn.functional as F

SHAPES = [(32760, 1536), (75600, 5120)]
EPS = 1e-6
WARMUP, REPS = 10, 50


def time_ms(fn):
    """Median and min milliseconds of fn() on the current stream."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2], times[0]


def copy_tbps(nbytes):
    a = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms, _ = time_ms(lambda: b.copy_(a))
    return 2 * nbytes / (ms * 1e-3) / 1e12


def bench_shape(rows, dim):
    n = rows * dim
    copy = copy_tbps(n * 4)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, dim, device="cuda", generator=g).to(torch.bfloat16)
    y = torch.randn(rows, dim, device="cuda", generator=g).to(torch.bfloat16)
    x32 = torch.randn(rows, dim, device="cuda", generator=g)
    w = (torch.randn(dim, device="cuda", generator=g) * 0.5)
    b = (torch.randn(dim, device="cuda", generator=g) * 0.5)
    e0 = torch.randn(6, dim, device="cuda", generator=g) * 0.5  # fp32, as Wan's modulation
    shift, scale, gate = e0[0], e0[1], e0[2]
    w16, b16, s16 = w.to(torch.bfloat16), b.to(torch.bfloat16), scale.to(torch.bfloat16)

    def modulated_ln(v):
        return (F.layer_norm(v.float(), (dim,), eps=EPS) * (1 + scale) + shift).to(torch.bfloat16)

    def rgn_bf16():
        xn = (x.float() + y * gate).to(torch.bfloat16)
        return xn, modulated_ln(xn)

    def rgn_f32():
        xn = x32 + y * gate
        return xn, (F.layer_norm(xn, (dim,), eps=EPS) * (1 + scale) + shift).to(torch.bfloat16)

    E = float(n)
    ops = {
        "rms_norm": (4 * E, lambda: F.rms_norm(x, (dim,), w16, EPS)),
        "layer_norm": (4 * E, lambda: F.layer_norm(x, (dim,), w16, b16, EPS)),
        "adaln_modulate": (4 * E, lambda: modulated_ln(x)),
        "residual_gate_norm_bf16": (8 * E, rgn_bf16),
        "residual_gate_norm_f32res": (12 * E, rgn_f32),
        "gelu_tanh": (4 * E, lambda: F.gelu(x, approximate="tanh")),
        "silu": (4 * E, lambda: F.silu(x)),
        "add_full": (6 * E, lambda: x + y),
        "add_vector": (4 * E, lambda: x + b16),
        "mul_per_sample": (4 * E, lambda: x * s16[None, :]),
    }
    result = {}
    with torch.no_grad():
        for name, (nbytes, fn) in ops.items():
            ms, min_ms = time_ms(fn)
            tbps = nbytes / (ms * 1e-3) / 1e12
            result[name] = {
                "ms": ms,
                "min_ms": min_ms,
                "bytes": nbytes,
                "TBps": tbps,
                "frac_of_copy": tbps / copy,
                "predicted_ms_at_4TBps": nbytes / 4e12 * 1e3,
            }
    del x, y, x32
    torch.cuda.empty_cache()
    return {"copy_TBps": copy, "input_sets": 1, "ops": result}


def main():
    props = torch.cuda.get_device_properties(0)
    out = {
        "bench": "norm",
        "impl": "pytorch " + torch.__version__,
        "device": {"name": props.name, "cc": f"{props.major}.{props.minor}", "sms": props.multi_processor_count},
        "activations": "bf16",
        "shapes": {f"{r}x{d}": bench_shape(r, d) for r, d in SHAPES},
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
