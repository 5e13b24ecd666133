#!/usr/bin/env python3
"""Tokenize text files with a Hugging Face tokenizer.json into moetrain's token format.

Same layout as `moetrain prepare` (src/moe/data/prepare.h): each input becomes <out>/<stem>.npy
(uint16 when the vocabulary has at most 65535 entries, else uint32) and <out>/dataset.json lists
them; training reads exactly the files dataset.json lists (src/moe/data/token_folder.h).
Documents: a line consisting of exactly a form feed ("\\f") separates documents within a file;
every non-empty document is its tokens followed by one EOS. Nothing is overwritten: <out> must be
new or empty, unless --append adds the inputs to the dataset already there (same tokenizer,
vocabulary, EOS and dtype; no input may become a file already listed or present). Files are
written under temporary names and renamed at the end (dataset.json last); on failure nothing is
left behind.

  python/tokenize_hf.py --tokenizer tokenizer.json --out data/mine a.txt b.txt [--eos-id N] [--append]
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


def names_text(names, shown=5):
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def existing_dataset(out, append, header, inputs, names):
    """The dataset.json that the new files are added to (None for a new or empty folder).

    Exits naming the problem when <out> holds anything and --append is not given, or when --append
    cannot add to it: a dataset.json from another tokenizer, a folder that does not match its
    dataset.json, or an input whose token file name is taken.
    """
    if not os.path.exists(out):
        return None
    if not os.path.isdir(out):
        sys.exit(f"tokenize_hf.py: output path {out} exists and is not a folder")
    entries = sorted(os.listdir(out))
    if not entries:
        return None
    if not append:
        sys.exit(f"tokenize_hf.py: output folder {out} is not empty (it holds {names_text(entries)}); nothing is "
                 f"overwritten: pass --append to add these inputs to the dataset there, or choose a new or empty "
                 f"folder")
    npy_on_disk = [e for e in entries if e.endswith(".npy") and os.path.isfile(os.path.join(out, e))]
    meta_path = os.path.join(out, "dataset.json")
    if not os.path.exists(meta_path):
        if npy_on_disk:
            sys.exit(f"tokenize_hf.py --append: {out} holds .npy files ({names_text(npy_on_disk)}) but no "
                     f"dataset.json, so what they hold is unknown; write into a new or empty folder")
        meta = dict(header, files=[])
    else:
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit(f"tokenize_hf.py --append: {meta_path} is not valid JSON ({e})")
        files = meta.get("files") if isinstance(meta, dict) else None
        if not isinstance(files, list) or not all(isinstance(f, dict) and isinstance(f.get("name"), str)
                                                  for f in files):
            sys.exit(f'tokenize_hf.py --append: {meta_path}: "files" must be an array of {{"name": ...}} objects')
        for key in ("tokenizer", "vocab_size", "eos_token_id", "dtype"):
            if meta.get(key) != header[key]:
                sys.exit(f'tokenize_hf.py --append: {meta_path} has "{key}": {json.dumps(meta.get(key))}, but this '
                         f"tokenizer gives {json.dumps(header[key])}, so the new files would not belong to that "
                         f"dataset")
        listed = [f["name"] for f in files]
        for name in listed:
            if not os.path.isfile(os.path.join(out, name)):
                sys.exit(f"tokenize_hf.py --append: {meta_path} lists {name}, but {os.path.join(out, name)} "
                         f"does not exist")
        unlisted = [e for e in npy_on_disk if e not in listed]
        if unlisted:
            sys.exit(f"tokenize_hf.py --append: {meta_path} does not list {names_text(unlisted)} found in {out}, so "
                     f"training would refuse the folder; move such files out of it first")
    for path, name in zip(inputs, names):
        target = os.path.join(out, name)
        if name in (f["name"] for f in meta["files"]) or os.path.lexists(target):
            sys.exit(f"tokenize_hf.py --append: input {path} would become {target}, which already exists or is "
                     f"listed in dataset.json; nothing was written. Rename the input (its stem names the token file)")
    return meta


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="text files; each becomes <stem>.npy")
    ap.add_argument("--tokenizer", required=True, help="path to a Hugging Face tokenizer.json")
    ap.add_argument("--out", required=True, help="output folder: new or empty, unless --append")
    ap.add_argument("--append", action="store_true",
                    help="add the inputs to the dataset already in --out (never overwrites a file)")
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
    header = {"tokenizer": "huggingface", "tokenizer_file": args.tokenizer, "vocab_size": vocab_size,
              "eos_token_id": eos, "dtype": dtype_name}
    meta = existing_dataset(args.out, args.append, header, args.inputs, [s + ".npy" for s in stems])
    if meta is None:
        meta = dict(header, files=[])

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
        meta["files"] = meta["files"] + files
        temp = os.path.join(args.out, ".dataset.json" + suffix)
        with open(temp, "w") as f:
            temps.append((temp, os.path.join(args.out, "dataset.json")))
            json.dump(meta, f, indent=2)
            f.write("\n")
        for _, final in temps[:-1]:  # anything created in the folder since it was checked is not overwritten
            if os.path.lexists(final):
                sys.exit(f"tokenize_hf.py: {final} appeared while tokenizing; nothing was written, run again")
        for temp, final in temps:  # dataset.json last: its new list marks the new files as the dataset's
            os.replace(temp, final)
    except BaseException:
        for temp, _ in temps:
            if os.path.exists(temp):
                os.remove(temp)
        if created and not os.listdir(args.out):
            os.rmdir(args.out)
        raise
    total = sum(f["tokens"] for f in files)
    print(f"wrote {len(files)} files, {total} tokens ({dtype_name}, vocab {vocab_size}, eos {eos}) to {args.out}; "
          f"dataset.json lists {len(meta['files'])}")


if __name__ == "__main__":
    main()
