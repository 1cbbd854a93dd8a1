"""PyTorch side of bench_vae: diffusers' AutoencoderKLWan (the Wan2.1 VAE
configuration, diffusers' own random initialisation) in BF16 on the same GPU
and shapes: latent [1, 16, 21, 60, 104] -> video [1, 3, 81, 480, 832], untiled
and with diffusers' tiling (enable_tiling(): 256x256 pixels every 192), then
the encoder on 81 frames. Each call timed by wall clock and CUDA events after a
warm-up decode of 2 latent frames; peak = torch.cuda.max_memory_allocated()
during the call (weights included). The decoded video stays on the GPU here
(bench_vae's includes its copy to host f32 frames). Prints one JSON object
with bench_vae's keys. diffusers travels as a wheel (not in the GPU image).
"""

import json
import sys
import time

import torch

try:
    from diffusers import AutoencoderKLWan
except ImportError:  # not in the GPU image: carry diffusers' wheel (and importlib_metadata's)
    print(json.dumps({"skipped": "diffusers is not installed here; carry diffusers==0.42.1 and importlib_metadata "
                                 "as wheels (see /work/.library/device/README.md's notes)"}))
    sys.exit(0)

FRAMES, H, W = 21, 60, 104
REPS = 1


def measure(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    a.record()
    fn()
    b.record()
    b.synchronize()
    wall = (time.perf_counter() - t0) * 1e3
    r = {"wall_ms": wall, "event_ms": a.elapsed_time(b), "peak_mib": torch.cuda.max_memory_allocated() / 2**20}
    print(f"  {r}", file=sys.stderr)
    return r


def main():
    dev = torch.device("cuda")
    vae = AutoencoderKLWan().to(dev, torch.bfloat16).eval()
    g = torch.Generator(device=dev).manual_seed(7)
    latent = torch.rand(1, 16, FRAMES, H, W, device=dev, generator=g, dtype=torch.float32).mul(4).sub(2).bfloat16()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": "bf16",
           "latent": [1, 16, FRAMES, H, W], "tiling": "256x256 every 192x192"}
    with torch.no_grad():
        t0 = time.perf_counter()
        vae.decode(latent[:, :, :2])
        torch.cuda.synchronize()
        out["warmup_s"] = time.perf_counter() - t0
        out["weights_mib"] = torch.cuda.memory_allocated() / 2**20
        print("decode untiled:", file=sys.stderr)
        out["decode_untiled"] = [measure(lambda: vae.decode(latent)) for _ in range(REPS)]
        vae.enable_tiling()
        print("decode tiled:", file=sys.stderr)
        out["decode_tiled"] = [measure(lambda: vae.decode(latent)) for _ in range(REPS)]
        vae.disable_tiling()
        video = torch.rand(1, 3, 4 * (FRAMES - 1) + 1, 8 * H, 8 * W, device=dev, generator=g).mul(2).sub(1).bfloat16()
        vae.encode(video[:, :, :5])
        print("encode untiled:", file=sys.stderr)
        out["encode_untiled"] = [measure(lambda: vae.encode(video))]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
