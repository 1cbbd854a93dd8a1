#!/usr/bin/env python3
"""Writes the checkpoint-reader fixtures into fixtures/io/ with the real peers
(torch.save and the safetensors library), plus expected.json, which lists for
every file every tensor's name, dtype, shape and values so the C++ tests can
compare exactly.

The models are tiny (dim 48, ffn 160, 2 layers, 2 heads of 24, text_dim 32,
freq_dim 16) but the key layouts are the real ones (see
shared/reference/wan21-and-rcm.md §1.6 and turbodiffusion.md §4):

  wan_t2v_tiny.pth            original Wan names, fp32, torch.save(model.state_dict()),
                              patch_embedding as Conv3d [D,16,1,2,2]
  wan_t2v_tiny.safetensors    the same tensors through safetensors.torch.save_file
  turbo_tiny.pth              rCM / TurboDiffusion training layout: {"state_dict": OrderedDict
                              of "net."-prefixed keys}, bf16, patch_embedding as Linear [D,64],
                              per-block self_attn.attn_op.local_attn.proj_l.{weight,bias} fp32
  turbo_tiny_quant.pth        what TurboDiffusion's modify_model.py exports with --quant_linear:
                              torch.save(net.state_dict()) without prefix; every Linear inside
                              blocks (except proj_l) becomes int8_weight int8 [N,K] +
                              scale fp32 [ceil(N/128), ceil(K/128)] + bias (model dtype);
                              RMSNorm / affine LayerNorm weights become fp32 FastNorm buffers
  diffusers_tiny/             WanTransformer3DModel names in two safetensors shards + index + config
  misc_tiny.pth               layouts a reader must handle: transposed, sliced (storage offset),
                              two views of one storage, expanded (stride 0), empty, 0-dim, a
                              Parameter, a list of tensors, one tensor of every dtype torch can
                              save, int / float / str / bool / None / dtype leaves, nesting
  proto4_tiny.pth             torch.save(..., pickle_protocol=4): FRAME, MEMOIZE,
                              SHORT_BINUNICODE, STACK_GLOBAL
  legacy_tiny.pth             torch.save(..., _use_new_zipfile_serialization=False): must be
                              rejected with a message saying to re-save it
  zip64_tiny.pth              misc_tiny.pth's entries re-zipped by Python's zipfile with ZIP64
                              forced everywhere (ZIP64 end record + locator, ZIP64 extra fields
                              with saturated 32-bit sizes and offsets, as torch writes past 4 GB);
                              checked loadable by torch.load

It also writes the seed corpus of the pth fuzzer (fuzz/corpus/fuzz_pth/, each
file under 8 KB): valid files, truncated ones, hostile pickles (os.system,
builtins.eval, a huge memo index, deeply nested lists, a missing storage, a
view past its storage, ...).

Run from anywhere: python3 scripts/make_io_fixtures.py [--out DIR] [--corpus DIR]. Needs torch
and safetensors (pip install torch safetensors). Values are seeded, but the
.pth files differ between runs in their random serialization id.
"""

import argparse
import collections
import json
import math
import os
import pickle
import shutil
import zipfile

import torch
import torch.nn as nn
from safetensors.torch import save_file

DIM = 48
FFN = 160  # > 128, so the quantized FFN weights get two 128-blocks along one axis
HEADS = 2
HEAD_DIM = DIM // HEADS
LAYERS = 2
TEXT_DIM = 32
FREQ_DIM = 16
IN_CH = 16
OUT_CH = 16
PATCH = (1, 2, 2)
PATCH_FEATURES = IN_CH * PATCH[0] * PATCH[1] * PATCH[2]


# ---- a tiny Wan2.1 DiT with the original module names ------------------------
# Only the parameter layout matters (no forward): the module tree mirrors
# wan/modules/model.py so that state_dict() yields the real names in the real order.

class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class Attention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = RMSNorm(dim)
        self.norm_k = RMSNorm(dim)


class Block(nn.Module):
    def __init__(self, dim, ffn):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False)
        self.self_attn = Attention(dim)
        self.norm3 = nn.LayerNorm(dim, elementwise_affine=True)
        self.cross_attn = Attention(dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(approximate="tanh"), nn.Linear(ffn, dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)


class Head(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.head = nn.Linear(dim, math.prod(PATCH) * OUT_CH)
        self.modulation = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)


class WanModel(nn.Module):
    def __init__(self, patch_as_linear):
        super().__init__()
        if patch_as_linear:  # rCM / TurboDiffusion (rcm/networks/wan2pt1.py)
            self.patch_embedding = nn.Linear(PATCH_FEATURES, DIM)
        else:  # original Wan
            self.patch_embedding = nn.Conv3d(IN_CH, DIM, kernel_size=PATCH, stride=PATCH)
        self.text_embedding = nn.Sequential(nn.Linear(TEXT_DIM, DIM), nn.GELU(approximate="tanh"), nn.Linear(DIM, DIM))
        self.time_embedding = nn.Sequential(nn.Linear(FREQ_DIM, DIM), nn.SiLU(), nn.Linear(DIM, DIM))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(DIM, DIM * 6))
        self.blocks = nn.ModuleList([Block(DIM, FFN) for _ in range(LAYERS)])
        self.head = Head(DIM)


def randomize(model):
    """Non-trivial values everywhere (norm weights near 1, biases small)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm_q.weight") or name.endswith("norm_k.weight") or name.endswith("norm3.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.05 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]))
    return model


# ---- TurboDiffusion's W8A8 weight format --------------------------------------

def quantize_128x128(w):
    """TurboDiffusion ops/quant (Quantization kernel): per 128x128 block,
    amax = max(1e-8, max|w|); q = round_to_nearest_even(w * (128 / amax))
    saturated to int8 (cvt.rni.sat.s8.f32); the stored scale is amax / 128, so
    w ~= q * scale. All arithmetic in fp32 on the (bf16) weight."""
    w = w.float()
    n, k = w.shape
    rows, cols = -(-n // 128), -(-k // 128)
    q = torch.empty((n, k), dtype=torch.int8)
    scale = torch.empty((rows, cols), dtype=torch.float32)
    for i in range(rows):
        for j in range(cols):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            amax = torch.clamp(blk.abs().max(), min=1e-8)
            inv = torch.tensor(128.0, dtype=torch.float32) / amax
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = torch.clamp(torch.round(blk * inv), -128, 127).to(torch.int8)
            scale[i, j] = amax / 128.0
    return q, scale


def is_block_linear(name, model_sd):
    return name.startswith("blocks.") and name.endswith(".weight") and model_sd[name].dim() == 2 and "proj_l" not in name


# ---- diffusers names (scripts/convert_wan_to_diffusers.py) ---------------------

DIFFUSERS_RENAMES = [
    ("time_embedding.0", "condition_embedder.time_embedder.linear_1"),
    ("time_embedding.2", "condition_embedder.time_embedder.linear_2"),
    ("time_projection.1", "condition_embedder.time_proj"),
    ("text_embedding.0", "condition_embedder.text_embedder.linear_1"),
    ("text_embedding.2", "condition_embedder.text_embedder.linear_2"),
    ("head.modulation", "scale_shift_table"),
    ("head.head", "proj_out"),
    (".modulation", ".scale_shift_table"),
    ("self_attn.q", "attn1.to_q"),
    ("self_attn.k", "attn1.to_k"),
    ("self_attn.v", "attn1.to_v"),
    ("self_attn.o", "attn1.to_out.0"),
    ("self_attn.norm_q", "attn1.norm_q"),
    ("self_attn.norm_k", "attn1.norm_k"),
    ("cross_attn.q", "attn2.to_q"),
    ("cross_attn.k", "attn2.to_k"),
    ("cross_attn.v", "attn2.to_v"),
    ("cross_attn.o", "attn2.to_out.0"),
    ("cross_attn.norm_q", "attn2.norm_q"),
    ("cross_attn.norm_k", "attn2.norm_k"),
    ("ffn.0", "ffn.net.0.proj"),
    ("ffn.2", "ffn.net.2"),
    ("norm3", "norm2"),  # the cross-attention affine LayerNorm is norm2 in diffusers
]


def to_diffusers(sd):
    """Renames with the first matching rule (no two rules overlap: 'self_attn.q'
    is not a substring of 'self_attn.norm_q')."""
    out = collections.OrderedDict()
    for name, t in sd.items():
        new = name
        for old, repl in DIFFUSERS_RENAMES:
            if old in name:
                new = name.replace(old, repl)
                break
        out[new] = t
    return out


# ---- expected values --------------------------------------------------------------

DTYPE_NAMES = {
    torch.float64: "f64", torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "f8e4m3", torch.float8_e5m2: "f8e5m2", torch.int64: "i64", torch.int32: "i32",
    torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8", torch.bool: "bool",
}
FIRST_VALUES = 8


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def describe(t):
    flat = t.detach().reshape(-1).contiguous()
    raw = bytes(flat.view(torch.uint8).tolist()) if flat.numel() else b""
    as_f64 = flat.to(torch.float64)
    return {
        "dtype": DTYPE_NAMES[t.dtype],
        "shape": list(t.shape),
        "sum": float(as_f64.sum()) if flat.numel() else 0.0,
        "first": [float(x) for x in as_f64[:FIRST_VALUES].tolist()],
        "fnv1a64": f"{fnv1a64(raw):016x}",  # of the row-major little-endian bytes
    }


def expected_entry(fmt, tensors, metadata=None):
    return {"format": fmt,
            "tensors": [dict(name=n, **describe(t)) for n, t in tensors],
            "metadata": metadata or {}}



# ---- hand-made archives (zip64 fixture, fuzz seeds) -----------------------------

def rezip(src, dst, force_zip64):
    """Copies the entries of a torch.save archive into a new zip written by
    Python's zipfile (stored, in the same order). With force_zip64 every size
    and offset goes through the ZIP64 records, as in torch files over 4 GB."""
    saved = zipfile.ZIP64_LIMIT
    try:
        if force_zip64:
            zipfile.ZIP64_LIMIT = 0  # every size/offset counts as "too large for 32 bits"
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
            for info in zin.infolist():
                data = zin.read(info.filename)
                with zout.open(zipfile.ZipInfo(info.filename), "w", force_zip64=force_zip64) as f:
                    f.write(data)
    finally:
        zipfile.ZIP64_LIMIT = saved


class _Storage:
    """Stands for a storage in a hand-written pickle: persistent_id turns it
    into torch's ('storage', type, key, location, numel) tuple."""

    def __init__(self, storage_type, key, numel):
        self.pid = ("storage", storage_type, key, "cpu", numel)


class _Tensor:
    """Pickles as torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())."""

    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, tuple(size), tuple(stride), False, collections.OrderedDict())

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, self.args)


class _TorchLikePickler(pickle.Pickler):
    def persistent_id(self, obj):
        return obj.pid if isinstance(obj, _Storage) else None


def torch_like_pickle(obj, protocol=2):
    import io
    buf = io.BytesIO()
    _TorchLikePickler(buf, protocol=protocol).dump(obj)
    return buf.getvalue()


def write_archive(path, pkl, storages, prefix="archive", compress=()):
    """A torch.save-shaped zip: <prefix>/data.pkl, byteorder, data/<key>, version."""
    with zipfile.ZipFile(path, "w") as z:
        def add(name, data):
            z.writestr(zipfile.ZipInfo(name), data,
                       compress_type=zipfile.ZIP_DEFLATED if name in compress else zipfile.ZIP_STORED)
        add(f"{prefix}/data.pkl", pkl)
        add(f"{prefix}/byteorder", b"little")
        for key, data in storages.items():
            add(f"{prefix}/data/{key}", data)
        add(f"{prefix}/version", b"3\n")


def write_fuzz_corpus(cdir, fixtures):
    if os.path.isdir(cdir):
        shutil.rmtree(cdir)
    os.makedirs(cdir)
    p = lambda name: os.path.join(cdir, name)
    small = collections.OrderedDict([("w", torch.randn(3, 4)), ("b", torch.randn(4).half()), ("step", 5)])
    torch.save(small, p("valid_small.pth"))
    torch.save(collections.OrderedDict([("f8", torch.randn(6).to(torch.float8_e5m2)), ("i", torch.arange(4))]),
               p("valid_proto4_v3.pth"), pickle_protocol=4)
    x = torch.randn(4, 5)
    torch.save({"t": x.t(), "s": x[1:, 2:], "n": {"deep": [x[0], 1.5, "str"]}}, p("valid_views.pth"))
    raw = open(p("valid_small.pth"), "rb").read()
    for cut in (len(raw) // 3, len(raw) - 200, len(raw) - 10):
        open(p(f"truncated_{cut}.pth"), "wb").write(raw[:cut])
    shutil.copy(os.path.join(fixtures, "legacy_tiny.pth"), p("legacy.pth"))

    floats = bytes(torch.randn(10).view(torch.uint8).tolist())
    fs = _Storage(torch.FloatStorage, "0", 10)
    # Globals that would run code in torch.load.
    write_archive(p("global_os_system.pth"), b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00echo\x85R.", {})
    write_archive(p("global_builtins_eval.pth"),
                  b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93\x8c\x011\x85R.", {})
    write_archive(p("global_numpy.pth"), b"\x80\x02cnumpy.core.multiarray\n_reconstruct\n)R.", {})
    # Memo abuse.
    write_archive(p("huge_memo_index.pth"), b"\x80\x02Nr\xf0\xff\xff\x0fj\xf0\xff\xff\x0f\x86.", {})
    write_archive(p("memo_get_unset.pth"), b"\x80\x02h\x07.", {})
    # 3000 nested lists: EMPTY_LIST x n, then APPEND x (n-1) folds them into one chain.
    write_archive(p("deeply_nested_lists.pth"), b"\x80\x02" + b"]" * 3000 + b"a" * 2999 + b".", {})
    # A list that contains itself (cycle through the memo).
    write_archive(p("self_containing_list.pth"), b"\x80\x02]q\x00h\x00a.", {})
    # Tensors pointing outside their storage.
    write_archive(p("missing_storage_key.pth"),
                  torch_like_pickle({"w": _Tensor(_Storage(torch.FloatStorage, "7", 10), 0, (10,), (1,))}),
                  {"0": floats})
    write_archive(p("size_stride_past_storage.pth"), torch_like_pickle({"w": _Tensor(fs, 0, (4, 4), (4, 1))}),
                  {"0": floats})
    write_archive(p("offset_past_storage.pth"), torch_like_pickle({"w": _Tensor(fs, 9, (2,), (1,))}), {"0": floats})
    write_archive(p("overflowing_size.pth"),
                  torch_like_pickle({"w": _Tensor(fs, 0, (2**62, 4), (2**62, 1))}), {"0": floats})
    write_archive(p("storage_numel_past_entry.pth"),
                  torch_like_pickle({"w": _Tensor(_Storage(torch.FloatStorage, "0", 1000), 0, (10,), (1,))}),
                  {"0": floats})
    write_archive(p("shared_storage_ok.pth"),
                  torch_like_pickle({"a": _Tensor(fs, 0, (2, 5), (5, 1)), "b": _Tensor(fs, 3, (3,), (2,))}),
                  {"0": floats})
    write_archive(p("compressed_pickle.pth"), torch_like_pickle({"w": _Tensor(fs, 0, (10,), (1,))}), {"0": floats},
                  compress=("archive/data.pkl",))
    rezip(p("valid_small.pth"), p("zip64_small.pth"), force_zip64=True)
    for name in os.listdir(cdir):
        assert os.path.getsize(p(name)) < 8192, name

# ---- the files ----------------------------------------------------------------------

def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "fixtures", "io"))
    ap.add_argument("--corpus", default=os.path.join(here, "..", "fuzz", "corpus", "fuzz_pth"),
                    help="where the pth fuzzer's seed corpus goes ('' to skip)")
    args = ap.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(20251130)
    expected = {}

    # Original Wan, fp32.
    wan = randomize(WanModel(patch_as_linear=False))
    wan_sd = wan.state_dict()  # OrderedDict with _metadata, as torch.save(model.state_dict()) writes it
    torch.save(wan_sd, os.path.join(out, "wan_t2v_tiny.pth"))
    expected["wan_t2v_tiny.pth"] = expected_entry("pth", list(wan_sd.items()))
    save_file({k: v.contiguous() for k, v in wan_sd.items()}, os.path.join(out, "wan_t2v_tiny.safetensors"),
              metadata={"format": "pt"})
    # safetensors stores tensors sorted by name; the reader returns them in data-offset order.
    expected["wan_t2v_tiny.safetensors"] = expected_entry("safetensors", sorted(wan_sd.items()), {"format": "pt"})

    # rCM / TurboDiffusion training layout: {"state_dict": {"net.*": bf16}}, Linear patch embedding, SLA proj_l.
    turbo = randomize(WanModel(patch_as_linear=True))
    with torch.no_grad():
        turbo.patch_embedding.weight.copy_(wan.patch_embedding.weight.reshape(DIM, PATCH_FEATURES))
    turbo_sd = collections.OrderedDict()
    for name, t in turbo.state_dict().items():
        turbo_sd["net." + name] = t.to(torch.bfloat16)
        if name.startswith("blocks.") and name.endswith("self_attn.norm_k.weight"):
            block = name[: -len("self_attn.norm_k.weight")]
            # proj_l follows norm_k: attn_op is registered after the norms in WanSelfAttention.
            turbo_sd["net." + block + "self_attn.attn_op.local_attn.proj_l.weight"] = 0.02 * torch.randn(HEAD_DIM, HEAD_DIM)
            turbo_sd["net." + block + "self_attn.attn_op.local_attn.proj_l.bias"] = 0.02 * torch.randn(HEAD_DIM)
    torch.save({"state_dict": turbo_sd}, os.path.join(out, "turbo_tiny.pth"))
    expected["turbo_tiny.pth"] = expected_entry("pth", [("state_dict." + k, v) for k, v in turbo_sd.items()])

    # TurboDiffusion -quant export of the same network (modify_model.py --quant_linear).
    plain = collections.OrderedDict((k[len("net."):], v) for k, v in turbo_sd.items())
    quant_sd = collections.OrderedDict()
    for name, t in plain.items():
        if is_block_linear(name, plain):
            q, s = quantize_128x128(t)
            base = name[: -len(".weight")]
            quant_sd[base + ".int8_weight"] = q
            quant_sd[base + ".scale"] = s
            quant_sd[base + ".bias"] = plain[base + ".bias"]  # Int8Linear keeps the model dtype
        elif is_block_linear(name.replace(".bias", ".weight"), plain) and name.endswith(".bias"):
            continue  # emitted with its weight, after int8_weight and scale (Int8Linear's buffer order)
        elif name.startswith("blocks.") and (".norm_q." in name or ".norm_k." in name or ".norm3." in name):
            quant_sd[name] = t.float()  # FastRMSNorm / FastLayerNorm buffers are fp32
        else:
            quant_sd[name] = t
    torch.save(quant_sd, os.path.join(out, "turbo_tiny_quant.pth"))
    expected["turbo_tiny_quant.pth"] = expected_entry("pth", list(quant_sd.items()))

    # diffusers WanTransformer3DModel, two shards + index + config.
    ddir = os.path.join(out, "diffusers_tiny")
    if os.path.isdir(ddir):
        shutil.rmtree(ddir)
    os.makedirs(ddir)
    dsd = to_diffusers(wan_sd)
    names = list(dsd.keys())
    half = len(names) // 2
    shards = [names[:half], names[half:]]
    weight_map = {}
    total = 0
    for i, shard in enumerate(shards):
        fname = f"diffusion_pytorch_model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {n: dsd[n].contiguous() for n in shard}
        save_file(tensors, os.path.join(ddir, fname), metadata={"format": "pt"})
        expected["diffusers_tiny/" + fname] = expected_entry("safetensors", sorted(tensors.items()), {"format": "pt"})
        for n in shard:
            weight_map[n] = fname
            total += dsd[n].numel() * dsd[n].element_size()
    with open(os.path.join(ddir, "diffusion_pytorch_model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    with open(os.path.join(ddir, "config.json"), "w") as f:
        json.dump({
            "_class_name": "WanTransformer3DModel", "_diffusers_version": "0.35.0",
            "patch_size": list(PATCH), "num_attention_heads": HEADS, "attention_head_dim": HEAD_DIM,
            "in_channels": IN_CH, "out_channels": OUT_CH, "text_dim": TEXT_DIM, "freq_dim": FREQ_DIM,
            "ffn_dim": FFN, "num_layers": LAYERS, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads",
            "eps": 1e-06, "image_dim": None, "added_kv_proj_dim": None, "rope_max_seq_len": 1024,
        }, f, indent=2)

    # Reader edge cases.
    base = torch.randn(10, dtype=torch.float32)
    shared = torch.randn(4, 6, dtype=torch.float32)
    param = nn.Parameter(torch.randn(3, 2))
    every_dtype = collections.OrderedDict()
    every_dtype["f64"] = torch.randn(3, 5, dtype=torch.float64)
    every_dtype["f32"] = torch.randn(7, dtype=torch.float32)
    every_dtype["f16"] = torch.randn(2, 3, 5).to(torch.float16)
    every_dtype["bf16"] = torch.randn(5, 3).to(torch.bfloat16)
    every_dtype["f8e4m3"] = (4 * torch.randn(3, 7)).to(torch.float8_e4m3fn)
    every_dtype["f8e5m2"] = (4 * torch.randn(9)).to(torch.float8_e5m2)
    every_dtype["i64"] = torch.tensor([-(2**40) - 3, 2**45 + 11, 0, -1, 7], dtype=torch.int64)
    every_dtype["i32"] = torch.randint(-2**31, 2**31 - 1, (4, 3), dtype=torch.int32)
    every_dtype["i16"] = torch.randint(-2**15, 2**15 - 1, (6,), dtype=torch.int16)
    every_dtype["i8"] = torch.randint(-128, 127, (3, 3), dtype=torch.int8)
    every_dtype["u8"] = torch.randint(0, 255, (11,), dtype=torch.uint8)
    every_dtype["bool"] = torch.rand(2, 5) > 0.5
    misc = collections.OrderedDict([
        ("transposed", torch.randn(3, 5).t()),              # stride (1, 5)
        ("sliced", base[3:8]),                                # storage offset 3 of 10 elements
        ("shared_full", shared),                              # these two share one storage
        ("shared_view", shared[1:, 2:5]),                     # offset 8, stride (6, 1)
        ("expanded", torch.randn(3, 1).expand(3, 4)),        # stride (1, 0)
        ("empty", torch.empty(0, 3)),
        ("scalar", torch.tensor(2.5)),
        ("param", param),                                     # torch._utils._rebuild_parameter
        ("dtypes", every_dtype),
        ("list_of_tensors", [torch.randn(2), torch.arange(3, dtype=torch.int32)]),
        ("tuple_mixed", (torch.ones(2, dtype=torch.float16), 7)),
        ("step", 1234),
        ("lr", 0.000125),
        ("note", "tiny fixture"),
        ("flag", True),
        ("nothing", None),
        ("dtype", torch.bfloat16),
        ("config", {"dim": DIM, "name": "wan-tiny", "nested": {"eps": 1e-06}}),
        ("int_keys", {3: torch.zeros(1), 10: "ten"}),
    ])
    torch.save(misc, os.path.join(out, "misc_tiny.pth"))
    misc_tensors = [
        ("transposed", misc["transposed"]), ("sliced", misc["sliced"]), ("shared_full", shared),
        ("shared_view", misc["shared_view"]), ("expanded", misc["expanded"]), ("empty", misc["empty"]),
        ("scalar", misc["scalar"]), ("param", param.data),
    ] + [("dtypes." + k, v) for k, v in every_dtype.items()] + [
        ("list_of_tensors.0", misc["list_of_tensors"][0]), ("list_of_tensors.1", misc["list_of_tensors"][1]),
        ("tuple_mixed.0", misc["tuple_mixed"][0]), ("int_keys.3", misc["int_keys"][3]),
    ]
    misc_meta = {"tuple_mixed.1": "7", "step": "1234", "lr": repr(0.000125), "note": "tiny fixture", "flag": "True",
                 "nothing": "None", "dtype": "torch.bfloat16", "config.dim": str(DIM), "config.name": "wan-tiny",
                 "config.nested.eps": repr(1e-06), "int_keys.10": "ten"}
    expected["misc_tiny.pth"] = expected_entry("pth", misc_tensors, misc_meta)
    expected["misc_tiny.pth"]["views"] = {  # storage layout the reader must reproduce
        "transposed": {"stride": [1, 5], "storage_offset": 0},
        "sliced": {"stride": [1], "storage_offset": 3},
        "shared_view": {"stride": [6, 1], "storage_offset": 8, "shares_storage_with": "shared_full"},
        "expanded": {"stride": [1, 0], "storage_offset": 0},
    }

    proto4 = collections.OrderedDict([("blocks.0.weight", torch.randn(4, 3)), ("blocks.0.bias", torch.randn(4).half()),
                                      ("f8", torch.randn(5).to(torch.float8_e4m3fn)), ("epoch", 3)])
    torch.save(proto4, os.path.join(out, "proto4_tiny.pth"), pickle_protocol=4)
    expected["proto4_tiny.pth"] = expected_entry("pth", [(k, v) for k, v in proto4.items() if torch.is_tensor(v)],
                                                 {"epoch": "3"})

    torch.save({"w": torch.randn(2, 2)}, os.path.join(out, "legacy_tiny.pth"), _use_new_zipfile_serialization=False)
    expected["legacy_tiny.pth"] = {"error": "legacy"}

    rezip(os.path.join(out, "misc_tiny.pth"), os.path.join(out, "zip64_tiny.pth"), force_zip64=True)
    reloaded = torch.load(os.path.join(out, "zip64_tiny.pth"), weights_only=True)
    assert torch.equal(reloaded["shared_view"], misc["shared_view"]), "torch.load disagrees on the ZIP64 copy"
    expected["zip64_tiny.pth"] = dict(expected["misc_tiny.pth"])

    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"generator": "scripts/make_io_fixtures.py", "torch": torch.__version__,
                   "dims": {"dim": DIM, "ffn_dim": FFN, "num_heads": HEADS, "head_dim": HEAD_DIM, "num_layers": LAYERS,
                            "text_dim": TEXT_DIM, "freq_dim": FREQ_DIM, "in_dim": IN_CH, "out_dim": OUT_CH},
                   "files": expected}, f, indent=1)
    if args.corpus:
        write_fuzz_corpus(os.path.abspath(args.corpus), out)
        print(f"wrote {len(os.listdir(args.corpus))} fuzz seeds into {os.path.abspath(args.corpus)}")
    size = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(out) for fn in fns)
    print(f"wrote {len(expected)} fixtures into {out} ({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
