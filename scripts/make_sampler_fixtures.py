#!/usr/bin/env python3
"""Fixtures for tests/cpu/test_sampling.cpp -> fixtures/sampling/.

Drives diffusers' own schedulers (UniPCMultistepScheduler configured as Wan's
diffusers pipeline does, FlowMatchEulerDiscreteScheduler) and an rCM sampler
loop written here from the reference's description with a closed-form
synthetic velocity the C++ test reproduces:

    v(x, ts) = a * x + (b + c * ts / 1000) * u + w          (u, w fixed tensors)

rCM loop: written from shared/reference/turbodiffusion.md §3 ("rCM few-step
sampler") and shared/reference/wan21-and-rcm.md §6 ("Timesteps", "Update
rule"): TrigFlow angles [atan(sigma_max), 1.5, 1.4, 1.0][:N] + [0], t =
sin/(cos+sin), x = t0 * eps0 in float64, v = net(x, bf16(1000 t)), x0 = x - t v,
x = (1 - t_next) x0 + t_next eps_new (float32 noise upcast), or the --ode
update x -= (t_cur - t_next) v. The noise is this project's Philox4x32-10 +
Box-Muller stream layout (src/sampling/noise.h), implemented again here in
numpy so the C++ generator is checked against an independent implementation.

Usage: python3 scripts/make_sampler_fixtures.py  (writes fixtures/sampling/*.safetensors)
"""
import math
import os

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "sampling")
SHAPE = (1, 2, 3, 4, 5)  # a tiny latent [B, C, T, H, W], awkward sizes
M32 = np.uint64(0xFFFFFFFF)


# ---- Philox4x32-10 (Salmon et al. 2011), numpy uint64 arithmetic -------------
def philox4x32_10(ctr, key):
    c = [np.uint64(v) for v in ctr]
    k = [np.uint64(v) for v in key]
    for rnd in range(10):
        if rnd > 0:
            k = [(k[0] + np.uint64(0x9E3779B9)) & M32, (k[1] + np.uint64(0xBB67AE85)) & M32]
        p0 = np.uint64(0xD2511F53) * c[0]
        p1 = np.uint64(0xCD9E8D57) * c[2]
        hi0, lo0 = p0 >> np.uint64(32), p0 & M32
        hi1, lo1 = p1 >> np.uint64(32), p1 & M32
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0]
    return [int(v) for v in c]


# Random123 tests/kat_vectors, "philox4x32 10" lines.
assert philox4x32_10([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
assert philox4x32_10([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
assert philox4x32_10([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]) == [
    0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def philox_normals(n, seed, stream):
    """Normal j = lane j%4 of block j//4; Box-Muller on (c0,c1) and (c2,c3); float32."""
    out = np.empty(n, dtype=np.float32)
    for b in range((n + 3) // 4):
        c = philox4x32_10([b & 0xFFFFFFFF, b >> 32, stream & 0xFFFFFFFF, stream >> 32],
                          [seed & 0xFFFFFFFF, seed >> 32])
        vals = []
        for pair in range(2):
            u1 = (c[2 * pair] + 0.5) * 2.0**-32
            u2 = (c[2 * pair + 1] + 0.5) * 2.0**-32
            r = math.sqrt(-2.0 * math.log(u1))
            th = 2.0 * math.pi * u2
            vals += [r * math.cos(th), r * math.sin(th)]
        for lane in range(4):
            if 4 * b + lane < n:
                out[4 * b + lane] = np.float32(vals[lane])
    return out


# ---- synthetic velocity ------------------------------------------------------
def make_field(gen, a, b, c):
    u = torch.randn(SHAPE, generator=gen, dtype=torch.float64)
    w = 0.5 * torch.randn(SHAPE, generator=gen, dtype=torch.float64)
    return {"abc": torch.tensor([a, b, c], dtype=torch.float64), "u": u, "w": w}


def velocity(field, x, ts):
    a, b, c = field["abc"].tolist()
    return a * x + (b + c * float(ts) / 1000.0) * field["u"] + field["w"]


def wan_unipc_scheduler(shift):
    # The scheduler_config.json of Wan-AI/Wan2.1-T2V-*-Diffusers, with the
    # flow_shift the diffusers Wan example passes (5.0 at 720p, 3.0 at 480p).
    return UniPCMultistepScheduler(
        num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction", thresholding=False,
        predict_x0=True, solver_type="bh2", lower_order_final=True, disable_corrector=[], use_karras_sigmas=False,
        use_flow_sigmas=True, flow_shift=shift, timestep_spacing="linspace", steps_offset=0,
        final_sigmas_type="zero")


def run_teacher(name, sched, steps, guidance, fields, gen, upcast_sigmas=False):
    sched.set_timesteps(steps)
    if upcast_sigmas:
        # Same sigma values, but the solver's scalar math in float64 instead of
        # float32: isolates the formulas from float32 coefficient rounding.
        sched.sigmas = sched.sigmas.to(torch.float64)
    x0 = torch.randn(SHAPE, generator=gen, dtype=torch.float64)
    x = x0.clone()
    traj = []
    for t in sched.timesteps:
        vc = velocity(fields["cond"], x, t.item())
        if guidance != 1.0:
            vu = velocity(fields["uncond"], x, t.item())
            v = vu + guidance * (vc - vu)
        else:
            v = vc
        x = sched.step(v, t, x, return_dict=False)[0].to(torch.float64)
        traj.append(x.clone())
    t = {
        "noise": x0,
        "timesteps": sched.timesteps.to(torch.float64).contiguous(),
        "sigmas": sched.sigmas.to(torch.float64).contiguous(),
        "trajectory": torch.stack(traj).contiguous(),
        "guidance": torch.tensor([guidance], dtype=torch.float64),
    }
    for k in ("cond", "uncond"):
        for kk, vv in fields[k].items():
            t[f"{k}.{kk}"] = vv.contiguous()
    save_file(t, os.path.join(OUT, name + ".safetensors"))
    print(name, "steps", steps, "timesteps[:5]", sched.timesteps[:5].tolist(), "final |x|", x.norm().item())


def rcm_reference(steps, sigma_max, seed, field, ode):
    mid_t = [1.5, 1.4, 1.0]
    angles = torch.tensor([math.atan(sigma_max), *mid_t[: steps - 1]], dtype=torch.float64)
    t_steps = torch.sin(angles) / (torch.cos(angles) + torch.sin(angles))
    t_steps = torch.cat([t_steps, torch.zeros(1, dtype=torch.float64)])
    n = int(np.prod(SHAPE))
    eps0 = torch.from_numpy(philox_normals(n, seed, 0)).reshape(SHAPE)
    x = eps0.to(torch.float64) * t_steps[0]
    seen = []
    for i, (t_cur, t_next) in enumerate(zip(t_steps[:-1], t_steps[1:])):
        ts = (t_cur.float() * 1000).to(torch.bfloat16).item()  # the bf16 timestep the network sees
        seen.append(ts)
        v = velocity(field, x, ts)
        if ode:
            x = x - (t_cur - t_next) * v
        else:
            x0 = x - t_cur * v
            eps = torch.from_numpy(philox_normals(n, seed, i + 1)).reshape(SHAPE).to(torch.float64)
            x = (1 - t_next) * x0 + t_next * eps
    return {
        "times": t_steps.contiguous(),
        "timesteps": torch.tensor(seen, dtype=torch.float64),
        "eps0": eps0.contiguous(),
        "result": x.contiguous(),
        "params": torch.tensor([steps, sigma_max, seed, 1.0 if ode else 0.0], dtype=torch.float64),
    }


def main():
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(20261130)
    fields = {"cond": make_field(gen, -0.35, 0.8, -0.6), "uncond": make_field(gen, -0.2, 0.3, 0.4)}

    # UniPC as Wan's diffusers pipeline runs it.
    run_teacher("unipc_s50_shift5_g5", wan_unipc_scheduler(5.0), 50, 5.0, fields, gen)
    run_teacher("unipc_s50_shift5_g5_f64", wan_unipc_scheduler(5.0), 50, 5.0, fields, gen, upcast_sigmas=True)
    run_teacher("unipc_s7_shift3_g1", wan_unipc_scheduler(3.0), 7, 1.0, fields, gen)
    run_teacher("unipc_s2_shift3_g4", wan_unipc_scheduler(3.0), 2, 4.0, fields, gen)
    # Euler flow matching.
    run_teacher("euler_s50_shift5_g5", FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=5.0), 50,
                5.0, fields, gen)
    run_teacher("euler_s9_shift3_g1", FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0), 9, 1.0,
                fields, gen)

    # rCM: 1-4 steps, sigma_max 80 (T2V default), 200 (I2V default) with --ode.
    tensors = {f"field.{k}": v.contiguous() for k, v in fields["cond"].items()}
    for steps in (1, 2, 3, 4):
        for k, v in rcm_reference(steps, 80.0, 42 + steps, fields["cond"], ode=False).items():
            tensors[f"s{steps}.{k}"] = v
    for k, v in rcm_reference(4, 200.0, 7, fields["cond"], ode=True).items():
        tensors[f"ode.{k}"] = v
    save_file(tensors, os.path.join(OUT, "rcm.safetensors"))
    print("rcm timesteps (4 steps, sigma_max 80):", tensors["s4.timesteps"].tolist())
    # A large seed and stream: all 64 bits of both reach the generator.
    big = philox_normals(10, 0x123456789ABCDEF0, 0xFEDCBA9876543210 & ((1 << 64) - 1))
    save_file({"normals": torch.from_numpy(big).contiguous()}, os.path.join(OUT, "philox_big_seed.safetensors"))


if __name__ == "__main__":
    main()
