"""The model's files from Python with numpy alone (no `safetensors` package needed):

  read_safetensors(path) -> {name: numpy array}, from the published format (8-byte little-endian
      header length, a JSON header of {name: {dtype, shape, data_offsets}} and "__metadata__",
      then the data section), as model/safetensors.h writes it: what a checkpoint's
      weights.safetensors and dump_logits --save-weights hold;
  write_token_file(path, ids, vocab_size), read_token_file(path): docs/TRAINING_DATA.md's token
      files (a 64-byte header "DATTNTOK", version 1, vocabulary, SHA-256 of the uint16 ids).

Used by model/tools/dump_logits_test.sh (CPU) and model/testing/seed_parity.py (the GPU machine,
where the `safetensors` package may be missing). Errors raise ValueError naming the file.
"""

import hashlib
import json
import struct

import numpy as np

_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}


def read_safetensors(path):
    """Every tensor of a safetensors file as a numpy array (BF16 is widened to float32)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("%s: shorter than the 8-byte header length" % path)
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError("%s: header of %d bytes runs past the end (%d bytes)" % (path, n, len(data)))
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = memoryview(data)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        shape = tuple(int(d) for d in info["shape"])
        dtype = info["dtype"]
        if dtype == "BF16":
            raw = np.frombuffer(body[begin:end], dtype="<u2").astype(np.uint32) << 16
            array = raw.view(np.float32)
        elif dtype in _DTYPES:
            array = np.frombuffer(body[begin:end], dtype=_DTYPES[dtype])
        else:
            raise ValueError("%s: tensor %s has dtype %s this reader does not know"
                             % (path, name, dtype))
        count = int(np.prod(shape)) if shape else 1
        if array.size != count:
            raise ValueError("%s: tensor %s holds %d values for shape %s"
                             % (path, name, array.size, list(shape)))
        out[name] = array.reshape(shape).copy()
    return out


def write_token_file(path, ids, vocab_size):
    """docs/TRAINING_DATA.md's writer: uint16 ids after a 64-byte header."""
    tokens = np.asarray(ids, dtype="<u2")
    data = tokens.tobytes()
    header = (b"DATTNTOK" + struct.pack("<IIIIQ", 1, 64, vocab_size, 2, len(tokens)) +
              hashlib.sha256(data).digest())
    with open(path, "wb") as f:
        f.write(header + data)


def read_token_file(path):
    """The ids of a token file (checked: magic, version, size, checksum) as int64."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"DATTNTOK":
        raise ValueError("%s: not a token file" % path)
    version, header_bytes, _, token_bytes, count = struct.unpack("<IIIIQ", data[8:32])
    if version != 1 or header_bytes != 64 or token_bytes != 2:
        raise ValueError("%s: version %d, header %d, token bytes %d" % (path, version,
                                                                       header_bytes, token_bytes))
    body = data[64:]
    if len(body) != 2 * count or hashlib.sha256(body).digest() != data[32:64]:
        raise ValueError("%s: truncated or damaged" % path)
    return np.frombuffer(body, dtype="<u2").astype(np.int64)
