#!/usr/bin/env python3
"""Random-weight models at the published sizes, in the layouts a user downloads,
for `turbodiff generate` at real size on a GPU machine without checkpoints
(issue 8: end-to-end generate at Wan-1.3B 480p size with random weights).

    python3 bench/make_random_models.py --out /tmp/rand [--model 1.3B|14B] [--device cuda]

Writes, from diffusers' / transformers' own classes (their initialisers, BF16):
  OUT/dit/{config.json, diffusion_pytorch_model.safetensors}   WanTransformer3DModel (T2V)
  OUT/vae/{config.json, diffusion_pytorch_model.safetensors}   AutoencoderKLWan (the Wan2.1 VAE config)
  OUT/umt5/{config.json, model.safetensors}                    UMT5EncoderModel, umT5-XXL (24 layers, d_model 4096)
  OUT/tokenizer/spiece.model                                   the small SentencePiece model of fixtures/umt5
    (the real one is not on this machine; ids only index the random embedding)
Models are built on --device (fast random init) and saved as single files.
"""
import argparse
import os
import shutil
import time

import torch

DIT = {
    "1.3B": dict(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960, num_layers=30),
    "14B": dict(num_attention_heads=40, attention_head_dim=128, ffn_dim=13824, num_layers=40),
}
COMMON = dict(patch_size=(1, 2, 2), in_channels=16, out_channels=16, text_dim=4096, freq_dim=256,
              cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", choices=sorted(DIT), default="1.3B")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--skip", default="", help="comma list of parts not to write: dit,vae,umt5")
    ap.add_argument("--umt5-layers", type=int, default=24, help="fewer only to check this script on a small machine")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    here = os.path.dirname(os.path.abspath(__file__))
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    with torch.device(args.device):
        if "dit" not in skip:
            m = WanTransformer3DModel(**COMMON, **DIT[args.model]).to(torch.bfloat16)
            m.save_pretrained(os.path.join(args.out, "dit"), safe_serialization=True, max_shard_size="200GB")
            del m
        if "vae" not in skip:
            m = AutoencoderKLWan().to(torch.bfloat16)  # defaults = the Wan2.1 VAE
            m.save_pretrained(os.path.join(args.out, "vae"), safe_serialization=True, max_shard_size="200GB")
            del m
        if "umt5" not in skip:
            cfg = UMT5Config(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=args.umt5_layers, num_heads=64,
                             relative_attention_num_buckets=32, relative_attention_max_distance=128,
                             feed_forward_proj="gated-gelu", dense_act_fn="gelu_new", is_encoder_decoder=False,
                             tie_word_embeddings=False)
            m = UMT5EncoderModel(cfg).to(torch.bfloat16)
            m.save_pretrained(os.path.join(args.out, "umt5"), safe_serialization=True, max_shard_size="200GB")
            del m
    tok = os.path.join(args.out, "tokenizer")
    os.makedirs(tok, exist_ok=True)
    shutil.copy(os.path.join(here, "..", "fixtures", "umt5", "tokenizer", "spiece.model"), tok)
    sizes = {d: sum(os.path.getsize(os.path.join(args.out, d, f)) for f in os.listdir(os.path.join(args.out, d)))
             for d in os.listdir(args.out)}
    print({"written_s": round(time.time() - t0, 1), "bytes": sizes})


if __name__ == "__main__":
    main()
