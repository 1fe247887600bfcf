#!/usr/bin/env python3
"""Logit parity of our LongNet model with a PyTorch model built from the seed library's layers
(issue 15), on the GPU machine (PyTorch and numpy; the `safetensors` package is not needed).

    seed_parity.py SEED_LIB --dump DUMP_LOGITS_GPU --data KJV_TXT [--checkpoint STEP_DIR]
                   [--begin 2000000] [--batch 2] [--seq-len 512] [--work DIR] [--cpu-only]

SEED_LIB is the folder holding the dilated_attention_pytorch package (the library stays out of
this repository; only its multihead_dilated_attention and dilated_attention modules are loaded).

The PyTorch model is our architecture (docs/MODEL.md) with the seed's layers where they match:
each block's attention is a seed MultiheadDilatedAttention(layer_norm=False), whose q_proj, k_proj,
v_proj and out_proj nn.Linear modules hold our weights and whose .attention (the seed's standard
DilatedAttention, not an Improved* class) attends, with is_causal=True, over q and k rotated by
our rotary positions (and XPOS when the config has it) in PyTorch; between attention and
out_proj our MAGNETO sub-LayerNorm (the seed's layer_norm=True would instead put LayerNorms on q
and k and reuse q's after attention: not our model); then our FFN (LayerNorm, fc1, erf GELU,
sub-LayerNorm, fc2), the final LayerNorm and the head (tied to the embedding or not). The weights
come from our safetensors file (read by model/testing/weights_io.py) and load with strict=True:
every parameter of the PyTorch model is one of ours and every one of ours is used.

Cases: the checkpoint given (a trained kjv-small model: grouped, RoPE, tied, 4 heads in 3 groups,
D = 32, which our GPU model runs through cuDNN), and a model from a seed (grouped, XPOS, untied,
2 heads of D = 64, which our GPU model runs on its own Hopper kernels). Tokens: batch x seq_len
bytes of KJV_TXT from --begin, written as a token file that dump_logits reads (--format tokens).
seq_len must be a multiple of every segment length (the seed's DilatedAttention asserts
N % max(segment) == 0 and reshapes by each segment).

Comparisons (relative Frobenius error ||a - b|| / ||b||), each printed:
  ours CPU fp32 (dump_logits --device cpu)  vs PyTorch fp32 on the CPU     bound 1e-4
  ours CPU fp32                             vs PyTorch fp64 on the CPU     bound 1e-4
  ours GPU bf16 (dump_logits --device cuda) vs PyTorch fp64 on the CPU     bound 3e-2
  PyTorch bf16 on the GPU (the same seed layers, bf16 weights) vs fp64     no bound: it says what
                                                                           bf16 costs PyTorch
The references run on the CPU because the seed turns TF32 on for every CUDA matmul when it is
imported on a CUDA machine. Variants that change one thing the comparison relies on (no rotary;
attention not causal) must move the fp64 logits by more than 1e-3, or the tight check could not
tell them apart. Exit status 0 when every bound holds.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import weights_io  # noqa: E402

TOL_FP32 = 1e-4
TOL_BF16 = 3e-2
VARIANT_MIN = 1e-3

# The seeded case: grouped, XPOS, untied head, D = 64 (our Hopper attention kernels on the GPU).
SEEDED_CONFIG = {
    "vocab_size": 256, "d_model": 128, "num_layers": 2, "num_heads": 2, "ffn_dim": 384,
    "tie_embeddings": False,
    "attention": {"mode": "grouped", "segment_lengths": [128, 512], "dilation_rates": [1, 4]},
    "rotary": {"xpos": True, "xpos_scale_base": 512},
}
SEEDED_INIT = 11


def load_seed(seed_lib):
    # The package's __init__ imports every variant it ships, some of which need torchscale,
    # DeepSpeed or FairScale; only the modules used here are loaded, under a bare package (as
    # bench/model_bench/torch_reference.py does).
    package_dir = os.path.join(os.path.abspath(seed_lib), "dilated_attention_pytorch")
    if not os.path.isdir(package_dir):
        sys.exit("seed_parity.py: %s holds no dilated_attention_pytorch package" % seed_lib)
    package = types.ModuleType("dilated_attention_pytorch")
    package.__path__ = [package_dir]
    sys.modules["dilated_attention_pytorch"] = package
    from dilated_attention_pytorch.multihead_dilated_attention import MultiheadDilatedAttention
    from dilated_attention_pytorch.core import constants
    return MultiheadDilatedAttention, constants


def rotary_tables(cfg, n):
    """cos, sin and the XPOS factors of q and k, [n, D/2] each, in float64, at positions
    relative to the block reference of docs/MODEL.md (W = min(lcm(segments), N),
    c(p) = floor(p / W) W + floor(W / 2)), as our model computes them."""
    d = cfg["d_model"] // cfg["num_heads"]
    rot = cfg["rotary"]
    w = min(int(np.lcm.reduce(np.array(cfg["attention"]["segment_lengths"], dtype=np.int64))), n)
    pos = np.arange(n, dtype=np.int64)
    rel = (pos - ((pos // w) * w + w // 2)).astype(np.float64)
    j = np.arange(d // 2, dtype=np.float64)
    freq = rot["theta"] ** (-2.0 * j / d)
    angle = rel[:, None] * freq[None, :]
    if rot["xpos"]:
        zeta = (2.0 * j + 0.4 * d) / (1.4 * d)
        power = rel[:, None] / rot["xpos_scale_base"]
        scale_q, scale_k = zeta[None, :] ** power, zeta[None, :] ** (-power)
    else:
        scale_q = scale_k = np.ones_like(angle)
    return np.cos(angle), np.sin(angle), scale_q, scale_k


def build_model(torch, mhda_cls, cfg, dtype, device, rotary=True, causal=True):
    nn = torch.nn
    F = torch.nn.functional
    d, h, f, v = cfg["d_model"], cfg["num_heads"], cfg["ffn_dim"], cfg["vocab_size"]
    eps = cfg["layer_norm_eps"]
    att = cfg["attention"]
    if att["mode"] != "grouped":
        sys.exit("seed_parity.py: the seed's DilatedAttention computes grouped mode only")
    kw = {"device": device, "dtype": dtype}

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm = nn.LayerNorm(d, eps=eps, **kw)
            # The seed's layer, without its q/k LayerNorm: its projections and its attention.
            self.attn = mhda_cls(embed_dim=d, num_heads=h, dilation_rates=att["dilation_rates"],
                                 segment_lengths=att["segment_lengths"], dropout=0.0, bias=True,
                                 layer_norm=False, device=device, dtype=dtype)
            self.sub_norm = nn.LayerNorm(d, eps=eps, **kw)
            self.ffn_norm = nn.LayerNorm(d, eps=eps, **kw)
            self.fc1 = nn.Linear(d, f, **kw)
            self.ffn_sub_norm = nn.LayerNorm(f, eps=eps, **kw)
            self.fc2 = nn.Linear(f, d, **kw)

        def forward(self, x, tables):
            b, n, _ = x.shape
            y = self.attn_norm(x)
            q = self.attn.q_proj(y).view(b, n, h, d // h)
            k = self.attn.k_proj(y).view(b, n, h, d // h)
            val = self.attn.v_proj(y).view(b, n, h, d // h)
            if rotary:
                q, k = rotate(q, tables, 2), rotate(k, tables, 3)
            a = self.attn.attention(q, k, val, is_causal=causal).reshape(b, n, d)
            x = x + self.attn.out_proj(self.sub_norm(a))
            y = self.ffn_sub_norm(F.gelu(self.fc1(self.ffn_norm(x))))  # erf GELU
            return x + self.fc2(y)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(v, d, **kw)
            self.blocks = nn.ModuleList([Block() for _ in range(cfg["num_layers"])])
            self.final_norm = nn.LayerNorm(d, eps=eps, **kw)
            if not cfg["tie_embeddings"]:
                self.lm_head = nn.Linear(d, v, bias=False, **kw)

        def forward(self, tokens):
            n = tokens.shape[1]
            tables = [torch.tensor(t, dtype=torch.float32 if dtype == torch.bfloat16 else dtype,
                                   device=device) for t in rotary_tables(cfg, n)]
            x = self.embedding(tokens)
            for block in self.blocks:
                x = block(x, tables)
            x = self.final_norm(x)
            head = self.embedding.weight if cfg["tie_embeddings"] else self.lm_head.weight
            return F.linear(x, head)

    def rotate(x, tables, which):
        cos, sin, scale = tables[0], tables[1], tables[which]
        work = x.float() if x.dtype == torch.bfloat16 else x
        x0, x1 = work[..., 0::2], work[..., 1::2]
        c, s, sc = cos[None, :, None, :], sin[None, :, None, :], scale[None, :, None, :]
        y0 = (x0 * c - x1 * s) * sc
        y1 = (x1 * c + x0 * s) * sc
        return torch.stack((y0, y1), dim=-1).flatten(-2).to(x.dtype)

    return LM().eval()


def our_names_to_torch(cfg):
    """Our parameter names (model/longnet_params.h) -> the PyTorch model's state_dict keys."""
    m = {"token_embedding.weight": "embedding.weight",
         "final_norm.weight": "final_norm.weight", "final_norm.bias": "final_norm.bias"}
    if not cfg["tie_embeddings"]:
        m["lm_head.weight"] = "lm_head.weight"
    for i in range(cfg["num_layers"]):
        ours, theirs = "blocks.%d." % i, "blocks.%d." % i
        pairs = [("attn_norm", "attn_norm"), ("attn.q_proj", "attn.q_proj"),
                 ("attn.k_proj", "attn.k_proj"), ("attn.v_proj", "attn.v_proj"),
                 ("attn.sub_norm", "sub_norm"), ("attn.out_proj", "attn.out_proj"),
                 ("ffn_norm", "ffn_norm"), ("ffn.fc1", "fc1"), ("ffn.sub_norm", "ffn_sub_norm"),
                 ("ffn.fc2", "fc2")]
        for a, b in pairs:
            for p in ("weight", "bias"):
                m[ours + a + "." + p] = theirs + b + "." + p
    return m


def load_weights(torch, model, cfg, weights, dtype):
    names = our_names_to_torch(cfg)
    if set(names) != set(weights):
        sys.exit("seed_parity.py: tensors differ from the config's: missing %s, extra %s"
                 % (sorted(set(names) - set(weights))[:5], sorted(set(weights) - set(names))[:5]))
    state = {names[k]: torch.tensor(w, dtype=dtype) for k, w in weights.items()}
    model.load_state_dict(state, strict=True)  # Every parameter ours, every one of ours used.


def rel_error(a, b):
    return float(np.linalg.norm((a - b).ravel()) / np.linalg.norm(b.ravel()))


def run_dump(dump, args, work, name):
    out = os.path.join(work, name + ".npy")
    cmd = [dump] + args + ["--out", out]
    started = time.time()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print("FAILED: %s exited %d: %s" % (" ".join(cmd), r.returncode, r.stdout.strip()))
        return None
    print("  %s (%.1f s)" % (r.stdout.strip(), time.time() - started))
    return np.load(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("seed_lib", help="folder holding the dilated_attention_pytorch package")
    p.add_argument("--dump", required=True, help="dump_logits_gpu (or dump_logits with --cpu-only)")
    p.add_argument("--data", required=True, help="a text file (the King James Bible)")
    p.add_argument("--checkpoint", default="", help="a checkpoint step folder of ours")
    p.add_argument("--begin", type=int, default=2000000)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--work", default="", help="folder for the token file and the .npy files")
    p.add_argument("--cpu-only", action="store_true", help="no GPU dump and no bf16 PyTorch run")
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()

    import torch
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    mhda_cls, constants = load_seed(args.seed_lib)
    gpu = not args.cpu_only and torch.cuda.is_available()
    print("seed_parity: torch %s, %d CPU threads, %s; seed attention backends: flash_attn %s, "
          "flash_attn_3 %s, SDPA %s, xformers %s" % (
              torch.__version__, torch.get_num_threads(),
              torch.cuda.get_device_name(0) if gpu else "no GPU run", constants.HAS_FLASH_ATTN,
              constants.HAS_FLASH_ATTN_3, constants.HAS_SDPA, constants.HAS_XFORMERS))

    work = args.work or os.path.join(os.environ.get("TMPDIR", "/tmp"), "seed_parity")
    os.makedirs(work, exist_ok=True)
    n_tokens = args.batch * args.seq_len
    with open(args.data, "rb") as f:
        f.seek(args.begin)
        window = np.frombuffer(f.read(n_tokens), dtype=np.uint8).astype(np.int64)
    if window.size != n_tokens:
        sys.exit("seed_parity.py: %s has fewer than %d bytes after %d" % (args.data, n_tokens,
                                                                          args.begin))
    token_file = os.path.join(work, "tokens.tok")
    weights_io.write_token_file(token_file, window, 256)
    tokens = weights_io.read_token_file(token_file).reshape(args.batch, args.seq_len)
    print("tokens: bytes [%d, %d) of %s: %r ..." % (args.begin, args.begin + n_tokens, args.data,
                                                     bytes(window[:60].astype(np.uint8))))
    data_args = ["--data", token_file, "--format", "tokens", "--begin", "0",
                 "--batch", str(args.batch), "--seq-len", str(args.seq_len)]

    cases = []
    if args.checkpoint:
        with open(os.path.join(args.checkpoint, "config.json")) as f:
            cfg = json.load(f)
        cases.append(("checkpoint", cfg, os.path.join(args.checkpoint, "weights.safetensors"),
                      ["--checkpoint", args.checkpoint]))
    seeded_json = os.path.join(work, "seeded_model.json")
    with open(seeded_json, "w") as f:
        json.dump(SEEDED_CONFIG, f)
    seeded_dir = os.path.join(work, "seeded")
    cases.append(("seeded", None, os.path.join(seeded_dir, "weights.safetensors"),
                  ["--model-config", seeded_json, "--init-seed", str(SEEDED_INIT)]))

    rows, failures = [], []

    def check(case, what, err, bound, agree):
        ok = bound is None or err <= bound
        rows.append((case, what, err, bound, agree, ok))
        if not ok:
            failures.append("%s: %s: %.3e > %g" % (case, what, err, bound))

    for name, cfg, weights_path, source in cases:
        print("== case %s" % name)
        extra = ["--save-weights", seeded_dir] if name == "seeded" else []
        ours_cpu = run_dump(args.dump, source + extra + data_args + ["--device", "cpu"], work,
                            name + "_cpu")
        ours_gpu = run_dump(args.dump, source + data_args + ["--device", "cuda"], work,
                            name + "_gpu") if gpu else None
        if ours_cpu is None or (gpu and ours_gpu is None):
            failures.append("%s: dump_logits failed" % name)
            continue
        if cfg is None:
            with open(os.path.join(seeded_dir, "config.json")) as f:
                cfg = json.load(f)
        segs = cfg["attention"]["segment_lengths"]
        bad = [s for s in segs if args.seq_len % s]
        if bad:
            sys.exit("seed_parity.py: --seq-len %d is not a multiple of segments %s (the seed's "
                     "DilatedAttention needs N %% w == 0)" % (args.seq_len, bad))
        weights = weights_io.read_safetensors(weights_path)
        print("  model: d_model %d, %d layers, %d heads (D = %d) in %d groups, ffn %d, segments %s,"
              " rates %s, xpos %s, tied %s; %d tensors" % (
                  cfg["d_model"], cfg["num_layers"], cfg["num_heads"],
                  cfg["d_model"] // cfg["num_heads"], len(segs), cfg["ffn_dim"], segs,
                  cfg["attention"]["dilation_rates"], cfg["rotary"]["xpos"], cfg["tie_embeddings"],
                  len(weights)))
        t_cpu = torch.tensor(tokens)

        def logits(dtype, device, **variant):
            model = build_model(torch, mhda_cls, cfg, dtype, device, **variant)
            load_weights(torch, model, cfg, weights, dtype)
            model.to(device)
            with torch.no_grad():
                return model(t_cpu.to(device)).to(torch.float64).cpu().numpy()

        started = time.time()
        ref64 = logits(torch.float64, "cpu")
        ref32 = logits(torch.float32, "cpu")
        print("  PyTorch fp64 and fp32 on the CPU: %.1f s" % (time.time() - started))
        group_sizes, head_ranges = build_model(torch, mhda_cls, cfg, torch.float32, "cpu") \
            .blocks[0].attn.attention._get_head_groups(cfg["num_heads"])
        print("  the seed's head groups: %s (sizes %s), offsets %s" % (
            head_ranges, group_sizes,
            [i % r for i, r in enumerate(cfg["attention"]["dilation_rates"])]))

        def agree(a, b):
            return float(np.mean(a.argmax(-1) == b.argmax(-1)))

        check(name, "ours CPU fp32 vs PyTorch fp32 (CPU)", rel_error(ours_cpu, ref32), TOL_FP32,
              agree(ours_cpu, ref32))
        check(name, "ours CPU fp32 vs PyTorch fp64 (CPU)", rel_error(ours_cpu, ref64), TOL_FP32,
              agree(ours_cpu, ref64))
        check(name, "PyTorch fp32 vs PyTorch fp64 (CPU)", rel_error(ref32, ref64), None,
              agree(ref32, ref64))
        if gpu:
            check(name, "ours GPU bf16 vs PyTorch fp64 (CPU)", rel_error(ours_gpu, ref64),
                  TOL_BF16, agree(ours_gpu, ref64))
            ref_bf16 = logits(torch.bfloat16, "cuda")
            check(name, "PyTorch bf16 (GPU, seed layers) vs PyTorch fp64", rel_error(ref_bf16, ref64),
                  None, agree(ref_bf16, ref64))
        for label, variant in (("no rotary", {"rotary": False}),
                               ("not causal", {"causal": False})):
            diff = rel_error(logits(torch.float64, "cpu", **variant), ref64)
            rows.append((name, "variant %s vs PyTorch fp64 (must differ)" % label, diff,
                         VARIANT_MIN, None, diff > VARIANT_MIN))
            if not diff > VARIANT_MIN:
                failures.append("%s: variant %s differs by only %.3e: the check cannot see it"
                                % (name, label, diff))
        loss = float(np.mean(
            np.log(np.exp(ref64[:, :-1] - ref64[:, :-1].max(-1, keepdims=True)).sum(-1))
            + ref64[:, :-1].max(-1)
            - np.take_along_axis(ref64[:, :-1], tokens[:, 1:, None], -1)[..., 0]))
        print("  PyTorch fp64 loss on the window: %.4f nats (%.3f bits/byte)" % (
            loss, loss / math.log(2)))

    print()
    print("| case | comparison | relative error | bound | argmax agreement | result |")
    print("|---|---|---|---|---|---|")
    for case, what, err, bound, agreement, ok in rows:
        print("| %s | %s | %.2e | %s | %s | %s |" % (
            case, what, err, "-" if bound is None else ("> %g" % bound if "variant" in what
                                                        else "%g" % bound),
            "-" if agreement is None else "%.4f" % agreement, "PASS" if ok else "FAIL"))
    for f in failures:
        print("FAILED: " + f)
    print("seed parity: %s" % ("PASSED" if not failures else "FAILED"))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
