#!/usr/bin/env python3
"""Tiny random Wan T2V DiT for the `turbodiff generate` end-to-end test.

fixtures/dit/t2v has text_dim 40, which does not match the tiny umT5 in
fixtures/umt5 (d_model 64); this one does (text_dim 64, in/out 16 channels =
the tiny VAE's z_dim), so prompt -> umT5 -> DiT -> VAE runs on tiny models.
Written in diffusers' layout (config.json + safetensors) by save_pretrained.
Only the pipeline's plumbing is tested with it; the DiT's numerics are checked
against diffusers by tests/cpu/test_wan_dit.cpp on fixtures/dit.
"""
import os
import shutil

import torch
from diffusers import WanTransformer3DModel


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "..", "fixtures", "generate", "dit")
    torch.manual_seed(20261130)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=16, out_channels=16,
        text_dim=64, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        eps=1e-6, rope_max_seq_len=1024).eval()
    # diffusers zero-initialises some projections; random weights everywhere make
    # the output depend on every input (prompt, latent, timestep).
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out, safe_serialization=True)
    print("wrote", out)


if __name__ == "__main__":
    main()
