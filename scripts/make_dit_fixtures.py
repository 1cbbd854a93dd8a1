#!/usr/bin/env python3
"""Writes the Wan DiT fixtures into fixtures/dit/ with diffusers'
WanTransformer3DModel as the peer implementation.

Two tiny random models with odd sizes, each in every checkpoint layout turbodiff
loads (shared/reference/wan21-and-rcm.md §1.6, turbodiffusion.md §4):

  t2v/  2 layers, dim 96 = 2 heads x 48 (head_dim 48: RoPE split 16/16/16),
        ffn 160, text_dim 40, freq_dim 32, 16 -> 16 channels
    config.json                 the diffusers config (custom sizes need it: heads
                                cannot be inferred from shapes); it also applies to
                                the original-layout files beside it
    diffusers/                  save_pretrained, bf16, sharded: 2 shards + index + config.json
    wan_original.safetensors    original Wan names, bf16, patch_embedding Conv3d [D,16,1,2,2]
    turbo.pth                   rCM/TurboDiffusion layout: "net."-prefixed original names, bf16,
                                patch_embedding Linear [D,64], per-block SLA
                                self_attn.attn_op.local_attn.proj_l.{weight,bias} fp32 zeros
    turbo_quant.pth             TurboDiffusion -quant export: every Linear inside blocks as
                                int8_weight int8 [N,K] + scale fp32 [ceil(N/128), ceil(K/128)]
                                + bias (bf16); norm_q/norm_k/norm3 as fp32 FastNorm buffers;
                                proj_l kept; no prefix
    inputs.safetensors          latent [2,16,3,6,10], timestep [2], context [2,12,40] (fp32)
    expected.safetensors        velocity [2,16,3,6,10]: the diffusers forward (fp32, eval, no grad);
                                velocity_int8: the same forward with every block Linear weight
                                replaced by its dequantized INT8 value (q * scale), which is what
                                turbo_quant.pth holds
  i2v/  Wan2.2-I2V-A14B style (36 input channels, no CLIP image branch): 2 layers,
        dim 48 = 2 heads x 24 (RoPE split 8/8/8), ffn 136, text_dim 24, freq_dim 16
    config.json, diffusers/ (fp32, one file), wan_original.pth (torch.save of original names,
    bf16, Conv3d patch embedding), inputs.safetensors (latent [1,36,2,4,6]),
    expected.safetensors (velocity [1,16,2,4,6])

Numerics the fixtures pin down:
  * Every weight is rounded to a bf16-representable value before anything is
    saved, so the bf16 files hold exactly the fp32 model the reference ran (and
    the files stay small).
  * The timestep sinusoid is computed in float64 as the original Wan does
    (sinusoidal_embedding_1d); stock diffusers computes it in float32, which at
    t ~ 1000 is off by ~1e-4 and would swamp a 1e-5 comparison. The script
    prints how far the stock forward is from the one it stores.
  * Modulation tables, norm weights and biases are all non-trivial (no zero
    scale_shift_table, no unit norm weights), the context has zero-padded rows
    as the pipelines pass it (the model itself does not mask), the latent is
    not square, and the batch has a different timestep per sample.

Run from anywhere: python3 scripts/make_dit_fixtures.py [--out DIR]. Needs
torch, safetensors and diffusers (pip install torch safetensors diffusers);
written against diffusers 0.42. Values are seeded.
"""

import argparse
import collections
import json
import math
import os
import shutil

import torch
from safetensors.torch import save_file

from diffusers import WanTransformer3DModel

CONFIGS = {
    "t2v": dict(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=48, in_channels=16, out_channels=16,
        text_dim=40, freq_dim=32, ffn_dim=160, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=1024),
    "i2v": dict(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=24, in_channels=36, out_channels=16,
        text_dim=24, freq_dim=16, ffn_dim=136, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=1024),
}

# (batch, frames, height, width, context rows, real context rows per sample)
INPUTS = {
    "t2v": dict(batch=2, frames=3, height=6, width=10, ctx_len=12, ctx_real=[9, 12]),
    "i2v": dict(batch=1, frames=2, height=4, width=6, ctx_len=7, ctx_real=[5]),
}

# diffusers name fragment -> original Wan name fragment (scripts/convert_wan_to_diffusers.py,
# read backwards). Applied to whole dotted components, longest first.
TOP_LEVEL_RENAMES = [
    ("condition_embedder.time_embedder.linear_1.", "time_embedding.0."),
    ("condition_embedder.time_embedder.linear_2.", "time_embedding.2."),
    ("condition_embedder.time_proj.", "time_projection.1."),
    ("condition_embedder.text_embedder.linear_1.", "text_embedding.0."),
    ("condition_embedder.text_embedder.linear_2.", "text_embedding.2."),
    ("proj_out.", "head.head."),
    ("patch_embedding.", "patch_embedding."),
]
BLOCK_RENAMES = [
    ("attn1.to_q.", "self_attn.q."), ("attn1.to_k.", "self_attn.k."), ("attn1.to_v.", "self_attn.v."),
    ("attn1.to_out.0.", "self_attn.o."), ("attn1.norm_q.", "self_attn.norm_q."),
    ("attn1.norm_k.", "self_attn.norm_k."),
    ("attn2.to_q.", "cross_attn.q."), ("attn2.to_k.", "cross_attn.k."), ("attn2.to_v.", "cross_attn.v."),
    ("attn2.to_out.0.", "cross_attn.o."), ("attn2.norm_q.", "cross_attn.norm_q."),
    ("attn2.norm_k.", "cross_attn.norm_k."),
    ("ffn.net.0.proj.", "ffn.0."), ("ffn.net.2.", "ffn.2."),
    ("norm2.", "norm3."),  # the cross-attention affine LayerNorm: norm2 in diffusers, norm3 in Wan
]


def to_original_name(name):
    if name == "scale_shift_table":
        return "head.modulation"
    for src, dst in TOP_LEVEL_RENAMES:
        if name.startswith(src):
            return dst + name[len(src):]
    if name.startswith("blocks."):
        _, idx, rest = name.split(".", 2)
        if rest == "scale_shift_table":
            return f"blocks.{idx}.modulation"
        for src, dst in BLOCK_RENAMES:
            if rest.startswith(src):
                return f"blocks.{idx}.{dst}{rest[len(src):]}"
    raise KeyError(f"no original Wan name for diffusers tensor {name}")


def original_state_dict(model):
    out = collections.OrderedDict()
    for name, t in model.state_dict().items():
        out[to_original_name(name)] = t.detach().clone()
    return out


def randomize(model, gen):
    """Non-trivial values everywhere, every one bf16-representable."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm_q.weight") or name.endswith("norm_k.weight") or name.endswith("norm2.weight"):
                v = 1.0 + 0.25 * torch.randn(p.shape, generator=gen)
            elif name.endswith("scale_shift_table"):
                v = 0.3 * torch.randn(p.shape, generator=gen)
            elif name.endswith(".bias"):
                v = 0.1 * torch.randn(p.shape, generator=gen)
            else:
                fan_in = p[0].numel() if p.dim() > 1 else p.numel()
                v = torch.randn(p.shape, generator=gen) / math.sqrt(fan_in)
            p.copy_(v.to(torch.bfloat16).float())


def sinusoid_f64(timesteps, dim):
    """Wan's sinusoidal_embedding_1d: [cos, sin] of t * 10000^(-i/half), in float64."""
    half = dim // 2
    t = timesteps.to(torch.float64)
    freqs = torch.pow(torch.tensor(10000.0, dtype=torch.float64), -torch.arange(half, dtype=torch.float64) / half)
    angles = torch.outer(t, freqs)
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)


class Float64Timesteps(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, timesteps):
        return sinusoid_f64(timesteps, self.dim).float()


def make_inputs(cfg, spec, gen):
    b = spec["batch"]
    latent = torch.randn(b, cfg["in_channels"], spec["frames"], spec["height"], spec["width"], generator=gen)
    timestep = torch.rand(b, generator=gen, dtype=torch.float64) * 1000.0
    timestep = timestep.float()
    context = torch.randn(b, spec["ctx_len"], cfg["text_dim"], generator=gen)
    for i, real in enumerate(spec["ctx_real"]):
        context[i, real:] = 0.0  # the pipelines zero-pad the text encoder output; the model does not mask
    return latent, timestep, context


@torch.no_grad()
def forward(model, latent, timestep, context):
    return model(hidden_states=latent, timestep=timestep, encoder_hidden_states=context, return_dict=False)[0]


def quantize_block128(w):
    """TurboDiffusion's weight format: one fp32 scale per 128x128 block,
    scale = max(amax, 1e-8) / 128, q = round-half-even(w * 128 / amax) clamped
    to [-128, 127]; w ~= q * scale."""
    w = w.float()
    n, k = w.shape
    nb, kb = -(-n // 128), -(-k // 128)
    q = torch.empty((n, k), dtype=torch.int8)
    scale = torch.empty((nb, kb), dtype=torch.float32)
    for i in range(nb):
        for j in range(kb):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            amax = torch.clamp(blk.abs().max(), min=1e-8)
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = torch.clamp(
                torch.round(blk * (torch.tensor(128.0) / amax)), -128, 127).to(torch.int8)
            scale[i, j] = amax / 128.0
    return q, scale


def dequantize_block128(q, scale):
    n, k = q.shape
    s = scale.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    return q.float() * s


def is_block_linear_weight(name, t):
    return name.startswith("blocks.") and name.endswith(".weight") and t.dim() == 2 and "proj_l" not in name


def write_config(model, path):
    cfg = dict(model.config)
    cfg = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items() if not k.startswith("_")}
    cfg["_class_name"] = "WanTransformer3DModel"
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def build(kind, out_dir, seed):
    cfg, spec = CONFIGS[kind], INPUTS[kind]
    gen = torch.Generator().manual_seed(seed)
    model = WanTransformer3DModel(**cfg).eval()
    randomize(model, gen)
    latent, timestep, context = make_inputs(cfg, spec, gen)

    stock = forward(model, latent, timestep, context)
    model.condition_embedder.timesteps_proj = Float64Timesteps(cfg["freq_dim"])
    velocity = forward(model, latent, timestep, context)
    rel = ((stock - velocity).norm() / velocity.norm()).item()
    print(f"{kind}: stock diffusers (fp32 sinusoid) vs fp64 sinusoid: relative L2 {rel:.2e}")

    d = os.path.join(out_dir, kind)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    write_config(model, os.path.join(d, "config.json"))
    save_file({"latent": latent.contiguous(), "timestep": timestep.contiguous(), "context": context.contiguous()},
              os.path.join(d, "inputs.safetensors"))
    expected = {"velocity": velocity.contiguous()}

    sd = original_state_dict(model)
    if kind == "t2v":
        # diffusers layout, bf16, sharded (save_pretrained writes config.json + index + shards)
        model.to(torch.bfloat16).save_pretrained(os.path.join(d, "diffusers"), safe_serialization=True,
                                                 max_shard_size="300KB")
        model.float()
        shards = [f for f in os.listdir(os.path.join(d, "diffusers")) if f.endswith(".safetensors")]
        assert len(shards) >= 2, f"expected a sharded save, got {shards}"

        save_file({k: v.to(torch.bfloat16).contiguous() for k, v in sd.items()},
                  os.path.join(d, "wan_original.safetensors"))

        # rCM / TurboDiffusion: net. prefix, Linear patch embedding, SLA proj_l (zero-initialised) per block
        turbo = collections.OrderedDict()
        head_dim = cfg["attention_head_dim"]
        for name, t in sd.items():
            if name == "patch_embedding.weight":
                t = t.reshape(t.shape[0], -1)
            turbo["net." + name] = t.to(torch.bfloat16).contiguous()
            if name.endswith("self_attn.norm_k.weight"):
                block = name[: -len("self_attn.norm_k.weight")]
                turbo["net." + block + "self_attn.attn_op.local_attn.proj_l.weight"] = torch.zeros(head_dim, head_dim)
                turbo["net." + block + "self_attn.attn_op.local_attn.proj_l.bias"] = torch.zeros(head_dim)
        torch.save(turbo, os.path.join(d, "turbo.pth"))

        # TurboDiffusion -quant export of the same network, and the forward its weights give
        quant = collections.OrderedDict()
        dequant = {}
        for name, t in turbo.items():
            plain = name[len("net."):]
            if is_block_linear_weight(plain, t):
                q, s = quantize_block128(t)
                base = plain[: -len(".weight")]
                quant[base + ".int8_weight"] = q
                quant[base + ".scale"] = s
                dequant[plain] = dequantize_block128(q, s)
            elif plain.startswith("blocks.") and (".norm_q." in plain or ".norm_k." in plain or ".norm3." in plain):
                quant[plain] = t.float()
            else:
                quant[plain] = t
        torch.save(quant, os.path.join(d, "turbo_quant.pth"))
        qmodel = WanTransformer3DModel(**cfg).eval()
        qsd = {k: v.clone() for k, v in model.state_dict().items()}
        back = {to_original_name(k): k for k in qsd}
        for orig, w in dequant.items():
            qsd[back[orig]] = w
        qmodel.load_state_dict(qsd)
        qmodel.condition_embedder.timesteps_proj = Float64Timesteps(cfg["freq_dim"])
        expected["velocity_int8"] = forward(qmodel, latent, timestep, context).contiguous()
    else:
        model.save_pretrained(os.path.join(d, "diffusers"), safe_serialization=True)
        torch.save(collections.OrderedDict((k, v.to(torch.bfloat16)) for k, v in sd.items()),
                   os.path.join(d, "wan_original.pth"))

    save_file(expected, os.path.join(d, "expected.safetensors"))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(here, "..", "fixtures", "dit"))
    args = ap.parse_args()
    torch.manual_seed(0)
    os.makedirs(args.out, exist_ok=True)
    build("t2v", args.out, seed=1234)
    build("i2v", args.out, seed=5678)
    total = 0
    for root, _, files in os.walk(args.out):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    print(f"wrote {args.out}: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
