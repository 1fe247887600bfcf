"""A float64 numpy reference of the engine's function (docs/ENGINE.md), forward and backward, for the
Python client's tests: grouped and mixture modes, causal or not, any scale, both head-offset rules.

Each head's attention is written as softmax attention over a matrix of key multiplicities: C[p, j]
counts the patterns (of those the head uses) whose selected rows of one segment hold both p and j,
with j visible from p (j <= p when causal). Mixture mode is exactly that (softmax attention over the
union of the patterns' key sets, a key two patterns share counting twice); grouped mode is it for
the one pattern of the head's group, times 1/G at the rows that pattern selects, and 0 elsewhere.
Rows that see no key are 0, and so are their gradients.
"""

import math

import numpy as np


def _segments(n, w):
    for start in range(0, n, w):
        yield start, min(start + w, n)


def _head_patterns(h, num_heads, segment_lengths, dilation_rates, mode, head_offsets):
    """(w, r, offset) of each pattern head h uses, and the factor of its selected rows."""
    g = len(segment_lengths)
    if mode == "grouped":
        base, extra = divmod(num_heads, g)
        h0 = 0
        for i in range(g):
            size = base + (1 if i < extra else 0)
            if h0 <= h < h0 + size:
                r = dilation_rates[i]
                return [(segment_lengths[i], r, i % r)], 1.0 / g
            h0 += size
        raise ValueError(f"head {h} in no group")
    patterns = []
    for w, r in zip(segment_lengths, dilation_rates):
        if head_offsets == "blocked":
            offset = h // -(-num_heads // r)
        else:
            offset = h % r
        patterns.append((w, r, offset))
    return patterns, 1.0


def _counts(n, patterns, causal):
    c = np.zeros((n, n))
    rows = np.zeros(n, dtype=bool)
    for w, r, offset in patterns:
        for s0, s1 in _segments(n, w):
            sel = np.arange(s0 + offset, s1, r)
            if sel.size == 0:
                continue
            rows[sel] = True
            visible = np.tril(np.ones((sel.size, sel.size))) if causal else np.ones(
                (sel.size, sel.size))
            c[np.ix_(sel, sel)] += visible
    return c, rows


def attention(q, k, v, segment_lengths, dilation_rates, *, causal=False, mode="grouped",
              head_offsets="modulo", scale=None, dout=None):
    """out, or (out, dq, dk, dv) when dout is given; every array (B, N, H, D), float64."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, n, num_heads, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = np.zeros_like(q)
    grads = [np.zeros_like(q) for _ in range(3)] if dout is not None else None
    for h in range(num_heads):
        patterns, factor = _head_patterns(h, num_heads, segment_lengths, dilation_rates, mode,
                                          head_offsets)
        c, rows = _counts(n, patterns, causal)
        f = np.where(rows, factor, 0.0)[None, :, None]  # (1, N, 1)
        qh, kh, vh = q[:, :, h], k[:, :, h], v[:, :, h]  # (B, N, D)
        s = np.einsum("bpd,bjd->bpj", qh, kh) * scale
        s = np.where(c[None] > 0, s, -np.inf)
        top = s.max(axis=-1, keepdims=True)
        top = np.where(np.isfinite(top), top, 0.0)
        e = c[None] * np.exp(s - top)
        z = e.sum(axis=-1, keepdims=True)
        p = e / np.where(z > 0, z, 1.0)
        out[:, :, h] = f * (p @ vh)
        if dout is not None:
            da = f * np.asarray(dout, np.float64)[:, :, h]
            dp = da @ vh.transpose(0, 2, 1)
            ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
            grads[0][:, :, h] = scale * ds @ kh
            grads[1][:, :, h] = scale * ds.transpose(0, 2, 1) @ qh
            grads[2][:, :, h] = p.transpose(0, 2, 1) @ da
    if dout is None:
        return out
    return (out, *grads)
