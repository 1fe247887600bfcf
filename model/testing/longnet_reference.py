#!/usr/bin/python3
"""An independent float64 numpy implementation of the LongNet language model (docs/MODEL.md).

    longnet_reference.py DIR [DIR ...]

Each DIR holds one run of the C++ model written by numpy_parity_dump (config.json, layout.json,
params.f64, tokens.i32, targets.i32, logits.f64, run.json). For each, this script computes the
logits and the loss from the architecture's definition and the same weights, and compares:
||logits - ref|| / ||ref|| and |loss - ref| / ref must be <= 1e-10. As a check that the comparison
can fail, it also computes variants that change one feature the run uses (XPOS off when it is on,
the other attention mode, the head's weight) and requires each to differ from the C++ logits by
more than 1e-6. Exit status 0 when every check passes, 1 otherwise (and when numpy is missing).

Written from the definitions, not from the C++ code:
  - dilated attention as the engine's contract defines it: grouped mode (heads split into
    contiguous groups, group i uses pattern i with offset i mod r_i, outputs divided by the number
    of patterns) and mixture mode (every head computes every pattern, offset h mod r_i or, with
    blocked head offsets, h // ceil(H / r_i); patterns combined with weights exp(lse_i) / sum);
    causal inside each dilated segment; partial last segments are shorter segments;
  - rotary positions on interleaved channel pairs (2j, 2j+1) at absolute positions 0..N-1, angle
    p * theta^(-2j/D); XPOS multiplies q by zeta_j^(p / scale_base) and k by zeta_j^(-p / scale_base),
    zeta_j = (2j + 0.4 D) / (1.4 D), applied naively (fine at the few positions of a test);
  - LayerNorm with biased variance; GELU in its erf form, x/2 (1 + erf(x / sqrt 2));
  - y = x W^T + b for every linear layer; the LM head is the token embedding when tied, no bias;
  - the loss is the mean over targets != -1 of logsumexp(logits) - logits[target].
"""

import json
import math
import os
import sys

try:
    import numpy as np
except ImportError:
    sys.stderr.write(
        "longnet_reference.py: FAILED: numpy is not installed for %s "
        "(Debian package python3-numpy; scripts/setup.sh installs it)\n" % sys.executable)
    sys.exit(1)

TOLERANCE = 1e-10
VARIANT_MIN_DIFFERENCE = 1e-6

_erf = np.vectorize(math.erf, otypes=[np.float64])


def layer_norm(x, gain, shift, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gain + shift


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def linear(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


def rotary(x, positions, theta, xpos, scale_base, sign):
    """x: (B, N, H, D). sign = +1 for q, -1 for k (the XPOS exponent's sign)."""
    d = x.shape[-1]
    j = np.arange(d // 2, dtype=np.float64)
    freq = theta ** (-2.0 * j / d)
    angle = positions[:, None] * freq[None, :]  # (N, D/2)
    cos = np.cos(angle)[None, :, None, :]
    sin = np.sin(angle)[None, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    y0 = x0 * cos - x1 * sin
    y1 = x1 * cos + x0 * sin
    if xpos:
        zeta = (2.0 * j + 0.4 * d) / (1.4 * d)
        scale = (zeta[None, :] ** (sign * positions[:, None] / scale_base))[None, :, None, :]
        y0, y1 = y0 * scale, y1 * scale
    y = np.empty_like(x)
    y[..., 0::2], y[..., 1::2] = y0, y1
    return y


def softmax_attention(q, k, v, scale):
    """q, k, v: (B, n, D) selected rows of one segment and head. Causal in row order.
    Returns the output (B, n, D) and the log-sum-exp (B, n)."""
    s = np.einsum("bid,bjd->bij", q, k) * scale
    n = q.shape[1]
    s = np.where(np.tril(np.ones((n, n), dtype=bool))[None], s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    lse = mx[..., 0] + np.log(np.exp(s - mx).sum(axis=-1))
    p = np.exp(s - lse[..., None])
    return p @ v, lse


def segments(n, w):
    for start in range(0, n, w):
        yield start, min(start + w, n)


def dilated_attention(q, k, v, seg_lengths, rates, mode, head_offsets):
    b, n, h, d = q.shape
    scale = 1.0 / math.sqrt(d)
    g = len(seg_lengths)
    if mode == "grouped":
        out = np.zeros_like(q)
        base, extra = divmod(h, g)
        for i, (w, r) in enumerate(zip(seg_lengths, rates)):
            h0 = i * base + min(i, extra)
            h1 = h0 + base + (1 if i < extra else 0)
            offset = i % r
            for s0, s1 in segments(n, w):
                sel = np.arange(s0 + offset, s1, r)
                if sel.size == 0:
                    continue
                for head in range(h0, h1):
                    a, _ = softmax_attention(q[:, sel, head], k[:, sel, head], v[:, sel, head],
                                             scale)
                    out[:, sel, head] = a / g
        return out
    # Mixture: each pattern's rows and log-sum-exps, then the lse-weighted combination.
    outs = np.zeros((g, b, n, h, d))
    lses = np.full((g, b, n, h), -np.inf)
    for i, (w, r) in enumerate(zip(seg_lengths, rates)):
        for head in range(h):
            if head_offsets == "blocked":
                offset = head // (-(-h // r))
            else:
                offset = head % r
            for s0, s1 in segments(n, w):
                sel = np.arange(s0 + offset, s1, r)
                if sel.size == 0:
                    continue
                a, lse = softmax_attention(q[:, sel, head], k[:, sel, head], v[:, sel, head], scale)
                outs[i][:, sel, head] = a
                lses[i][:, sel, head] = lse
    top = lses.max(axis=0)
    safe_top = np.where(np.isfinite(top), top, 0.0)
    weights = np.where(np.isfinite(lses), np.exp(lses - safe_top[None]), 0.0)
    total = weights.sum(axis=0)
    combined = (weights[..., None] * outs).sum(axis=0)
    return np.where(total[..., None] > 0, combined / np.where(total > 0, total, 1.0)[..., None],
                    0.0)


def model_logits(cfg, p, tokens):
    bsz, n = tokens.shape
    d = cfg["d_model"]
    h = cfg["num_heads"]
    eps = cfg["layer_norm_eps"]
    att = cfg["attention"]
    rot = cfg["rotary"]
    positions = np.arange(n, dtype=np.float64)
    x = p["token_embedding.weight"][tokens]  # (B, N, d)
    for i in range(cfg["num_layers"]):
        pre = "blocks.%d." % i

        def w(name):
            return p[pre + name]

        y = layer_norm(x, w("attn_norm.weight"), w("attn_norm.bias"), eps)
        q = linear(y, w("attn.q_proj.weight"), w("attn.q_proj.bias")).reshape(bsz, n, h, d // h)
        k = linear(y, w("attn.k_proj.weight"), w("attn.k_proj.bias")).reshape(bsz, n, h, d // h)
        v = linear(y, w("attn.v_proj.weight"), w("attn.v_proj.bias")).reshape(bsz, n, h, d // h)
        q = rotary(q, positions, rot["theta"], rot["xpos"], rot["xpos_scale_base"], +1.0)
        k = rotary(k, positions, rot["theta"], rot["xpos"], rot["xpos_scale_base"], -1.0)
        a = dilated_attention(q, k, v, att["segment_lengths"], att["dilation_rates"], att["mode"],
                              att["head_offsets"]).reshape(bsz, n, d)
        a = layer_norm(a, w("attn.sub_norm.weight"), w("attn.sub_norm.bias"), eps)
        x = x + linear(a, w("attn.out_proj.weight"), w("attn.out_proj.bias"))
        y = layer_norm(x, w("ffn_norm.weight"), w("ffn_norm.bias"), eps)
        y = gelu(linear(y, w("ffn.fc1.weight"), w("ffn.fc1.bias")))
        y = layer_norm(y, w("ffn.sub_norm.weight"), w("ffn.sub_norm.bias"), eps)
        x = x + linear(y, w("ffn.fc2.weight"), w("ffn.fc2.bias"))
    x = layer_norm(x, p["final_norm.weight"], p["final_norm.bias"], eps)
    head = p["token_embedding.weight"] if cfg["tie_embeddings"] else p["lm_head.weight"]
    return linear(x, head)


def mean_loss(logits, targets):
    mx = logits.max(axis=-1, keepdims=True)
    lse = mx[..., 0] + np.log(np.exp(logits - mx).sum(axis=-1))
    mask = targets != -1
    safe = np.where(mask, targets, 0)
    picked = np.take_along_axis(logits, safe[..., None], axis=-1)[..., 0]
    count = int(mask.sum())
    return float(((lse - picked) * mask).sum() / count) if count else 0.0, count


def relative_error(x, ref):
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def check(run_dir):
    def path(name):
        return os.path.join(run_dir, name)

    with open(path("config.json")) as f:
        cfg = json.load(f)
    with open(path("layout.json")) as f:
        layout = json.load(f)
    with open(path("run.json")) as f:
        cpp_loss = json.load(f)
    flat = np.fromfile(path("params.f64"), dtype="<f8")
    params = {}
    for e in layout:
        count = int(np.prod(e["shape"]))
        params[e["name"]] = flat[e["offset"]:e["offset"] + count].reshape(e["shape"])
    v = cfg["vocab_size"]
    tokens = np.fromfile(path("tokens.i32"), dtype="<i4")
    targets = np.fromfile(path("targets.i32"), dtype="<i4")
    cpp_logits = np.fromfile(path("logits.f64"), dtype="<f8")
    batch, seq = cpp_loss["batch"], cpp_loss["seq_len"]
    tokens = tokens.reshape(batch, seq)
    targets = targets.reshape(batch, seq)
    cpp_logits = cpp_logits.reshape(batch, seq, v)

    failures = []
    ref = model_logits(cfg, params, tokens)
    logit_err = relative_error(cpp_logits, ref)
    ref_loss, count = mean_loss(ref, targets)
    loss_err = abs(cpp_loss["loss"] - ref_loss) / abs(ref_loss)
    name = os.path.basename(run_dir.rstrip("/"))
    print("%s: logits relative error %.3e, loss %.17g vs reference %.17g (relative %.3e), "
          "%d targets" % (name, logit_err, cpp_loss["loss"], ref_loss, loss_err, count))
    if not np.all(np.isfinite(cpp_logits)):
        failures.append("C++ logits hold %d non-finite values" % int((~np.isfinite(cpp_logits)).sum()))
    if not logit_err <= TOLERANCE:
        failures.append("logits differ: relative error %.3e > %g" % (logit_err, TOLERANCE))
    if not loss_err <= TOLERANCE:
        failures.append("loss differs: relative error %.3e > %g" % (loss_err, TOLERANCE))
    if count != cpp_loss["num_targets"]:
        failures.append("targets counted: C++ %d, reference %d" % (cpp_loss["num_targets"], count))

    # Variants: each must move the logits well beyond the tolerance, or the check above could not
    # have caught a model that ignored that feature.
    variants = []
    other_mode = dict(cfg, attention=dict(cfg["attention"]))
    other_mode["attention"]["mode"] = "grouped" if cfg["attention"]["mode"] == "mixture" else "mixture"
    other_mode["attention"]["head_offsets"] = "modulo"
    variants.append(("attention mode %s" % other_mode["attention"]["mode"], other_mode))
    if cfg["rotary"]["xpos"]:
        no_xpos = dict(cfg, rotary=dict(cfg["rotary"], xpos=False))
        variants.append(("XPOS off", no_xpos))
    if cfg["attention"]["head_offsets"] == "blocked":
        modulo = dict(cfg, attention=dict(cfg["attention"], head_offsets="modulo"))
        variants.append(("head offsets modulo", modulo))
    if not cfg["tie_embeddings"]:
        tied = dict(cfg, tie_embeddings=True)
        variants.append(("head tied", tied))
    no_rope = dict(cfg, rotary=dict(cfg["rotary"], theta=1e300))
    variants.append(("rotary theta 1e300", no_rope))  # Only pair 0 still rotates.
    for label, variant in variants:
        diff = relative_error(cpp_logits, model_logits(variant, params, tokens))
        print("  variant %-22s differs by %.3e" % (label, diff))
        if not diff > VARIANT_MIN_DIFFERENCE:
            failures.append("variant '%s' differs by only %.3e: the check cannot see it"
                            % (label, diff))
    for f in failures:
        print("  FAILED: " + f)
    return not failures


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 1
    ok = True
    for run_dir in argv[1:]:
        ok = check(run_dir) and ok
    print("numpy parity: %s" % ("PASSED" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
