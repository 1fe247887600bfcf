#!/usr/bin/env python3
"""PyTorch reference timings for the CUDA engine benchmark (issue 4), on the GPU machine.

Two references per row, timed in the same run as bench/cuda_bench (scripts/gpu-check.sh):
  floor: cuDNN fused attention (PyTorch SDPA restricted to the cuDNN backend) on the same blocks as
         dattn computes, already gathered into contiguous [segments, heads, rows, D] tensors;
  torch: a plain PyTorch grouped-mode implementation: gather each group's dilated rows into
         contiguous tensors, SDPA (default dispatch), scatter / G into a zero output.
Times are medians of CUDA-event timings of single calls after warm-up; memory is
torch.cuda.max_memory_allocated during the call minus what was allocated before it (the inputs,
outputs and gradients the caller holds).

Usage: python3 bench/cuda_reference.py [--quick] [--json PATH]
PyTorch is a reference here, never a dependency of the engine.
"""

import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SEGMENTS = [2048, 4096, 8192, 16384]
RATES = [1, 2, 4, 8]


def selected_count(length, offset, rate):
    return (length - offset + rate - 1) // rate if length > offset else 0


def group_heads(num_heads, num_groups, group):
    base, extra = divmod(num_heads, num_groups)
    begin = group * base + min(group, extra)
    return begin, begin + base + (1 if group < extra else 0)


def head_groups(mode, pattern, num_heads):
    """(offset, number of heads) per call, as engine/cuda/block_calls.cc cuts them."""
    r = RATES[pattern]
    if mode == "grouped":
        lo, hi = group_heads(num_heads, len(SEGMENTS), pattern)
        return [(pattern % r, hi - lo)]
    return [(o, (num_heads - o + r - 1) // r) for o in range(min(r, num_heads))]


def median_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def floor_ms(mode, n, heads, dim, causal, backward, iters):
    """cuDNN SDPA over contiguous copies of the blocks dattn attends."""
    blocks = []
    for i, w in enumerate(SEGMENTS):
        for offset, nh in head_groups(mode, i, heads):
            rows = selected_count(w, offset, RATES[i])
            segs = n // w
            # requires_grad: SDPA then computes the softmax statistics, as dattn must (its lse).
            make = lambda: torch.randn(segs, nh, rows, dim, device="cuda", dtype=torch.bfloat16,
                                       requires_grad=True)
            blocks.append((make(), make(), make(),
                           torch.randn(segs, nh, rows, dim, device="cuda", dtype=torch.bfloat16)))

    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for q, k, v, g in blocks:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                if backward:
                    torch.autograd.grad(o, (q, k, v), g)

    return median_ms(run, 3, iters)


def torch_grouped(q, k, v, causal):
    """Plain PyTorch grouped mode: gather, SDPA, scatter (N a multiple of every segment)."""
    b, n, h, d = q.shape
    g = len(SEGMENTS)
    out = torch.zeros_like(q)
    for i, (w, r) in enumerate(zip(SEGMENTS, RATES)):
        lo, hi = group_heads(h, g, i)
        o = i % r
        segs = n // w

        def gather(x):
            x = x[:, :, lo:hi].reshape(b, segs, w, hi - lo, d)[:, :, o::r]
            return x.reshape(b * segs, -1, hi - lo, d).transpose(1, 2).contiguous()

        a = F.scaled_dot_product_attention(gather(q), gather(k), gather(v), is_causal=causal)
        rows = a.shape[2]
        a = a.transpose(1, 2).reshape(b, segs, rows, hi - lo, d)
        view = out.view(b, segs, w, h, d)
        view[:, :, o::r, lo:hi] = a / g
    return out


def torch_row(n, heads, dim, causal, backward, iters):
    shape = (1, n, heads, dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
               for _ in range(3))
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def run():
        out = torch_grouped(q, k, v, causal)
        if backward:
            torch.autograd.grad(out, (q, k, v), grad)
        return out

    ms = median_ms(run, 2, iters)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    return ms, extra


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name(0)}", flush=True)
    rows = []
    for heads, dim in [(16, 64), (8, 128)]:
        hd = f" H={heads} D={dim}"
        big, small = (1 << 16, 1 << 14) if args.quick else (1 << 20, 1 << 16)
        rows += [
            (f"grouped fwd N=2^{int(math.log2(big))}" + hd, "grouped", big, heads, dim, False, False, 20),
            (f"grouped fwd+bwd N=2^{int(math.log2(small))}" + hd, "grouped", small, heads, dim, True, False, 50),
            (f"mixture fwd N=2^{int(math.log2(big))}" + hd, "mixture", big, heads, dim, False, False, 10),
            (f"mixture fwd+bwd N=2^{int(math.log2(small))}" + hd, "mixture", small, heads, dim, True, False, 30),
            (f"grouped causal fwd N=2^{int(math.log2(big))}" + hd, "grouped", big, heads, dim, False, True, 20),
        ]
    results = []
    for name, mode, n, heads, dim, backward, causal, iters in rows:
        r = {"row": name}
        try:
            r["floor_ms"] = floor_ms(mode, n, heads, dim, causal, backward, iters)
        except Exception as e:  # noqa: BLE001 - reported in the table
            r["floor_error"] = str(e)[:200]
        torch.cuda.empty_cache()
        if mode == "grouped":
            try:
                r["torch_ms"], r["torch_extra_bytes"] = torch_row(n, heads, dim, causal, backward,
                                                                   max(5, iters // 2))
                r["one_input_bytes"] = n * heads * dim * 2
            except Exception as e:  # noqa: BLE001
                r["torch_error"] = str(e)[:200]
        torch.cuda.empty_cache()
        print(json.dumps(r), flush=True)
        results.append(r)
    print("\n== PyTorch references (same card, same run) ==")
    print("| row | torch SDPA-cuDNN floor ms | torch grouped (gather/SDPA/scatter) ms | "
          "torch extra memory MiB (x input) |")
    print("|---|---|---|---|")
    for r in results:
        floor = f"{r['floor_ms']:.3f}" if "floor_ms" in r else r.get("floor_error", "-")
        tms = f"{r['torch_ms']:.3f}" if "torch_ms" in r else r.get("torch_error", "-")
        mem = "-"
        if "torch_extra_bytes" in r:
            mem = (f"{r['torch_extra_bytes'] / 2**20:.0f} "
                   f"({r['torch_extra_bytes'] / r['one_input_bytes']:.2f}x)")
        print(f"| {r['row']} | {floor} | {tms} | {mem} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
