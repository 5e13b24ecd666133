#!/usr/bin/env python3
"""Tokenize text files with a Hugging Face tokenizer.json into moetrain's token format.

Same layout as `moetrain prepare` (src/moe/data/prepare.h): each input becomes <out>/<stem>.npy
(uint16 when the vocabulary has at most 65535 entries, else uint32) and <out>/dataset.json lists
them. Documents: a line consisting of exactly a form feed ("\\f") separates documents within a
file; every non-empty document is its tokens followed by one EOS. Files are written under
temporary names and renamed at the end (dataset.json last); on failure nothing is left behind.

  python/tokenize_hf.py --tokenizer tokenizer.json --out data/mine a.txt b.txt [--eos-id N]
"""
import argparse
import json
import os
import sys

EOS_CANDIDATES = ["<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[SEP]"]


def split_documents(data: bytes):
    docs, current = [], []
    for line in data.splitlines(keepends=True):
        if line.rstrip(b"\r\n") == b"\f":
            docs.append(b"".join(current))
            current = []
        else:
            current.append(line)
    docs.append(b"".join(current))
    return [d.decode("utf-8", errors="replace") for d in docs if d]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="text files; each becomes <stem>.npy")
    ap.add_argument("--tokenizer", required=True, help="path to a Hugging Face tokenizer.json")
    ap.add_argument("--out", required=True, help="output folder (created if missing)")
    ap.add_argument("--eos-id", type=int, help="EOS token id (default: looked up in the tokenizer)")
    args = ap.parse_args(argv)
    try:
        import numpy as np
        from tokenizers import Tokenizer
    except ImportError as e:
        sys.exit(f"tokenize_hf.py needs numpy and the Hugging Face 'tokenizers' package "
                 f"(pip install numpy tokenizers): {e}")

    for path in args.inputs:  # check everything before creating anything
        if not os.path.isfile(path):
            sys.exit(f"tokenize_hf.py: input file {path} does not exist")
    stems = [os.path.splitext(os.path.basename(p))[0] for p in args.inputs]
    if len(set(stems)) != len(stems):
        sys.exit("tokenize_hf.py: inputs must have distinct file stems (each becomes <stem>.npy)")
    tok = Tokenizer.from_file(args.tokenizer)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    eos = args.eos_id
    if eos is None:
        eos = next((tok.token_to_id(t) for t in EOS_CANDIDATES if tok.token_to_id(t) is not None), None)
        if eos is None:
            sys.exit(f"tokenize_hf.py: no EOS token among {EOS_CANDIDATES} in {args.tokenizer}; pass --eos-id")
    if not 0 <= eos < vocab_size:
        sys.exit(f"tokenize_hf.py: EOS id {eos} outside the vocabulary of size {vocab_size}")
    dtype, dtype_name = (np.uint16, "uint16") if vocab_size <= 65535 else (np.uint32, "uint32")

    created = not os.path.isdir(args.out)
    os.makedirs(args.out, exist_ok=True)
    suffix = f".tmp-{os.getpid()}"
    temps, files = [], []
    try:
        for path, stem in zip(args.inputs, stems):
            with open(path, "rb") as f:
                docs = split_documents(f.read())
            ids = []
            for enc in tok.encode_batch(docs, add_special_tokens=False):
                ids.extend(enc.ids)
                ids.append(eos)
            arr = np.asarray(ids, dtype=dtype)
            name = stem + ".npy"
            temp = os.path.join(args.out, "." + name + suffix)
            temps.append((temp, os.path.join(args.out, name)))
            with open(temp, "wb") as f:
                np.save(f, arr)
            files.append({"name": name, "tokens": int(arr.size), "documents": len(docs), "source": path})
        meta = {"tokenizer": "huggingface", "tokenizer_file": args.tokenizer, "vocab_size": vocab_size,
                "eos_token_id": eos, "dtype": dtype_name, "files": files}
        temp = os.path.join(args.out, ".dataset.json" + suffix)
        temps.append((temp, os.path.join(args.out, "dataset.json")))
        with open(temp, "w") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
        for temp, final in temps:
            os.replace(temp, final)
    except BaseException:
        for temp, _ in temps:
            if os.path.exists(temp):
                os.remove(temp)
        if created and not os.listdir(args.out):
            os.rmdir(args.out)
        raise
    total = sum(f["tokens"] for f in files)
    print(f"wrote {len(files)} files, {total} tokens ({dtype_name}, vocab {vocab_size}, eos {eos}) to {args.out}")


if __name__ == "__main__":
    main()
