#!/usr/bin/python3
"""The Python side of //model:interop_test: an independent reading of dattn's file formats.

Written from the published safetensors format and from docs/TRAINING_DATA.md, with only the
standard library and numpy (Debian's python3-numpy; the `safetensors` package is not in Debian).
It reads what the C++ code wrote and checks every value, and writes files for the C++ code to read.

  interop_check.py check-safetensors PATH    a file written by `interop_fixture write-safetensors`
  interop_check.py write-safetensors PATH    a file for `interop_fixture read-safetensors`
  interop_check.py check-token-file PATH     a file written by `interop_fixture write-token-file`
  interop_check.py write-token-file PATH     a file for `interop_fixture read-token-file`
  interop_check.py check-checkpoint DIR      a folder written by `interop_fixture write-checkpoint`
  interop_check.py check-sharded-checkpoint DIR
                                             a sharded (version 2) folder written by
                                             `interop_fixture write-sharded-checkpoint`

Exit status 0 when every check passes; otherwise 1, with what differed on stderr.
"""

import hashlib
import json
import os
import struct
import sys

import numpy as np

MAX_HEADER = 100_000_000
DTYPES = {  # safetensors dtype -> numpy dtype (BF16 is read as raw uint16 and widened).
    "BOOL": np.dtype("?"), "U8": np.dtype("u1"), "I8": np.dtype("i1"),
    "I16": np.dtype("<i2"), "U16": np.dtype("<u2"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"), "I32": np.dtype("<i4"), "U32": np.dtype("<u4"),
    "F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
}


class CheckError(Exception):
    pass


def require(condition, message):
    if not condition:
        raise CheckError(message)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(values):
    # Exact for values representable in bf16 (the low 16 bits are zero).
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    require(np.all(bits & 0xFFFF == 0), "value not exact in bf16")
    return (bits >> 16).astype(np.uint16)


def read_safetensors(path):
    """Returns ({name: (dtype, numpy array)}, metadata), checking the format as the spec says."""
    with open(path, "rb") as f:
        data = f.read()
    require(len(data) >= 8, f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    require(n <= MAX_HEADER, f"{path}: header length {n} over the limit")
    require(8 + n <= len(data), f"{path}: header runs past the end")
    text = data[8:8 + n]
    require(text[:1] == b"{", f"{path}: header does not start with '{{'")

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        require(len(keys) == len(set(keys)), f"{path}: duplicate keys {keys}")
        return dict(pairs)

    header = json.loads(text.decode("utf-8"), object_pairs_hook=no_duplicates)
    metadata = header.pop("__metadata__", {})
    require(all(isinstance(v, str) for v in metadata.values()), f"{path}: metadata not strings")
    buffer = data[8 + n:]
    tensors = {}
    spans = []
    for name, info in header.items():
        dtype = DTYPES[info["dtype"]]
        shape = info["shape"]
        begin, end = info["data_offsets"]
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        require(end - begin == count * dtype.itemsize, f"{path}: {name}: size mismatch")
        array = np.frombuffer(buffer[begin:end], dtype=dtype).reshape(shape)
        tensors[name] = (info["dtype"], array)
        spans.append((begin, end, name))
    spans.sort()
    position = 0
    for begin, end, name in spans:
        require(begin == position, f"{path}: {name} starts at {begin}, expected {position}")
        position = end
    require(position == len(buffer), f"{path}: tensors cover {position} of {len(buffer)} bytes")
    return tensors, metadata


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, dtype, shape, bytes). The header lists them by name; the data goes in
    reverse order of the list, so a reader must use the offsets, not the header's order."""
    header = {"__metadata__": metadata}
    offsets = {}
    position = 0
    for name, dtype, shape, raw in reversed(tensors):
        offsets[name] = (position, position + len(raw))
        position += len(raw)
    for name, dtype, shape, raw in sorted(tensors):
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets[name])}
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, dtype, shape, raw in reversed(tensors):
            f.write(raw)


def expect_array(name, got, want):
    require(got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}")
    require(got.dtype == want.dtype, f"{name}: dtype {got.dtype}, expected {want.dtype}")
    require(np.array_equal(got, want), f"{name}: {got.tolist()} != {want.tolist()}")


def check_safetensors(path):
    tensors, metadata = read_safetensors(path)
    require(metadata == {"format": "pt", "note": "dattn"}, f"metadata {metadata}")
    want = {
        "f64": ("F64", np.array([1 / 3, -2.5, 1e300], dtype="<f8")),
        "f32": ("F32", (np.arange(6, dtype=np.float32) * np.float32(0.5) - np.float32(1))
                .reshape(2, 3)),
        "f16": ("F16", np.array([1.0, -2.5, 65504.0, 2.0 ** -24], dtype="<f2")),
        "bf16": ("BF16", np.array([[1.0, -0.5], [3.140625, -2.0 ** -100]], dtype=np.float32)),
        "i64": ("I64", np.array([-1, 2 ** 40], dtype="<i8")),
        "i32": ("I32", np.array([[-7, 2 ** 30]], dtype="<i4")),
        "u16": ("U16", np.array([0, 65535, 300], dtype="<u2")),
        "u8": ("U8", np.array([0, 255, 1], dtype="u1")),
        "scalar": ("F32", np.array(42.0, dtype="<f4")),
        "empty": ("F32", np.zeros((0, 3), dtype="<f4")),
    }
    require(sorted(tensors) == sorted(want), f"tensors {sorted(tensors)}")
    for name, (dtype, array) in want.items():
        got_dtype, got = tensors[name]
        require(got_dtype == dtype, f"{name}: dtype {got_dtype}, expected {dtype}")
        if dtype == "BF16":
            got = bf16_to_f32(got)
        expect_array(name, got, array)


def python_safetensors():
    return [
        ("weight", "F32", (3, 2), (np.arange(6, dtype="<f4") * 0.25 - 0.5).tobytes()),
        ("half", "F16", (2,), np.array([0.5, -65504.0], dtype="<f2").tobytes()),
        ("bf", "BF16", (2,), f32_to_bf16_bits([1.5, -3.0]).astype("<u2").tobytes()),
        ("ids", "I64", (3,), np.array([1, -2, 3], dtype="<i8").tobytes()),
    ]


def write_token_file(path, ids, vocab_size):
    # The writer docs/TRAINING_DATA.md gives, verbatim.
    tokens = np.asarray(ids, dtype="<u2")
    data = tokens.tobytes()
    header = (b"DATTNTOK" + struct.pack("<IIIIQ", 1, 64, vocab_size, 2, len(tokens)) +
              hashlib.sha256(data).digest())
    with open(path, "wb") as f:
        f.write(header + data)


def check_token_file(path):
    with open(path, "rb") as f:
        data = f.read()
    require(data[:8] == b"DATTNTOK", f"magic {data[:8]!r}")
    version, header_bytes, vocab, token_bytes, count = struct.unpack("<IIIIQ", data[8:32])
    require((version, header_bytes, vocab, token_bytes) == (1, 64, 50257, 2),
            f"header {(version, header_bytes, vocab, token_bytes)}")
    require(len(data) == 64 + 2 * count, f"size {len(data)} for {count} tokens")
    require(hashlib.sha256(data[64:]).digest() == data[32:64], "checksum")
    tokens = np.frombuffer(data[64:], dtype="<u2")
    want = (np.arange(1000, dtype=np.int64) * 7919 % 50257).astype(np.uint16)
    expect_array("tokens", tokens, want)


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def check_checkpoint(directory):
    with open(os.path.join(directory, "MANIFEST.json")) as f:
        manifest = json.load(f)
    recorded = manifest.pop("manifest_sha256")
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    require(hashlib.sha256(canonical.encode()).hexdigest() == recorded, "manifest self-checksum")
    require(manifest["format"] == "dattn-checkpoint" and manifest["version"] == 1, "manifest kind")
    require(manifest["step"] == 3, f"manifest step {manifest['step']}")
    listed = {f["name"]: f for f in manifest["files"]}
    require(sorted(listed) == ["config.json", "optimizer.safetensors", "trainer_state.json",
                               "weights.safetensors"], f"files {sorted(listed)}")
    for name, entry in listed.items():
        path = os.path.join(directory, name)
        require(os.path.getsize(path) == entry["bytes"], f"{name}: size")
        require(sha256_file(path) == entry["sha256"], f"{name}: sha256")

    layout = [("embed.weight", (8, 4)), ("blocks.0.ln.weight", (4,)), ("blocks.0.mlp.weight", (4, 6))]
    total = sum(int(np.prod(shape)) for _, shape in layout)
    flat = np.arange(total, dtype=np.float32) * np.float32(0.001) - np.float32(0.05)
    weights, metadata = read_safetensors(os.path.join(directory, "weights.safetensors"))
    require(metadata.get("format") == "pt", f"weights metadata {metadata}")
    require(sorted(weights) == sorted(name for name, _ in layout), f"weights {sorted(weights)}")
    moments, _ = read_safetensors(os.path.join(directory, "optimizer.safetensors"))
    offset = 0
    for name, shape in layout:
        count = int(np.prod(shape))
        part = flat[offset:offset + count].reshape(shape)
        dtype, array = weights[name]
        require(dtype == "F32", f"{name}: {dtype}")
        expect_array(name, array, part)
        expect_array("exp_avg." + name, moments["exp_avg." + name][1], part * np.float32(2))
        expect_array("exp_avg_sq." + name, moments["exp_avg_sq." + name][1], part * part)
        offset += count
    step_dtype, step = moments["step"]
    require(step_dtype == "I64" and step.shape == () and int(step) == 2, f"step {step}")

    with open(os.path.join(directory, "config.json")) as f:
        require(f.read() == '{"d_model": 4, "n_layers": 1}', "config.json")
    with open(os.path.join(directory, "trainer_state.json")) as f:
        state = json.load(f)
    require(state["step"] == 3 and state["tokens_seen"] == 3 * 256, f"trainer state {state}")
    require(state["sampler"]["seed"] == "000000000000002a", f"seed {state['sampler']['seed']}")
    require(state["max_grad_norm"] is None, "clipping off is null")
    require(state["extra"] == {"note": "interop"}, f"extra {state['extra']}")


def check_sharded_checkpoint(directory):
    """A version 2 checkpoint of two ranks: the weights through the index from plain safetensors
    files, the moments from the ranks' flat shards, the same values as check_checkpoint's."""
    with open(os.path.join(directory, "MANIFEST.json")) as f:
        manifest = json.load(f)
    recorded = manifest.pop("manifest_sha256")
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    require(hashlib.sha256(canonical.encode()).hexdigest() == recorded, "manifest self-checksum")
    require(manifest["format"] == "dattn-checkpoint" and manifest["version"] == 2, "manifest kind")
    require(manifest["step"] == 3 and manifest["world"] == 2, "manifest step and world")
    listed = {f["name"]: f for f in manifest["files"]}
    shards = [f"weights-{r:05d}-of-00002.safetensors" for r in range(2)]
    optimizers = [f"optimizer-{r:05d}-of-00002.safetensors" for r in range(2)]
    require(sorted(listed) == sorted(shards + optimizers + [
        "config.json", "trainer_state.json", "weights.safetensors.index.json"]),
        f"files {sorted(listed)}")
    for name, entry in listed.items():
        path = os.path.join(directory, name)
        require(os.path.getsize(path) == entry["bytes"], f"{name}: size")
        require(sha256_file(path) == entry["sha256"], f"{name}: sha256")

    layout = [("embed.weight", (8, 4)), ("blocks.0.ln.weight", (4,)), ("blocks.0.mlp.weight", (4, 6))]
    total = sum(int(np.prod(shape)) for _, shape in layout)
    flat = np.arange(total, dtype=np.float32) * np.float32(0.001) - np.float32(0.05)
    with open(os.path.join(directory, "weights.safetensors.index.json")) as f:
        index = json.load(f)
    require(index["metadata"]["total_size"] == 4 * total, f"index metadata {index['metadata']}")
    require(sorted(index["weight_map"]) == sorted(name for name, _ in layout), "index names")
    files = {name: read_safetensors(os.path.join(directory, name)) for name in shards}
    seen = 0
    offset = 0
    for name, shape in layout:
        count = int(np.prod(shape))
        weights, metadata = files[index["weight_map"][name]]
        require(metadata.get("format") == "pt", f"weights metadata {metadata}")
        dtype, array = weights[name]
        require(dtype == "F32", f"{name}: {dtype}")
        expect_array(name, array, flat[offset:offset + count].reshape(shape))
        offset += count
    for weights, _ in files.values():
        seen += len(weights)
    require(seen == len(layout), f"{seen} tensors in the weight files")
    m = np.zeros(total, dtype=np.float32)
    v = np.zeros(total, dtype=np.float32)
    covered = 0
    for name in optimizers:
        tensors, metadata = read_safetensors(os.path.join(directory, name))
        begin, end = int(metadata["begin"]), int(metadata["end"])
        require(begin == covered and int(metadata["total"]) == total, f"{name}: range {metadata}")
        m[begin:end] = tensors["exp_avg"][1]
        v[begin:end] = tensors["exp_avg_sq"][1]
        step_dtype, step = tensors["step"]
        require(step_dtype == "I64" and int(step) == 2, f"{name}: step {step}")
        covered = end
    require(covered == total, f"moments cover {covered} of {total}")
    expect_array("exp_avg", m, flat * np.float32(2))
    expect_array("exp_avg_sq", v, flat * flat)
    with open(os.path.join(directory, "trainer_state.json")) as f:
        state = json.load(f)
    require(state["step"] == 3 and state["extra"] == {"note": "interop"}, f"trainer state {state}")


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    command, path = argv[1], argv[2]
    try:
        if command == "check-safetensors":
            check_safetensors(path)
        elif command == "write-safetensors":
            write_safetensors(path, python_safetensors(), {"writer": "python"})
        elif command == "check-token-file":
            check_token_file(path)
        elif command == "write-token-file":
            write_token_file(path, [i * 31 % 1000 for i in range(500)], 1000)
        elif command == "check-checkpoint":
            check_checkpoint(path)
        elif command == "check-sharded-checkpoint":
            check_sharded_checkpoint(path)
        else:
            print(f"unknown command {command}", file=sys.stderr)
            return 2
    except (CheckError, KeyError, ValueError) as e:
        print(f"interop_check {command} {path}: {e!r}", file=sys.stderr)
        return 1
    print(f"interop_check {command}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
