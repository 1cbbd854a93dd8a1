#!/usr/bin/env python3
"""The PyTorch reference of `turbodiff bench e2e`: one forward of diffusers'
WanTransformer3DModel (BF16, PyTorch SDPA attention) with random weights of the
same config, at the same latent size, on the same GPU, timed with CUDA events
after warm-up (median). This is what a user would otherwise run.

    python3 bench/torch_e2e.py --model 1.3B [--forwards 3] [--warmup 1] [--json out.json]
    python3 bench/torch_e2e.py --model 14B

Sizes (81 frames): 1.3B at 480x832 -> latent 16x21x60x104 (L = 32760);
14B at 720x1280 -> 16x21x90x160 (L = 75600). `--model tiny` runs a small
config (on the CPU when there is no GPU) to check the script itself.

diffusers is not installed on the GPU machine: scripts/e2e_gpu.sh installs the
wheels carried in .whl/ (diffusers, importlib_metadata) to /tmp/site first.
"""
import argparse
import json
import sys
import time

import torch

CONFIGS = {
    # diffusers' WanTransformer3DModel arguments of the published T2V models.
    "1.3B": dict(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960, num_layers=30),
    "14B": dict(num_attention_heads=40, attention_head_dim=128, ffn_dim=13824, num_layers=40),
    "tiny": dict(num_attention_heads=2, attention_head_dim=64, ffn_dim=256, num_layers=2),
}
RESOLUTION = {"1.3B": (480, 832), "14B": (720, 1280), "tiny": (64, 64)}


def skip(res, args):
    text = json.dumps(res)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(CONFIGS), default="1.3B")
    ap.add_argument("--frames", type=int, default=None, help="4k+1 (default 81, tiny 5)")
    ap.add_argument("--height", type=int, default=None)
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--forwards", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--text-len", type=int, default=512)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default=None, help="default: bf16 on CUDA, f32 on the CPU")
    ap.add_argument("--json", default=None, help="write the JSON here (default: stdout)")
    args = ap.parse_args()

    try:
        from diffusers import WanTransformer3DModel
        import diffusers
    except ImportError as e:
        # scripts/gpu_check.sh runs every bench/torch_*.py: say why and do not fail the run.
        skip({"command": "torch_e2e", "skipped": f"diffusers is not importable ({e}); "
              "scripts/e2e_gpu.sh installs the wheels from .whl/ first"}, args)
        return

    cuda = torch.cuda.is_available()
    if not cuda and args.model != "tiny":
        skip({"command": "torch_e2e", "skipped": f"--model {args.model} needs a CUDA GPU (tiny runs on the CPU)"}, args)
        sys.exit(1)
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype or ("bf16" if cuda else "f32")]
    frames = args.frames or (5 if args.model == "tiny" else 81)
    height, width = RESOLUTION[args.model]
    height = args.height or height
    width = args.width or width
    latent = (1, 16, (frames - 1) // 4 + 1, height // 8, width // 8)
    tokens = latent[2] * (latent[3] // 2) * (latent[4] // 2)

    cfg = dict(patch_size=(1, 2, 2), in_channels=16, out_channels=16, text_dim=4096, freq_dim=256,
               cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None,
               added_kv_proj_dim=None, rope_max_seq_len=1024)
    cfg.update(CONFIGS[args.model])
    if args.model == "tiny":
        cfg["text_dim"] = 64

    torch.manual_seed(0)
    t0 = time.time()
    # Built directly on the device (random init there: fast at 14B), then cast
    # to BF16 as from_pretrained(torch_dtype=torch.bfloat16) loads it: the
    # modules diffusers keeps in fp32 (_keep_in_fp32_modules: rope, time
    # embedder, scale_shift_table, norms) stay fp32.
    with dev:
        model = WanTransformer3DModel(**cfg)
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or [])
    for name, mod in model.named_modules():
        if next(mod.children(), None) is None and not (keep & set(name.split("."))):
            mod.to(dtype)
    for name, p in model.named_parameters(recurse=False):  # parameters held by the top module itself
        if name not in keep:
            p.data = p.data.to(dtype)
    model = model.eval()
    if cuda:
        torch.cuda.synchronize()
    build_s = time.time() - t0
    params = sum(p.numel() for p in model.parameters())

    x = torch.randn(latent, device=dev, dtype=dtype)
    t = torch.tensor([500.0], device=dev)
    ctx = torch.randn(1, args.text_len, cfg["text_dim"], device=dev, dtype=dtype) * 0.5

    def forward():
        with torch.no_grad():
            return model(hidden_states=x, timestep=t, encoder_hidden_states=ctx, return_dict=False)[0]

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup):
        forward()
    ms = []
    for _ in range(args.forwards):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = forward()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        else:
            s = time.perf_counter()
            out = forward()
            ms.append((time.perf_counter() - s) * 1e3)
    assert tuple(out.shape) == latent, (out.shape, latent)
    assert torch.isfinite(out.float()).all(), "non-finite output"
    srt = sorted(ms)
    res = {
        "command": "torch_e2e",
        "model": args.model,
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items()},
        "parameters": params,
        "frames": frames,
        "height": height,
        "width": width,
        "latent": list(latent),
        "tokens": tokens,
        "text_len": args.text_len,
        "dtype": str(dtype).replace("torch.", ""),
        "attention": "PyTorch SDPA (diffusers' default attention dispatch)",
        "fp32_modules": sorted(keep),
        "forward_ms": srt[len(srt) // 2],
        "forward_ms_min": srt[0],
        "forward_ms_max": srt[-1],
        "forward_ms_all": ms,
        "warmup": args.warmup,
        "build_s": build_s,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
    }
    if cuda:
        res["sdpa_backends_enabled"] = {
            "flash": torch.backends.cuda.flash_sdp_enabled(),
            "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
            "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "math": torch.backends.cuda.math_sdp_enabled(),
        }
    text = json.dumps(res, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
        print(f"torch_e2e {args.model}: forward {res['forward_ms']:.1f} ms (median of {len(ms)}), "
              f"peak {((res['peak_gpu_bytes'] or 0) / 2**30):.2f} GiB -> {args.json}", file=sys.stderr)
    else:
        print(text)


if __name__ == "__main__":
    main()
