#!/usr/bin/env python3
"""PyTorch reference for the LongNet model benchmark (issue 15), on the GPU machine.

The same model as bench/model_bench (the LongNet base shape: d = 768, 12 layers, 12 heads, FFN
3072, byte vocabulary; segments 2048..32768 with rates 1, 2, 4, 6, 12; causal), built from the seed
library's layers: its MultiheadDilatedAttention over its standard DilatedAttention (not the
Improved* classes), in blocks of x + attn(LN(x)); x + fc2(subLN(GELU(fc1(LN(x))))), a final
LayerNorm and a head tied to the embedding. Weights in bf16 (the seed's q/k LayerNorm fails
under autocast), the loss in fp32, torch.optim.AdamW (fused) on the bf16 weights. Differences
from our model, which the seed's layers impose: the seed's attention has no rotary positions and
puts a LayerNorm on q and k (reusing q's as the sub-LayerNorm before out_proj); FLOPs are the same
up to O(M d) terms.

One training step (zero_grad, forward with the loss, backward, optimizer step), eager and with
torch.compile, at each length: median of CUDA-event timings after warm-up; tokens/s; MFU by the
same count as model::CountFlops (forward + backward FLOPs over the step time over 989 TFLOP/s);
peak memory (torch.cuda.max_memory_allocated over the steps). Out of memory is reported as such.

With --forward-only (issue 18's prefill reference): the forward pass with the loss, under
torch.inference_mode, instead of the training step; "dattn" beside it is model_bench's one-GPU
prefill row ("prefill S=1" in its --csv).

Usage: python3 bench/model_bench/torch_reference.py SEED_LIB_PATH [--n 32768,262144]
           [--steps 5] [--ours bench.csv] [--no-compile] [--forward-only]
SEED_LIB_PATH is the folder holding the dilated_attention_pytorch package; it is not part of this
repository. --ours reads model_bench's --csv output and prints our tokens/s beside PyTorch's, with
ratios.
"""

import argparse
import csv
import math
import os
import sys
import time
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

D_MODEL, LAYERS, HEADS, FFN, VOCAB = 768, 12, 12, 3072, 256
SEGMENTS = [2048, 4096, 8192, 16384, 32768]
RATES = [1, 2, 4, 6, 12]
PEAK = 989e12


def count_flops(n, batch=1, forward_only=False):
    """model::CountFlops(config, batch, n, false): forward + backward (or .forward alone)."""
    m = batch * n
    d, f = D_MODEL, FFN
    linear = 2.0 * m * (4 * d * d + 2 * d * f)
    attention = 0.0
    groups = len(SEGMENTS)
    base, extra = divmod(HEADS, groups)
    head_dim = D_MODEL // HEADS
    for i, (w, r) in enumerate(zip(SEGMENTS, RATES)):
        heads = base + (1 if i < extra else 0)
        attention += 4.0 * batch * heads * n * head_dim * min(w, n) / (r * r)
    attention /= 2  # causal
    head = 2.0 * m * d * VOCAB
    forward = LAYERS * (linear + attention) + head
    backward = LAYERS * (2 * linear + 2.5 * attention) + 2 * head
    return forward if forward_only else forward + backward


class Block(nn.Module):
    def __init__(self, mhda_cls, dtype):
        super().__init__()
        kw = {"device": "cuda", "dtype": dtype}
        self.attn_norm = nn.LayerNorm(D_MODEL, **kw)
        self.attn = mhda_cls(
            embed_dim=D_MODEL,
            num_heads=HEADS,
            dilation_rates=RATES,
            segment_lengths=SEGMENTS,
            dropout=0.0,
            bias=True,
            layer_norm=True,
            gamma_init=math.sqrt(math.log(2 * LAYERS)),
            device="cuda",
            dtype=dtype,
        )
        self.ffn_norm = nn.LayerNorm(D_MODEL, **kw)
        self.fc1 = nn.Linear(D_MODEL, FFN, **kw)
        self.ffn_sub_norm = nn.LayerNorm(FFN, **kw)
        self.fc2 = nn.Linear(FFN, D_MODEL, **kw)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x), is_causal=True)
        return x + self.fc2(self.ffn_sub_norm(F.gelu(self.fc1(self.ffn_norm(x)))))


class LongNetLM(nn.Module):
    def __init__(self, mhda_cls, dtype):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, D_MODEL, device="cuda", dtype=dtype)
        self.blocks = nn.ModuleList([Block(mhda_cls, dtype) for _ in range(LAYERS)])
        self.final_norm = nn.LayerNorm(D_MODEL, device="cuda", dtype=dtype)
        # As our model's MAGNETO init: tied logits of a normalised state start at about unit scale.
        nn.init.normal_(self.embedding.weight, std=D_MODEL ** -0.5)

    def forward(self, tokens, targets):
        x = self.embedding(tokens)
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.final_norm(x), self.embedding.weight)
        return F.cross_entropy(logits.float().view(-1, VOCAB), targets.view(-1))


def time_calls(call, steps):
    """Two warm-up calls, then the median of `steps` CUDA-event timings: (ms, warm-up seconds,
    the last call's result)."""
    started = time.time()
    for _ in range(2):
        result = call()
    torch.cuda.synchronize()
    warm_s = time.time() - started
    times = []
    for _ in range(steps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        result = call()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2], warm_s, result


def run_forward(mhda_cls, n, steps, compiled):
    """The forward pass with the loss, no autograd: a prefill that scores every token."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = LongNetLM(mhda_cls, torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(1)
    tokens = torch.randint(0, VOCAB, (1, n + 1), device="cuda", generator=gen)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    forward = torch.compile(model) if compiled else model
    with torch.inference_mode():
        ms, warm_s, loss = time_calls(lambda: forward(inputs, targets), steps)
    peak = torch.cuda.max_memory_allocated()
    del model, forward
    return {"ms": ms, "tokens_per_s": n / (ms * 1e-3),
            "mfu": count_flops(n, forward_only=True) / (ms * 1e-3) / PEAK,
            "peak": peak, "warm_s": warm_s, "loss": float(loss)}


def run(mhda_cls, n, steps, compiled):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = LongNetLM(mhda_cls, torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    gen = torch.Generator(device="cuda").manual_seed(1)
    tokens = torch.randint(0, VOCAB, (1, n + 1), device="cuda", generator=gen)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    forward = torch.compile(model) if compiled else model

    def step():
        opt.zero_grad(set_to_none=True)
        loss = forward(inputs, targets)
        loss.backward()
        opt.step()
        return loss

    ms, warm_s, loss = time_calls(step, steps)
    peak = torch.cuda.max_memory_allocated()
    del model, opt, forward
    return {"ms": ms, "tokens_per_s": n / (ms * 1e-3), "mfu": count_flops(n) / (ms * 1e-3) / PEAK,
            "peak": peak, "warm_s": warm_s, "loss": float(loss)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("seed_lib", help="folder holding the dilated_attention_pytorch package")
    p.add_argument("--n", default="32768,262144")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--ours", default="", help="model_bench --csv output")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--forward-only", action="store_true")
    args = p.parse_args()
    ours_name = "prefill S=1" if args.forward_only else None
    # The package's __init__ imports every variant it ships, some of which need torchscale,
    # DeepSpeed or FairScale; only the two modules used here are loaded, under a bare package.
    package_dir = os.path.join(os.path.abspath(args.seed_lib), "dilated_attention_pytorch")
    package = types.ModuleType("dilated_attention_pytorch")
    package.__path__ = [package_dir]
    sys.modules["dilated_attention_pytorch"] = package
    from dilated_attention_pytorch.multihead_dilated_attention import MultiheadDilatedAttention

    lengths = [int(x) for x in args.n.split(",")]
    ours = {}
    if args.ours and os.path.exists(args.ours):
        with open(args.ours) as f:
            for row in csv.DictReader(f):
                wanted = ours_name or "N=%s" % row["n"]
                if row["name"] == wanted and float(row["tokens_per_s"] or 0) > 0:
                    ours[int(row["n"])] = row
    name = torch.cuda.get_device_name(0)
    print("torch_reference: %s, torch %s" % (name, torch.__version__), flush=True)
    results = []
    for n in lengths:
        for compiled in ([False] if args.no_compile else [False, True]):
            variant = "torch.compile" if compiled else "eager"
            try:
                r = (run_forward if args.forward_only else run)(MultiheadDilatedAttention, n,
                                                                 args.steps, compiled)
                print("torch %s N=%d: %.2f ms/step, %.0f tokens/s, MFU %.1f%%, peak %.0f MiB "
                      "(warm-up %.0f s), loss %.3f" % (variant, n, r["ms"], r["tokens_per_s"],
                                                       100 * r["mfu"], r["peak"] / 2**20,
                                                       r["warm_s"], r["loss"]), flush=True)
            except torch.cuda.OutOfMemoryError as e:
                r = {"error": "out of memory (%s)" % str(e).split("\n")[0][:120]}
                print("torch %s N=%d: %s" % (variant, n, r["error"]), flush=True)
            except Exception as e:  # noqa: BLE001  a compile failure is a result too
                r = {"error": "%s: %s" % (type(e).__name__, str(e).split("\n")[0][:160])}
                print("torch %s N=%d: %s" % (variant, n, r["error"]), flush=True)
            torch.cuda.empty_cache()
            results.append((n, variant, r))
    print()
    print("| model (%s) | N | ms/step | tokens/s | MFU | peak memory | dattn tokens/s over this |"
          % name)
    print("|---|---|---|---|---|---|---|")
    for n in lengths:
        if n in ours:
            o = ours[n]
            print("| dattn (model_bench) | %d | %.2f | %.0f | %.1f%% | %.0f MiB | 1.00 |"
                  % (n, float(o["step_ms"]), float(o["tokens_per_s"]), 100 * float(o["mfu"]),
                     int(o["measured_bytes"]) / 2**20))
        for rn, variant, r in results:
            if rn != n:
                continue
            if "error" in r:
                print("| PyTorch %s | %d | %s | | | | |" % (variant, n, r["error"]))
                continue
            ratio = ("%.2f" % (float(ours[n]["tokens_per_s"]) / r["tokens_per_s"])) if n in ours \
                else "-"
            print("| PyTorch %s | %d | %.2f | %.0f | %.1f%% | %.0f MiB | %s |"
                  % (variant, n, r["ms"], r["tokens_per_s"], 100 * r["mfu"], r["peak"] / 2**20,
                     ratio))


if __name__ == "__main__":
    main()
