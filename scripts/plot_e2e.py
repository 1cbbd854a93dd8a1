#!/usr/bin/env python3
"""Plots for docs/benchmarks.md (issue 9) from the JSON that scripts/e2e_gpu.sh
writes (and, when present, bench_sla's JSON):

  e2e_stages.png     the cumulative stage table: diffusion time per stage for
                     each model (log scale), with the speed-up over stage a and
                     PyTorch's (diffusers BF16 SDPA) 50-step CFG teacher
                     estimated from its measured forward, side by side
  sla_topk.png       attention time against topk (bench_sla), one panel per
                     shape, cuDNN dense as the reference line

    python3 scripts/plot_e2e.py DIR [--sla bench_sla.json] [--out docs/img]

DIR holds e2e_1.3B.json, e2e_14B_cd.json, e2e_14B_a.json, torch_e2e_1.3B.json,
torch_e2e_14B.json (any may be missing). --sla takes bench_sla's JSON, alone or
inside scripts/gpu_check.sh's results.json (key "bench_sla").
"""
import argparse
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception:
        return None


def stages_of(dir_, model):
    files = ["e2e_1.3B.json"] if model == "1.3B" else ["e2e_14B_a.json", "e2e_14B_cd.json", "e2e_14B.json"]
    stages = {}
    for f in files:
        d = load(os.path.join(dir_, f))
        for s in (d or {}).get("stages", []):
            if s.get("ran"):
                stages[s["stage"]] = s
    return stages


def plot_stages(dir_, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in ("1.3B", "14B") if stages_of(dir_, m)]
    if not models:
        print("plot_e2e: no e2e JSON in", dir_, file=sys.stderr)
        return None
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        st = stages_of(dir_, model)
        labels, values, colors = [], [], []
        torch = load(os.path.join(dir_, f"torch_e2e_{model}.json"))
        teacher_forwards = st["a"]["forwards"] if "a" in st else 100
        if torch and "forward_ms" in torch:
            labels.append(f"PyTorch\n(diffusers BF16,\n{teacher_forwards} fwd)")
            values.append(torch["forward_ms"] * teacher_forwards / 1000.0)
            colors.append("#999999")
        for sid in "abcd":
            if sid in st:
                s = st[sid]
                attn = s["attention"].replace(" topk ", "\ntopk ")
                labels.append(f"{sid}: {s['label']}".replace(", ", ",\n", 2) + ("" if sid != "d" else f"\n[{attn}]"))
                values.append(s["diffusion_s"])
                colors.append(["#c44e52", "#dd8452", "#55a868", "#4c72b0"]["abcd".index(sid)])
        bars = ax.bar(range(len(values)), values, color=colors)
        ax.set_yscale("log")
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("diffusion time, s (log)")
        base = st["a"]["diffusion_s"] if "a" in st else None
        for b, v in zip(bars, values):
            txt = f"{v:.2f} s" if v < 100 else f"{v:.0f} s"
            if base:
                txt += f"\n{base / v:.1f}x"
            ax.annotate(txt, (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
        ax.set_title(f"Wan2.1-{model}: {json_res(dir_, model)}", fontsize=9)
    gpu = next((load(os.path.join(dir_, f)) or {}).get("gpu", {}).get("name") for f in
               ("e2e_1.3B.json", "e2e_14B_cd.json", "e2e_14B_a.json"))
    fig.suptitle(f"turbodiff bench e2e: cumulative stages ({gpu or 'GPU ?'}); diffusion = forwards x median forward",
                 fontsize=10)
    fig.tight_layout()
    path = os.path.join(out, "e2e_stages.png")
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def json_res(dir_, model):
    for f in (["e2e_1.3B.json"] if model == "1.3B" else ["e2e_14B_cd.json", "e2e_14B_a.json"]):
        d = load(os.path.join(dir_, f))
        if d:
            return f"{d['frames']} frames {d['height']}x{d['width']}, L = {d['tokens']}"
    return ""


def plot_sla(sla_path, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = load(sla_path)
    if d is None:
        print("plot_e2e: cannot read", sla_path, file=sys.stderr)
        return None
    if "bench_sla" in d:
        d = d["bench_sla"]
    res = d.get("results", [])
    shapes = sorted({r["shape"] for r in res})
    if not shapes:
        print("plot_e2e: no bench_sla results in", sla_path, file=sys.stderr)
        return None
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.2), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        rows = sorted((r for r in res if r["shape"] == shape), key=lambda r: r["topk"])
        keys = sorted({k for r in rows for k in r if k.endswith("_ms") and k != "cudnn_ms"})
        for k in keys:
            pts = [(r["topk"], r[k]) for r in rows if k in r]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=k[:-3])
        cud = next((r["cudnn_ms"] for r in rows if "cudnn_ms" in r), None)
        if cud:
            ax.axhline(cud, color="k", ls="--", lw=1, label=f"cuDNN dense {cud:.1f} ms")
        ax.set_xlabel("topk (fraction of key blocks kept)")
        ax.set_ylabel("attention time, ms")
        r0 = rows[0]
        ax.set_title(f"{shape}: B {r0.get('batch')}, {r0.get('heads')} heads, L {r0.get('len')}, d {r0.get('head_dim')}",
                     fontsize=9)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.suptitle(f"attention time vs topk ({d.get('device', {}).get('name', 'GPU ?')})", fontsize=10)
    fig.tight_layout()
    path = os.path.join(out, "sla_topk.png")
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="folder with the e2e JSON files")
    ap.add_argument("--sla", default=None, help="bench_sla JSON (or gpu_check's results.json)")
    ap.add_argument("--out", default="docs/img")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    made = [p for p in (plot_stages(args.dir, args.out), plot_sla(args.sla, args.out) if args.sla else None) if p]
    for p in made:
        print("wrote", p)
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(main())
