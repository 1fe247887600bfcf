#!/usr/bin/python3
"""Checks a dump_logits .npy against model/testing/longnet_reference.py (float64 numpy, written
from docs/MODEL.md), on the weights the dump used:

    dump_logits_check.py WEIGHTS_DIR LOGITS.npy DATA BEGIN BATCH SEQ_LEN

WEIGHTS_DIR holds weights.safetensors and config.json (a checkpoint step folder, or what
dump_logits --save-weights wrote); the tokens are bytes [BEGIN, BEGIN + BATCH x SEQ_LEN) of the
text file DATA, row by row. The CPU dump (fp32) must be within 1e-5 relative (Frobenius) of the
reference (the fp32 model measures about 3e-7); shape, dtype and finiteness are checked first.
Exit status 0 when it holds, 1 otherwise.
"""

import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testing"))
import longnet_reference  # noqa: E402
import weights_io  # noqa: E402

TOLERANCE = 1e-5


def main(argv):
    if len(argv) != 7:
        sys.stderr.write(__doc__)
        return 1
    weights_dir, npy, data, begin, batch, seq_len = argv[1:]
    begin, batch, seq_len = int(begin), int(batch), int(seq_len)
    with open(os.path.join(weights_dir, "config.json")) as f:
        cfg = json.load(f)
    params = {k: v.astype(np.float64)
              for k, v in weights_io.read_safetensors(
                  os.path.join(weights_dir, "weights.safetensors")).items()}
    with open(data, "rb") as f:
        f.seek(begin)
        tokens = np.frombuffer(f.read(batch * seq_len), dtype=np.uint8).astype(np.int64)
    tokens = tokens.reshape(batch, seq_len)
    ours = np.load(npy)
    want = (batch, seq_len, cfg["vocab_size"])
    if ours.dtype != np.float32 or ours.shape != want:
        print("FAILED: %s is %s %s, want float32 %s" % (npy, ours.dtype, ours.shape, want))
        return 1
    if not np.all(np.isfinite(ours)):
        print("FAILED: %s holds non-finite values" % npy)
        return 1
    ref = longnet_reference.model_logits(cfg, params, tokens)
    err = float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))
    print("%s: logits relative error %.3e against the float64 reference (bound %g)"
          % (os.path.basename(npy), err, TOLERANCE))
    return 0 if err <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
