#!/usr/bin/env python3
"""Fixture for the Wan VAE's spatial tiling (tests/cpu/test_wan_vae_cl.cpp).

Loads the tiny random AutoencoderKLWan of fixtures/vae (scripts/make_vae_fixtures.py),
enables diffusers' tiling with small tiles so the tiny frames are split
(tile 24x24 pixels every 16x16: latent tiles 3x3 every 2x2, an 8-pixel blend),
and saves, in fp64 rounded to f32:
  tiled_io.safetensors:
    latent [1, 16, 3, 4, 6] (normalised)  -> video_tiled  [1, 3, 9, 32, 48] = clamp(tiled_decode(latent * std + mean))
    video  [1, 3, 5, 32, 48] in [-1, 1]   -> latent_tiled [1, 16, 2, 4, 6]  = (tiled_encode(video).mean - mean) / std
The inputs are the first sample of decode_io.safetensors and the video of encode_io.safetensors.
"""
import os

import torch
from diffusers import AutoencoderKLWan
from safetensors.torch import load_file, save_file

DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "vae")


def main():
    vae = AutoencoderKLWan.from_pretrained(DIR).to(torch.float64).eval()
    vae.enable_tiling(tile_sample_min_height=24, tile_sample_min_width=24, tile_sample_stride_height=16,
                      tile_sample_stride_width=16)
    cfg = vae.config
    mean = torch.tensor(cfg.latents_mean, dtype=torch.float64).view(1, -1, 1, 1, 1)
    std = torch.tensor(cfg.latents_std, dtype=torch.float64).view(1, -1, 1, 1, 1)
    dec = load_file(os.path.join(DIR, "decode_io.safetensors"))
    enc = load_file(os.path.join(DIR, "encode_io.safetensors"))
    latent = dec["latent"][:1].to(torch.float64)
    video = enc["video"].to(torch.float64)
    with torch.no_grad():
        video_tiled = vae.decode(latent * std + mean).sample
        latent_tiled = (vae.encode(video).latent_dist.mean - mean) / std
        vae.disable_tiling()
        untiled = vae.decode(latent * std + mean).sample
    d = (video_tiled - untiled).norm() / untiled.norm()
    print(f"decode tiled {tuple(video_tiled.shape)} vs untiled rel L2 {d:.4f}; encode tiled {tuple(latent_tiled.shape)}")
    save_file({"latent": latent.float().contiguous(), "video_tiled": video_tiled.float().contiguous(),
               "video": video.float().contiguous(), "latent_tiled": latent_tiled.float().contiguous()},
              os.path.join(DIR, "tiled_io.safetensors"))


if __name__ == "__main__":
    main()
