#!/usr/bin/env python3
"""Fixtures for the Wan2.1 VAE (tests/cpu/test_wan_vae.cpp).

A tiny random diffusers AutoencoderKLWan that keeps the real structure (four
stages, two causal temporal down/upsamples, the middle attention, z_dim 16 so
the published latent mean/std apply) with base_dim 4 instead of 96, saved:
  fixtures/vae/config.json + diffusion_pytorch_model.safetensors   (diffusers names)
  fixtures/vae/original/Wan2.1_VAE.pth                              (original Wan names, torch.save state dict)
and its reference outputs (fp64 model, rounded to f32):
  decode_io.safetensors: latent [2, 16, 3, 4, 6] (normalised, as the DiT sees it)
                         video  [2, 3, 9, 32, 48] = clamp(decode(latent * std + mean), -1, 1)
  encode_io.safetensors: video  [1, 3, 5, 32, 48] in [-1, 1]
                         latent [1, 16, 2, 4, 6] = (mu - mean) / std, mu = latent_dist.mean
                         (the posterior mode; no sampling), mean/std = config latents_mean/latents_std
The original-name file is checked here by converting it back with diffusers'
own single-file converter (convert_wan_vae_to_diffusers) and comparing.
"""
import json
import os
import re

import torch
from diffusers import AutoencoderKLWan
from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "vae")
NRB = 2


def to_original(name: str) -> str:
    """diffusers AutoencoderKLWan name -> Wan2.1_VAE.pth name."""
    res_map = {"norm1.gamma": "residual.0.gamma", "conv1": "residual.2", "norm2.gamma": "residual.3.gamma",
               "conv2": "residual.6", "conv_shortcut": "shortcut"}

    def res_suffix(s):
        for k, v in res_map.items():
            if s.startswith(k):
                return v + s[len(k):]
        raise KeyError(s)

    top = {"quant_conv": "conv1", "post_quant_conv": "conv2"}
    for k, v in top.items():
        if name.startswith(k + "."):
            return v + name[len(k):]
    part, rest = name.split(".", 1)
    for a, b in (("conv_in.", "conv1."), ("norm_out.", "head.0."), ("conv_out.", "head.2.")):
        if rest.startswith(a):
            return f"{part}.{b}{rest[len(a):]}"
    m = re.match(r"mid_block\.resnets\.(\d)\.(.*)", rest)
    if m:
        return f"{part}.middle.{0 if m[1] == '0' else 2}.{res_suffix(m[2])}"
    m = re.match(r"mid_block\.attentions\.0\.(.*)", rest)
    if m:
        return f"{part}.middle.1.{m[1]}"
    m = re.match(r"down_blocks\.(\d+)\.(.*)", rest)
    if m:
        suffix = m[2] if m[2].startswith(("resample", "time_conv")) else res_suffix(m[2])
        return f"{part}.downsamples.{m[1]}.{suffix}"
    m = re.match(r"up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", rest)
    if m:
        return f"{part}.upsamples.{int(m[1]) * (NRB + 2) + int(m[2])}.{res_suffix(m[3])}"
    m = re.match(r"up_blocks\.(\d+)\.upsamplers\.0\.(.*)", rest)
    if m:
        return f"{part}.upsamples.{int(m[1]) * (NRB + 2) + NRB + 1}.{m[2]}"
    raise KeyError(name)


def main():
    os.makedirs(os.path.join(OUT, "original"), exist_ok=True)
    torch.manual_seed(20261130)
    vae = AutoencoderKLWan(base_dim=4, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=NRB,
                           temperal_downsample=[False, True, True])
    with torch.no_grad():
        for n, p in vae.named_parameters():
            if n.endswith("gamma"):  # ones by default: make the test see them
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif n.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
    vae = vae.eval()
    sd = {k: v.contiguous() for k, v in vae.state_dict().items()}
    vae.save_pretrained(OUT, safe_serialization=True)

    orig = {to_original(k): v.clone() for k, v in sd.items()}
    back = convert_wan_vae_to_diffusers(orig)
    assert set(back) == set(sd), (set(back) ^ set(sd))
    for k in sd:
        assert torch.equal(back[k], sd[k]), k
    torch.save(orig, os.path.join(OUT, "original", "Wan2.1_VAE.pth"))

    cfg = vae.config
    mean = torch.tensor(cfg.latents_mean, dtype=torch.float64).view(1, -1, 1, 1, 1)
    std = torch.tensor(cfg.latents_std, dtype=torch.float64).view(1, -1, 1, 1, 1)
    vae64 = vae.to(torch.float64)
    with torch.no_grad():
        latent = torch.randn(2, 16, 3, 4, 6, dtype=torch.float64)
        video = vae64.decode(latent * std + mean).sample
        frac = (video.abs() >= 1).double().mean().item()
        print(f"decode: video {tuple(video.shape)}, |x|>=1 (clamped) fraction {frac:.3f}, std {video.std():.3f}")
        save_file({"latent": latent.float().contiguous(), "video": video.float().contiguous()},
                  os.path.join(OUT, "decode_io.safetensors"))

        # A smooth-ish video in [-1, 1]: low-resolution noise upsampled, plus a little pixel noise.
        base = torch.rand(1, 3, 5, 8, 12, dtype=torch.float64) * 2 - 1
        vid = torch.nn.functional.interpolate(base, size=(5, 32, 48), mode="trilinear", align_corners=False)
        vid = (vid + 0.1 * torch.randn_like(vid)).clamp(-1, 1)
        mu = vae64.encode(vid).latent_dist.mean
        lat = (mu - mean) / std
        print(f"encode: latent {tuple(lat.shape)}, std {lat.std():.3f}")
        save_file({"video": vid.float().contiguous(), "latent": lat.float().contiguous()},
                  os.path.join(OUT, "encode_io.safetensors"))
    n = sum(v.numel() for v in sd.values())
    print(f"{len(sd)} tensors, {n} parameters")


if __name__ == "__main__":
    main()
