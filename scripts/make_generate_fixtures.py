#!/usr/bin/env python3
"""Tiny random models and reference outputs for `turbodiff generate`.

T2V (fixtures/generate/dit): a tiny Wan T2V DiT whose text_dim (64) matches
the tiny umT5 of fixtures/umt5 and whose in/out channels (16) match the tiny
VAE of fixtures/vae, so prompt -> umT5 -> DiT -> VAE runs on tiny models.
Only the pipeline's plumbing is tested with it; the DiT's numerics are checked
against diffusers by tests/cpu/test_wan_dit.cpp on fixtures/dit.

I2V (fixtures/generate/i2v/):
  high/, low/        two tiny Wan2.2-style experts (in_channels 36 = 16 noise +
                     4 mask + 16 image latent), diffusers layout
  image.png          a random 64x48 RGB image
  resize.safetensors PIL's BILINEAR resize (= torchvision's antialiased
                     Resize on uint8, which TurboDiffusion's I2V script runs)
                     of random images to smaller / larger / one-axis sizes
  condition.safetensors  diffusers' WanImageToVideoPipeline.prepare_latents
                     (expand_timesteps=False) on image.png for 9 frames:
                     `condition` = concat(mask, normalised VAE latent of
                     [image, 8 zero frames]) [1, 20, 3, 6, 8]
  euler.safetensors  frames of WanImageToVideoPipeline (transformer = high,
                     transformer_2 = low, boundary_ratio, Euler shift 3,
                     4 steps, guidance 3 with a negative prompt) from our
                     Philox noise (stream 0 of the seed) and our text
                     embeddings recipe (transformers' UMT5EncoderModel on
                     sentencepiece ids + </s>, zero-padded to 512)
  rcm.safetensors    frames of TurboDiffusion's wan2.2_i2v_infer.py loop
                     (rCM, sigma_max 200, 4 steps, switch to the low-noise
                     expert when t_cur < boundary, fresh Philox noise stream
                     1 + k at step k) written out in torch on the same models
  meta.json          prompts, seeds, boundaries, which expert ran each step
"""
import importlib.util
import json
import math
import os
import shutil

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tiny_dit(in_channels, seed):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=in_channels, out_channels=16,
        text_dim=64, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        eps=1e-6, rope_max_seq_len=1024).eval()
    # diffusers zero-initialises some projections; random weights everywhere make
    # the output depend on every input (prompt, latent, condition, timestep).
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
    return model


def t2v():
    out = os.path.join(FIX, "generate", "dit")
    model = tiny_dit(16, 20261130)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out, safe_serialization=True)
    print("wrote", out)


def text_embedding(prompt, sp, encoder, clean):
    ids = sp.encode(clean(prompt)) + [1]  # T5 appends </s>
    n = len(ids)
    input_ids = torch.zeros(1, 512, dtype=torch.long)
    mask = torch.zeros(1, 512, dtype=torch.long)
    input_ids[0, :n] = torch.tensor(ids)
    mask[0, :n] = 1
    with torch.no_grad():
        h = encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state.float()
    h[:, n:] = 0  # Wan's zero-pad rule
    return h


def frames_01(video):
    # [1, 3, F, H, W] in [-1, 1] -> [F, H, W, 3] in [0, 1] (diffusers' postprocess)
    return (video[0].permute(1, 2, 3, 0) / 2 + 0.5).clamp(0, 1).contiguous()


def i2v():
    import sentencepiece as spm
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline
    from transformers import UMT5EncoderModel

    umt5_mod = load_script("make_umt5_fixtures")
    sampler_mod = load_script("make_sampler_fixtures")
    out = os.path.join(FIX, "generate", "i2v")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    high = tiny_dit(36, 20261201)
    low = tiny_dit(36, 20261202)
    high.save_pretrained(os.path.join(out, "high"), safe_serialization=True)
    low.save_pretrained(os.path.join(out, "low"), safe_serialization=True)

    rng = np.random.default_rng(20261130)
    # The image: smooth-ish random colours, so the VAE sees structure.
    W, H, F = 64, 48, 9
    base = rng.integers(0, 256, size=(H // 4, W // 4, 3), dtype=np.uint8)
    img = Image.fromarray(base).resize((W, H), Image.BILINEAR)
    noise = rng.integers(-20, 21, size=(H, W, 3))
    img = Image.fromarray(np.clip(np.asarray(img).astype(int) + noise, 0, 255).astype(np.uint8))
    img.save(os.path.join(out, "image.png"))
    pixels = np.asarray(img)

    # Resize cases.
    resize = {}
    cases = [((37, 23), (16, 32)), ((50, 30), (64, 48)), ((101, 67), (48, 32)), ((20, 20), (20, 33)),
             ((33, 47), (31, 47))]
    for k, ((w, h), (tw, th)) in enumerate(cases):
        src = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        dst = np.asarray(Image.fromarray(src).resize((tw, th), Image.BILINEAR))
        resize[f"in_{k}"] = torch.from_numpy(src.copy())
        resize[f"out_{k}"] = torch.from_numpy(dst.copy())
    save_file(resize, os.path.join(out, "resize.safetensors"))

    vae = AutoencoderKLWan.from_pretrained(os.path.join(FIX, "vae")).eval()
    sp = spm.SentencePieceProcessor(model_file=os.path.join(FIX, "umt5", "tokenizer", "spiece.model"))
    encoder = UMT5EncoderModel.from_pretrained(os.path.join(FIX, "umt5", "hf")).eval()

    def pipeline(boundary_ratio):
        return WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae,
                                       scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), image_processor=None,
                                       image_encoder=None, transformer=high, transformer_2=low,
                                       boundary_ratio=boundary_ratio)

    # The condition, from the image tensor as the pipeline preprocesses it.
    pipe = pipeline(0.9)
    image_t = pipe.video_processor.preprocess(img, height=H, width=W).float()
    assert torch.allclose(image_t[0], torch.from_numpy(pixels).permute(2, 0, 1).float() / 255 * 2 - 1, atol=1e-6)
    T, h, w = (F - 1) // 4 + 1, H // 8, W // 8
    with torch.no_grad():
        _, condition = pipe.prepare_latents(image_t, 1, 16, H, W, F, torch.float32, "cpu", None,
                                            torch.zeros(1, 16, T, h, w))
    save_file({"image": image_t.contiguous(), "condition": condition.contiguous()},
              os.path.join(out, "condition.safetensors"))

    prompt, negative = "A cat sits on a red chair in the sun.", "blurry, static"
    ctx = text_embedding(prompt, sp, encoder, umt5_mod.clean)
    neg = text_embedding(negative, sp, encoder, umt5_mod.clean)
    shape = (1, 16, T, h, w)
    n = int(np.prod(shape))

    # Euler teacher through diffusers' pipeline.
    euler_seed, steps, guidance = 11, 4, 3.0
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    sched.set_timesteps(steps)
    ts = [float(t) for t in sched.timesteps]
    euler_boundary = round((ts[1] + ts[2]) / 2000.0, 4)  # two high steps, two low
    latents = torch.from_numpy(sampler_mod.philox_normals(n, euler_seed, 0)).view(shape)
    pipe = pipeline(euler_boundary)
    with torch.no_grad():
        frames = pipe(image=img, prompt=None, negative_prompt=None, prompt_embeds=ctx, negative_prompt_embeds=neg,
                      height=H, width=W, num_frames=F, num_inference_steps=steps, guidance_scale=guidance,
                      latents=latents, output_type="pt", return_dict=False)[0]
    # output_type="pt": [B, F, C, H, W] in [0, 1]
    euler_frames = frames[0].permute(0, 2, 3, 1).contiguous().float()
    save_file({"frames": euler_frames}, os.path.join(out, "euler.safetensors"))
    euler_experts = ["high" if t >= euler_boundary * 1000 else "low" for t in ts]

    # rCM as TurboDiffusion's I2V script samples, in torch.
    rcm_seed, sigma_max, rcm_boundary = 5, 200.0, 0.9
    angles = torch.tensor([math.atan(sigma_max), 1.5, 1.4, 1.0, 0.0], dtype=torch.float64)
    times = torch.sin(angles) / (torch.cos(angles) + torch.sin(angles))
    y = condition
    x = torch.from_numpy(sampler_mod.philox_normals(n, rcm_seed, 0)).view(shape).double() * times[0]
    rcm_experts = []
    with torch.no_grad():
        for i in range(4):
            t_cur, t_next = times[i], times[i + 1]
            net = high if t_cur.item() >= rcm_boundary else low
            rcm_experts.append("high" if net is high else "low")
            timestep = (t_cur.float() * torch.ones(1) * 1000).to(torch.bfloat16).float()
            v = net(hidden_states=torch.cat([x.float(), y], dim=1), timestep=timestep, encoder_hidden_states=ctx,
                    return_dict=False)[0].double()
            if t_next.item() > 0:
                eps = torch.from_numpy(sampler_mod.philox_normals(n, rcm_seed, 1 + i)).view(shape).double()
                x = (1 - t_next) * (x - t_cur * v) + t_next * eps
            else:
                x = x - t_cur * v
        mean = torch.tensor(vae.config.latents_mean).view(1, 16, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1)
        video = vae.decode(x.float() * std + mean, return_dict=False)[0]
    save_file({"frames": frames_01(video)}, os.path.join(out, "rcm.safetensors"))

    meta = {"width": W, "height": H, "frames": F, "prompt": prompt, "negative_prompt": negative,
            "euler": {"seed": euler_seed, "steps": steps, "shift": 3.0, "guidance": guidance,
                      "boundary": euler_boundary, "timesteps": ts, "experts": euler_experts},
            "rcm": {"seed": rcm_seed, "sigma_max": sigma_max, "steps": 4, "boundary": rcm_boundary,
                    "times": [float(t) for t in times], "experts": rcm_experts}}
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("wrote", out, json.dumps(meta))


def main():
    t2v()
    i2v()


if __name__ == "__main__":
    main()
