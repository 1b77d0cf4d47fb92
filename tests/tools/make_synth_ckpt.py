#!/usr/bin/env python3
"""make_synth_ckpt.py: a sharded synthetic DeepSeek-V4.1 checkpoint with a huge Engram table,
for measuring the converter's peak RSS (not run by `make test`: it writes gigabytes).

It takes the tiny41 checkpoint (../shared/testdata/tiny41/hf), keeps its topology and every
non-Engram tensor, and replaces the two Engram tables by random ones sized by a larger
engram_vocab_size: the config's engram_num_embeddings are recomputed as the prime sums the
converter checks (architecture.md section 4.2.2). Output: OUT_DIR with config.json,
tokenizer files, model-00001-of-00002.safetensors (the small tensors),
model-00002-of-00002.safetensors (the Engram tables) and model.safetensors.index.json.

usage: make_synth_ckpt.py TINY41_HF_DIR OUT_DIR [--engram-vocab N] [--engram-dim D]   (stdlib only)
  --engram-vocab 5500000 (default) gives ~66M table rows: 2.2 GB of e4m3 + scales in the
  checkpoint, 4.2 GB of BF16 in the GGUF.
  --engram-dim D (a multiple of 32; default tiny41's 32): engram_head_dim, with engram.wkv
  [640, 6 * D] + its 32x32 scales made random to match; 256 (the release's) makes the native
  output's table FP8_R264 rows (dsflash convert --outtype native, docs/FORMAT.md).

Measure:  /usr/bin/time -v build/dsflash convert OUT_DIR out.gguf --threads 2 [--outtype native]
(2026-11-29, 2-core dev VM: "Maximum resident set size" 29,792 kB, 40 s wall; the largest
non-Engram tensor of this topology is 256 KiB, the bounded chunk buffers are <= 8 MiB of
source + 32 MiB of output.)
"""
import json
import math
import os
import shutil
import struct
import sys


def is_prime(n):
    if n < 2 or n % 2 == 0:
        return n == 2
    return all(n % d for d in range(3, math.isqrt(n) + 1, 2))


def engram_primes(n_layers, max_ngram, n_heads, vocab):
    seen, out = set(), []
    for _ in range(n_layers):
        layer = []
        for _ in range(max_ngram - 1):
            cur = vocab - 1
            for _ in range(n_heads):
                cand = cur + 1
                while not is_prime(cand) or cand in seen:
                    cand += 1
                cur = cand
                seen.add(cur)
                layer.append(cur)
        out.append(layer)
    return out


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        return hdr, 8 + n


def write_st(path, entries):
    """entries: list of (name, dtype, shape, nbytes, writer(f)) written in order."""
    hdr, off = {}, 0
    for name, dtype, shape, nbytes, _ in entries:
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + nbytes]}
        off += nbytes
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, nbytes, writer in entries:
            writer(f)


def random_writer(nbytes, table):
    def w(f):
        left = nbytes
        while left:
            n = min(left, 1 << 24)
            f.write(os.urandom(n).translate(table))
            left -= n
    return w


def main():
    args = sys.argv[1:]
    vocab = 5500000
    if "--engram-vocab" in args:
        i = args.index("--engram-vocab")
        vocab = int(args[i + 1])
        del args[i:i + 2]
    dim = None
    if "--engram-dim" in args:
        i = args.index("--engram-dim")
        dim = int(args[i + 1])
        del args[i:i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    src, dst = args
    os.makedirs(dst, exist_ok=True)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, fn), os.path.join(dst, fn))
    cfg = json.load(open(os.path.join(src, "config.json")))
    tc = cfg["text_config"]
    if dim:
        tc["engram_head_dim"] = dim
    layers, d = tc["engram_layer_ids"], tc["engram_head_dim"]
    primes = engram_primes(len(layers), tc["engram_max_ngram_size"], tc["engram_n_heads"], vocab)
    rows = [sum(p) for p in primes]
    tc["engram_vocab_size"] = vocab
    tc["engram_num_embeddings"] = rows
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)

    hdr, data0 = read_st(os.path.join(src, "model.safetensors"))
    small = []
    with open(os.path.join(src, "model.safetensors"), "rb") as f:
        for name, e in hdr.items():
            if name == "__metadata__" or ".engram.embed." in name or (dim and ".engram.wkv." in name):
                continue
            b, en = e["data_offsets"]
            f.seek(data0 + b)
            blob = f.read(en - b)
            small.append((name, e["dtype"], e["shape"], len(blob), lambda out, blob=blob: out.write(blob)))
    # e4m3 bytes without the NaN codes 0x7F/0xFF; E8M0 scales in [3, 246]
    e4m3 = bytes(b if (b & 0x7F) != 0x7F else b - 1 for b in range(256))
    e8m0 = bytes(3 + b % 244 for b in range(256))
    if dim:  # engram.wkv [(hc+1) * hidden, ncol * d] and its 32x32 grid, random
        ncol = (tc["engram_max_ngram_size"] - 1) * tc["engram_n_heads"]
        out_rows = (tc["hc_mult"] + 1) * tc["hidden_size"]
        for li in layers:
            n, g = out_rows * ncol * d, (out_rows // 32) * (ncol * d // 32)
            small.append((f"layers.{li}.engram.wkv.weight", "F8_E4M3", [out_rows, ncol * d], n, random_writer(n, e4m3)))
            small.append((f"layers.{li}.engram.wkv.scale", "F8_E8M0", [out_rows // 32, ncol * d // 32], g,
                          random_writer(g, bytes(112 + b % 8 for b in range(256)))))
    big = []
    for li, r in zip(layers, rows):
        big.append((f"layers.{li}.engram.embed.weight", "F8_E4M3", [r, d], r * d, random_writer(r * d, e4m3)))
        big.append((f"layers.{li}.engram.embed.scale", "F8_E8M0", [r, d // 32], r * d // 32,
                    random_writer(r * d // 32, e8m0)))
    s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    write_st(os.path.join(dst, s1), small)
    write_st(os.path.join(dst, s2), big)
    wm = {e[0]: s1 for e in small}
    wm.update({e[0]: s2 for e in big})
    json.dump({"metadata": {}, "weight_map": wm}, open(os.path.join(dst, "model.safetensors.index.json"), "w"))
    total = sum(e[3] for e in big)
    print(f"{dst}: engram rows {rows} ({sum(rows)} total), {total / 1e9:.2f} GB of Engram tensors; "
          f"BF16 table in the GGUF: {sum(rows) * d * 2 / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
