#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/: a few small valid
files of each format and a few near-valid ones (one field off), built byte by byte here so that what
each seed holds is visible in this file. The checkpoint seeds are written by seqlab itself: it trains
tests/fuzz/checkpoint_run.toml for two steps (the recipe the checkpoint target restores into).

    python3 tests/fuzz/make_corpus.py build/seqlab

Deterministic: running it again rewrites the same bytes. Inputs libFuzzer found that once crashed a
parser are kept beside the seeds as regression-<what> files (written by hand, not by this script).
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def put(target, name, data):
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


# ---- .npy -------------------------------------------------------------------------------------------
def npy(descr, shape, data, major=1):
    shape_text = "(%s,)" % shape[0] if len(shape) == 1 else "(%s)" % ", ".join(map(str, shape))
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_text)
    pre = 10 if major == 1 else 12
    header += " " * ((64 - (pre + len(header) + 1) % 64) % 64) + "\n"
    size = struct.pack("<H", len(header)) if major == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([major, 0]) + size + header.encode() + data


def npy_seeds():
    put("npy", "f32_2x3.npy", npy("<f4", (2, 3), struct.pack("<6f", 0.5, -1, 2, 3.25, 0, -7)))
    put("npy", "f64_v2.npy", npy("<f8", (3,), struct.pack("<3d", 1e-300, -2.5, 1e300), major=2))
    put("npy", "i64_scalar.npy", npy("<i8", (), struct.pack("<q", -42)))
    put("npy", "i32_empty.npy", npy("<i4", (2, 0, 3), b""))
    put("npy", "near_truncated.npy", npy("<f4", (4,), struct.pack("<3f", 1, 2, 3)))
    put("npy", "near_fortran.npy", npy("<f4", (1,), struct.pack("<f", 1)).replace(b"False", b"True "))


# ---- safetensors --------------------------------------------------------------------------------------
def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, bytes)], laid out in the order given."""
    header, offset, blob = {}, 0, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blob += data
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + blob


def safetensors_seeds():
    put("safetensors", "two_tensors_metadata.safetensors",
        safetensors([("a.weight", "F32", (2, 2), struct.pack("<4f", 1, 2, 3, 4)),
                     ("optim.step", "I64", (), struct.pack("<q", 7))], {"format": "x", "step": "7"}))
    put("safetensors", "every_dtype.safetensors",
        safetensors([("b", "BF16", (3,), struct.pack("<3H", 0x3F80, 0xC000, 0x7F80)),
                     ("d", "F64", (1, 1), struct.pack("<d", -0.125)),
                     ("i", "I32", (2,), struct.pack("<2i", -1, 65536)),
                     ("z", "F32", (0, 5), b"")]))
    put("safetensors", "empty.safetensors", safetensors([]))
    put("safetensors", "escapes.safetensors",
        safetensors([("\u00e9\\\"\n", "F32", (1,), struct.pack("<f", 2))], {"k\u20ac": "v\U0001F600"}))
    near = bytearray(safetensors([("a", "F32", (2,), struct.pack("<2f", 1, 2)),
                                  ("b", "F32", (1,), struct.pack("<f", 3))]))
    put("safetensors", "near_overlap.safetensors", bytes(near).replace(b"[8,12]", b"[4,12]"))
    put("safetensors", "near_header_too_long.safetensors", struct.pack("<Q", 1 << 40) + b"{}")


# ---- llm.c token shards (with the fuzz target's two option bytes in front) ---------------------------
def shard(tokens, magic=20240520, version=1, count=None):
    header = struct.pack("<3i", magic, version, len(tokens) if count is None else count) + b"\0" * (1024 - 12)
    return header + struct.pack("<%dH" % len(tokens), *tokens)


def shards_seeds():
    tokens = [(i * 37) % 300 for i in range(40)]
    put("shards", "one_shard.bin", bytes([0x03, 0x00]) + shard(tokens))
    put("shards", "two_shards_two_ranks.bin",
        bytes([0x52, 0x25]) + shard(tokens[:13]) + b"SEQLAB-NEXT-SHARD" + shard([65535, 0, 1, 2, 3, 4, 5]))
    put("shards", "near_count.bin", bytes([0x01, 0x01]) + shard(tokens, count=41))
    put("shards", "near_version.bin", bytes([0x01, 0x01]) + shard(tokens, version=2))


# ---- tokenizer files --------------------------------------------------------------------------------
def tokenizer_seeds():
    put("tokenizer", "merges_and_text.txt",
        "seqlab-bpe 1\n104 101\n256 108\n257 108\n258 111\n32 119\n260 111\n"
        "\n--- text ---\nhello world\n\nhello again, hello \u00e9t\u00e9 42!\n")
    put("tokenizer", "merges_crlf.txt", "seqlab-bpe 1\r\n97 98\r\n256 256\r\n257 257\r\n")
    put("tokenizer", "header_only.txt", "seqlab-bpe 1\n")
    put("tokenizer", "near_undefined_id.txt", "seqlab-bpe 1\n97 98\n256 258\n")


def llmc_tokenizer(words, eot, version=2, count=None):
    """llm.c's gpt2_tokenizer.bin: 256 uint32 (magic, version, count, eot in version 2), then each
    token as one length byte and its bytes."""
    header = struct.pack("<4I", 20240328, version, len(words) if count is None else count, eot if version == 2 else 0)
    body = b"".join(bytes([len(w)]) + w for w in words)
    return header + bytes(1024 - len(header)) + body


def llmc_tokenizer_seeds():
    words = [b"<|endoftext|>", b"the", b" cat", b" sat", b"\xe2\x82", b"\xac", b"!"]
    put("llmc_tokenizer", "v2.bin", llmc_tokenizer(words, 0))
    put("llmc_tokenizer", "v2_eot_last.bin", llmc_tokenizer(words[1:] + words[:1], 6))
    put("llmc_tokenizer", "near_v1_small.bin", llmc_tokenizer(words, 0, version=1))
    put("llmc_tokenizer", "near_count_too_big.bin", llmc_tokenizer(words, 0, count=8))
    put("llmc_tokenizer", "near_zero_length.bin", llmc_tokenizer(words[:2] + [b""], 0))


# ---- recipes (the TOML, then "--- set ---" and overrides) -------------------------------------------
def recipe_seeds():
    root = os.path.dirname(os.path.dirname(HERE))
    for name in ("gpt_small", "hybrid_small", "delta_net_small"):
        with open(os.path.join(root, "recipes", name + ".toml")) as f:
            put("recipe", name + ".toml", f.read())
    put("recipe", "overrides.toml",
        "[model]\nmixer = \"gla\"\nd_model = 32\nn_layers = 2\n[train]\nsteps = 3\n"
        "\n--- set ---\noptim.lr=3e-4\nmodel.gla.chunk_size=16\ndata.source=mqar\nmodel.pattern=gla attention\n")
    put("recipe", "older_names.toml",
        "[model]\narch = \"gpt\"\nmixer = \"retnet\"\nchunk_size = 8\n[optim]\nschedule = \"linear\"\n")
    put("recipe", "near_bad_key.toml", "[model]\nd_modle = 3\n[train]\nsteps = -1\n")


# ---- corpus files and meta.json ---------------------------------------------------------------------
def documents_seeds():
    put("documents", "docs.jsonl",
        '{"text": "first \\"doc\\"\\n\\u00e9\\ud83d\\ude00", "id": 1}\n\n'
        '{"id": [1, {"a": null}], "text": "second", "ok": true}\n')
    put("documents", "fortunes.txt", "A fortune.\n%\nAnother\none.\n%\n\n%\n")
    put("documents", "paragraphs.txt", "One paragraph\nof two lines.\n\n\n  \nAnother.\n")
    put("documents", "meta.json", json.dumps({
        "format": "seqlab-shards 1", "tokenizer": "byte", "tokenizer_path": "", "vocab_size": 275, "eot": 256,
        "source": "corpus", "source_format": "text", "val_fraction": 0.05, "seed": 0, "train_documents": 9,
        "val_documents": 1, "train_tokens": 900, "val_tokens": 100, "train_shards": 1, "val_shards": 1}, indent=2))
    put("documents", "near_unterminated.jsonl", '{"text": "no end\n')


# ---- checkpoints, written by seqlab -----------------------------------------------------------------
def checkpoint_seeds(seqlab):
    # Run from a scratch folder with relative paths, so the resolved recipe the checkpoints keep names
    # no folder of this machine.
    seqlab = os.path.abspath(seqlab)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(HERE, "checkpoint_run.toml"), tmp)
        subprocess.run([seqlab, "checkpoint_run.toml", "--out", "run"], cwd=tmp, check=True, stdout=subprocess.DEVNULL)
        for step in (1, 2):
            name = "ckpt_%07d.safetensors" % step
            shutil.copy(os.path.join(tmp, "run", name), os.path.join(CORPUS, "checkpoint", "step%d.safetensors" % step))
            # The same checkpoint as format 2 wrote it, without checksums (read unverified), so that
            # mutations of its tensors and metadata reach the code after the checksum check.
            with open(os.path.join(tmp, "run", name), "rb") as f:
                data = f.read()
            put("checkpoint", "step%d_format2.safetensors" % step, without_checksums(data))


def without_checksums(data):
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header["__metadata__"]
    for key in [k for k in meta if k == "crc32c" or k.startswith("crc32c.")]:
        del meta[key]
    meta["format"] = "seqlab-checkpoint 2"
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + data[8 + n:]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    os.makedirs(os.path.join(CORPUS, "checkpoint"), exist_ok=True)
    npy_seeds()
    safetensors_seeds()
    shards_seeds()
    tokenizer_seeds()
    recipe_seeds()
    documents_seeds()
    llmc_tokenizer_seeds()
    checkpoint_seeds(sys.argv[1])


if __name__ == "__main__":
    main()
