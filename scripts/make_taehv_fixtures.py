#!/usr/bin/env python3
"""Fixtures for the TAEHV tiny decoder (tests/cpu/test_taehv.cpp).

TAEHV is not on PyPI nor in diffusers, so this script holds its own PyTorch
implementation of the architecture, written from reading the public source
github.com/madebyollin/taehv (taehv.py: class TAEHV, MemBlock, TPool, TGrow,
Clamp, apply_model_with_memblocks_parallel, decode_video; the Wan 2.1 setting
decoder_time_upscale = (False, True, True), i.e. TGrow strides 1, 2, 2, and
patch_tgrow_layers, which keeps the LAST rows of a TGrow weight trained with a
larger stride). Module structure and therefore state-dict names are those of
the published checkpoints (taew2_1.pth: "encoder.<i>...", "decoder.<i>...").
Only the widths are shrunk (the C++ loader reads them from the shapes):
decoder n_f = [12, 8, 8, 4] instead of [256, 128, 64, 64], encoder 8 instead of
64; latent_channels stays 16.

Writes fixtures/taehv/:
  taew2_1_tiny.pth          torch.save of the state dict (published layout, with
                            the encoder; decoder.7.conv.weight saved with 2x the
                            rows, as a stride-2-trained TGrow, to exercise the cut)
  taew2_1_tiny.safetensors  the same tensors
  decode_io.safetensors     latent [2, 16, 3, 4, 5] (~Gaussian, times 2 so the
                            Clamp matters) and video [2, 3, 9, 32, 40] =
                            2 * decode_video(latent) - 1 (fp64 model, clamp to
                            [0, 1] and the 3-frame trim included, rounded to f32);
                            latent1 [1, 16, 1, 3, 4] and video1 [1, 3, 1, 24, 32].
Decoding semantics (TAEHV's): NTCHW latents, MemBlock memory = the block's
input at the previous frame (zeros at the first), 4T frames of which the first
3 are dropped, output in [0, 1]; no latent mean/std.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "taehv")


def conv3(n_in, n_out, **kw):
    return nn.Conv2d(n_in, n_out, 3, padding=1, **kw)


class Clamp(nn.Module):
    def forward(self, x):
        return 3 * torch.tanh(x / 3)


class MemBlock(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        # conv.0, conv.2, conv.4 hold parameters (ReLUs at 1, 3)
        self.conv = nn.Sequential(conv3(2 * n_in, n_out), nn.ReLU(), conv3(n_out, n_out), nn.ReLU(),
                                  conv3(n_out, n_out))
        self.skip = nn.Identity() if n_in == n_out else nn.Conv2d(n_in, n_out, 1, bias=False)
        self.act = nn.ReLU()

    def forward(self, x, past):
        return self.act(self.conv(torch.cat([x, past], dim=1)) + self.skip(x))


class TPool(nn.Module):
    def __init__(self, n, stride):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n * stride, n, 1, bias=False)

    def forward(self, x):  # [N*T, C, H, W] -> [N*T/stride, C, H, W]
        nt, c, h, w = x.shape
        return self.conv(x.reshape(nt // self.stride, self.stride * c, h, w))


class TGrow(nn.Module):
    def __init__(self, n, stride):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n, n * stride, 1, bias=False)

    def forward(self, x):  # channel group k of frame t -> frame stride * t + k
        nt, c, h, w = x.shape
        return self.conv(x).reshape(nt * self.stride, c, h, w)


def build(latent=16, n_f=(12, 8, 8, 4), enc=8, time_strides=(1, 2, 2), enc_pool=(2, 2, 1)):
    encoder = nn.Sequential(
        conv3(3, enc), nn.ReLU(),
        TPool(enc, enc_pool[0]), conv3(enc, enc, stride=2, bias=False), MemBlock(enc, enc), MemBlock(enc, enc),
        MemBlock(enc, enc),
        TPool(enc, enc_pool[1]), conv3(enc, enc, stride=2, bias=False), MemBlock(enc, enc), MemBlock(enc, enc),
        MemBlock(enc, enc),
        TPool(enc, enc_pool[2]), conv3(enc, enc, stride=2, bias=False), MemBlock(enc, enc), MemBlock(enc, enc),
        MemBlock(enc, enc),
        conv3(enc, latent))
    layers = [Clamp(), conv3(latent, n_f[0]), nn.ReLU()]
    for s in range(3):
        layers += [MemBlock(n_f[s], n_f[s]), MemBlock(n_f[s], n_f[s]), MemBlock(n_f[s], n_f[s]),
                   nn.Upsample(scale_factor=2), TGrow(n_f[s], time_strides[s]), conv3(n_f[s], n_f[s + 1], bias=False)]
    layers += [nn.ReLU(), conv3(n_f[3], 3)]
    m = nn.Module()
    m.encoder = encoder
    m.decoder = nn.Sequential(*layers)
    return m


def run_decoder(decoder, x):
    """x: [N, T, C, H, W] -> [N, T', 3, H', W'] (every frame; no trim, no clamp), all frames at once."""
    n, t = x.shape[:2]
    x = x.reshape(n * t, *x.shape[2:])
    for b in decoder:
        if isinstance(b, MemBlock):
            nt, c, h, w = x.shape
            tt = nt // n
            xs = x.reshape(n, tt, c, h, w)
            past = torch.cat([torch.zeros_like(xs[:, :1]), xs[:, :-1]], dim=1).reshape(nt, c, h, w)
            x = b(x, past)
        else:
            x = b(x)
    return x.reshape(n, -1, *x.shape[1:])


def decode(model, latent_bcthw, trim=3):
    """Our convention: latent [B, 16, T, H, W] -> video [B, 3, 4T-3, 8H, 8W] in [-1, 1]."""
    frames = run_decoder(model.decoder, latent_bcthw.permute(0, 2, 1, 3, 4))
    frames = frames.clamp(0, 1)[:, trim:]
    return (frames * 2 - 1).permute(0, 2, 1, 3, 4)


def main():
    torch.manual_seed(8)
    os.makedirs(OUT, exist_ok=True)
    model = build().double()
    with torch.no_grad():
        # a spread of output values inside and outside [0, 1], so the clamp is exercised but not everything
        model.decoder[22].bias.fill_(0.5)
        for p in model.parameters():
            p.mul_(1.5)
        model.decoder[22].weight.mul_(3)
    sd = {k: v.float().contiguous() for k, v in model.state_dict().items()}
    # the stride-1 TGrow as published for Wan: trained with stride 2, loader keeps the last rows
    w7 = sd["decoder.7.conv.weight"]
    sd["decoder.7.conv.weight"] = torch.cat([torch.randn_like(w7), w7], dim=0).contiguous()
    torch.save(sd, os.path.join(OUT, "taew2_1_tiny.pth"))
    save_file(sd, os.path.join(OUT, "taew2_1_tiny.safetensors"))
    # the model as the loader sees it: float32 weights, run in fp64
    model.load_state_dict({k: (v[-w7.shape[0]:] if k == "decoder.7.conv.weight" else v).double()
                           for k, v in sd.items()})

    g = torch.Generator().manual_seed(88)
    latent = (torch.randn(2, 16, 3, 4, 5, generator=g) * 2).float()
    latent1 = torch.randn(1, 16, 1, 3, 4, generator=g).float()
    with torch.no_grad():
        video = decode(model, latent.double()).float()
        video1 = decode(model, latent1.double()).float()
    assert video.shape == (2, 3, 9, 32, 40), video.shape
    assert video1.shape == (1, 3, 1, 24, 32), video1.shape
    clamped = ((video <= -1) | (video >= 1)).float().mean().item()
    print(f"video: mean {video.mean():.3f} std {video.std():.3f}, clamped fraction {clamped:.3f}")
    save_file({"latent": latent.contiguous(), "video": video.contiguous(), "latent1": latent1.contiguous(),
               "video1": video1.contiguous()}, os.path.join(OUT, "decode_io.safetensors"))
    print("wrote", OUT)


if __name__ == "__main__":
    main()
