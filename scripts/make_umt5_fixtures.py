#!/usr/bin/env python3
"""Fixtures for the umT5 text encoder and its tokenizer (tests/cpu/test_umt5.cpp).

Writes fixtures/umt5/:
  tokenizer/spiece.model   a tiny SentencePiece unigram model trained here on a
                           small English text (T5 ids: pad 0, eos 1, unk 2)
  hf/config.json, hf/model.safetensors
                           a tiny random transformers UMT5EncoderModel (HF names)
  wan_umt5.pth             the same weights under Wan's names (wan/modules/t5.py),
                           fp32, as torch.save writes them
  expected.safetensors     prompt ids, masks, encoder outputs (fp32) and the HF
                           relative-position bucket table
  prompts.json             the raw prompts, their cleaned text and token ids

Run: python3 scripts/make_umt5_fixtures.py  (torch, transformers, sentencepiece,
safetensors). Deterministic for a fixed seed.
"""
import html
import io
import json
import os
import re

import sentencepiece as spm
import torch
from safetensors.torch import save_file
from transformers import UMT5Config, UMT5EncoderModel

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "umt5")
MAX_LEN = 512

CORPUS = """A cat sits on a red chair in the sun.
The dog runs across the green field, chasing a yellow ball.
A video of waves breaking on a rocky shore at sunset.
Two astronauts float inside a space station, looking at the Earth.
A slow camera pan over a snowy mountain village at night.
The little robot walks through a busy market full of fruit and flowers.
A woman in a blue coat rides a bicycle along the river.
Rain falls on the city streets while cars drive past the shops.
A close-up of a hummingbird drinking from a pink flower.
The old train crosses a stone bridge above the valley.
Children play football in the park after school.
A chef cuts vegetables in a bright kitchen & smiles at the camera.
Fireworks light up the sky over the harbour on new year's eve.
An eagle flies high above the desert canyon.
The painter mixes colours on a wooden palette, then paints a tree.
Fish swim between the corals of a clear blue reef.
""" * 3


def clean(text):
    # Wan's clean='whitespace' path without ftfy (not installed here; the C++
    # side does not implement ftfy either): html-unescape twice, collapse
    # whitespace, strip.
    text = html.unescape(html.unescape(text))
    return re.sub(r"\s+", " ", text).strip()


def main():
    torch.manual_seed(20261130)
    os.makedirs(os.path.join(ROOT, "tokenizer"), exist_ok=True)
    os.makedirs(os.path.join(ROOT, "hf"), exist_ok=True)

    # 1. Tokenizer.
    # Trained from an iterator into memory, so no temporary path ends up in
    # the model's trainer spec and the file is the same on every run.
    model_io = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines()), model_writer=model_io, vocab_size=150, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, num_threads=1, minloglevel=2)
    model_bytes = model_io.getvalue()
    with open(os.path.join(ROOT, "tokenizer", "spiece.model"), "wb") as f:
        f.write(model_bytes)
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    vocab = sp.get_piece_size()

    raw_prompts = [
        "A cat sits on a red chair in the sun.",
        "  The chef &amp;amp; the robot\n\tcut   fruit in a bright kitchen &quot;quickly&quot; &lt;3  ",
        "Zebra QX unseen words 123 and émoji-free accents: café.",
    ]
    prompts = []
    for raw in raw_prompts:
        text = clean(raw)
        ids = sp.encode(text) + [1]  # T5 appends </s>
        prompts.append({"raw": raw, "clean": text, "ids": ids})
    # Ids come from sentencepiece itself plus </s>, as T5Tokenizer builds them.
    # Wan runs HF's fast tokenizer (tokenizer.json), which transformers builds
    # from spiece.model with its T5Converter: check that it agrees (needs
    # protobuf). transformers 5.24's T5Tokenizer(vocab_file=...) itself could
    # not be used: it returned unk/'▁' for every word of this tiny model.
    try:
        from transformers.convert_slow_tokenizer import T5Converter

        class _Slow:  # the attributes T5Converter reads from a slow tokenizer
            vocab_file = os.path.join(ROOT, "tokenizer", "spiece.model")
            _extra_ids = 0
            eos_token = "</s>"
            legacy = True
            add_prefix_space = True

            def convert_tokens_to_ids(self, token):
                return 1

        fast = T5Converter(_Slow()).converted()
        for p in prompts:
            fast_ids = fast.encode(p["clean"]).ids
            assert fast_ids == p["ids"], (p["clean"], fast_ids, p["ids"])
        print("HF fast tokenizer (T5Converter) agrees with sentencepiece + </s> on every prompt")
    except ImportError as e:
        print("note: HF fast tokenizer not compared (", e, ")")

    # 2. Tiny random UMT5 encoder.
    config = UMT5Config(vocab_size=vocab, d_model=64, d_kv=16, num_heads=4, d_ff=96, num_layers=2,
                        relative_attention_num_buckets=32, relative_attention_max_distance=128,
                        feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, dropout_rate=0.0,
                        pad_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    model = UMT5EncoderModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))  # not all ones, so a swapped norm shows
            elif "relative_attention_bias" in name:
                p.copy_(torch.randn_like(p))  # strong enough to matter in the output
            else:
                p.copy_(torch.randn_like(p) * (p.shape[-1] ** -0.5 if p.dim() == 2 and "shared" not in name else 1.0))
    model.save_pretrained(os.path.join(ROOT, "hf"), safe_serialization=True)

    # 3. Wan names.
    sd = model.state_dict()
    wan = {"token_embedding.weight": sd["shared.weight"], "norm.weight": sd["encoder.final_layer_norm.weight"]}
    for i in range(config.num_layers):
        h = f"encoder.block.{i}.layer."
        w = f"blocks.{i}."
        for x in "qkvo":
            wan[w + f"attn.{x}.weight"] = sd[h + f"0.SelfAttention.{x}.weight"]
        wan[w + "pos_embedding.embedding.weight"] = sd[h + "0.SelfAttention.relative_attention_bias.weight"]
        wan[w + "norm1.weight"] = sd[h + "0.layer_norm.weight"]
        wan[w + "norm2.weight"] = sd[h + "1.layer_norm.weight"]
        wan[w + "ffn.gate.0.weight"] = sd[h + "1.DenseReluDense.wi_0.weight"]
        wan[w + "ffn.fc1.weight"] = sd[h + "1.DenseReluDense.wi_1.weight"]
        wan[w + "ffn.fc2.weight"] = sd[h + "1.DenseReluDense.wo.weight"]
    torch.save({k: v.clone().contiguous() for k, v in wan.items()}, os.path.join(ROOT, "wan_umt5.pth"))

    # 4. Outputs over 512 positions with the padding mask, as Wan encodes.
    n = len(prompts)
    ids = torch.zeros(n, MAX_LEN, dtype=torch.long)
    mask = torch.zeros(n, MAX_LEN, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, :len(p["ids"])] = torch.tensor(p["ids"])
        mask[b, :len(p["ids"])] = 1
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        # The bucket table for rel = key - query in [-600, 600].
        rel = torch.arange(-600, 601)
        buckets = model.encoder.block[0].layer[0].SelfAttention._relative_position_bucket(rel)
    lens = mask.sum(1)
    context = out.clone()
    for b in range(n):
        context[b, lens[b]:] = 0  # the zero-pad rule before the DiT
    save_file({"input_ids": ids.to(torch.int64), "attention_mask": mask.to(torch.int64),
               "last_hidden_state": out.contiguous(), "context": context.contiguous(),
               "context_lens": lens.to(torch.int64), "relative_buckets": buckets.to(torch.int64).contiguous()},
              os.path.join(ROOT, "expected.safetensors"))
    with open(os.path.join(ROOT, "prompts.json"), "w") as f:
        json.dump({"max_length": MAX_LEN, "prompts": prompts}, f, indent=1, ensure_ascii=False)
    print("wrote", ROOT, "vocab", vocab, "lens", lens.tolist())


if __name__ == "__main__":
    main()
