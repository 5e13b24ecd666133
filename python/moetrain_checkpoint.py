#!/usr/bin/env python3
"""Read a moetrain checkpoint in Python: the full logical tensors under their Hugging Face names.

A checkpoint (src/moe/ckpt/checkpoint.h) is a folder step-NNNNNN/ holding one safetensors file per
rank with flat element ranges ("chunks") of logical tensors, an index.json that maps every logical
tensor to its dtype, shape and chunks, and train_state.json. This module assembles each tensor from
the chunks of every rank file, like the C++ CheckpointReader, and checks what that reader checks:
the index fields, the rank files' headers, that the chunks agree with the index, do not overlap and
cover the tensor, and (index version 2) each chunk's XXH3-64 checksum before its bytes are used. A
mismatch is refused naming the rank file and the tensor. Version-1 checkpoints (no checksums) load
unverified.

The tensors are the FP32 main weights under their Hugging Face names (experts fused, as moetrain
stores them: `model.layers.L.mlp.experts.gate_up_proj` [N, 2H, D], gate rows first, and
`...experts.down_proj` [N, D, H]), the AdamW moments under `<name>.exp_avg` and
`<name>.exp_avg_sq`, and `router_bias` [layers, experts] (the auxiliary-loss-free selection bias). Arrays come back in their stored dtype (F32 -> float32, I32 -> int32,
I64 -> int64, U8 -> uint8), except BF16, which comes back as float32 (every BF16 value is exactly a
float32, so nothing is lost and no extra package is needed). F8 dtypes are refused.

  from moetrain_checkpoint import load, Checkpoint
  ckpt = load("runs/tiny")                     # a run folder: its newest complete checkpoint
  ckpt["tensors"]["lm_head.weight"]            # numpy array, shape [V, D]
  ckpt["step"], ckpt["train_state"]["config"]  # index.json's step, train_state.json
  Checkpoint("runs/tiny/step-000300").tensor("model.norm.weight")  # one tensor at a time

  python3 python/moetrain_checkpoint.py CKPT                 # verify every chunk, print a summary
  python3 python/moetrain_checkpoint.py CKPT --list          # tensors with dtype, shape, chunks
  python3 python/moetrain_checkpoint.py CKPT --tensor NAME --out x.npy

CKPT is a step-* folder, a run folder (its newest complete step-* folder, leaving out the ones an
interrupted set-aside, <run>/.set-aside.json, is moving away, as `moetrain train --resume` does) or
<run>/latest; a newer step-* folder without index.json (damaged) is refused, naming it, as moetrain does. Needs numpy and xxhash (scripts/setup.sh installs both into .deps/python).
"""
import argparse
import json
import math
import mmap
import os
import re
import struct
import sys

try:
    import numpy as np
except ImportError as e:  # run as a command: one line that says what to install, not a traceback
    if __name__ != "__main__":
        raise
    sys.exit(f"error: moetrain_checkpoint.py needs numpy ({e}): pip install numpy, or use the copy "
             f"scripts/setup.sh installs (PYTHONPATH=.deps/python)")

try:
    import xxhash
except ImportError:  # needed only to verify version-2 checkpoints; said so when one is read
    xxhash = None

FORMAT = "moetrain-checkpoint"
NEWEST_VERSION = 2  # version 2 added a checksum to every chunk record
CHECKSUM_ALGORITHM = "xxh3-64"
SAFETENSORS_MAX_HEADER = 100 * 1000 * 1000  # the limit of the reference library and the C++ reader
INTENT_FILE = ".set-aside.json"

# Stored dtype -> (element size, numpy dtype of the stored bytes).
STORED_DTYPES = {"F32": (4, "<f4"), "BF16": (2, "<u2"), "I32": (4, "<i4"), "I64": (8, "<i8"), "U8": (1, "u1")}
KNOWN_UNSUPPORTED = {"F8_E4M3", "F8_E8M0", "F64", "F16", "F8_E5M2", "I8", "I16", "U16", "U32", "U64", "BOOL"}


class CheckpointError(Exception):
    """A checkpoint that cannot be read as it is; the message names the file and what is wrong."""


def _fail(message):
    raise CheckpointError(message)


def _read_json(path):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except OSError as e:
        _fail(f"cannot read {path}: {e.strerror}")
    except ValueError as e:
        _fail(f"{path} is not valid JSON: {e}")
    except RecursionError:  # json's parser recurses once per nesting level
        _fail(f"{path} is not valid JSON: nested too deeply to be a moetrain file")


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _plain_file_name(name):
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name


# ---------------------------------------------------------------------------------------------
# Finding the checkpoint (mirrors src/moe/ckpt/run_checkpoints.cpp)

def _set_aside_after_step(run_dir):
    """The step after which a pending set-aside moves checkpoints away, or None when there is none."""
    path = os.path.join(run_dir, INTENT_FILE)
    if not os.path.exists(path):
        return None
    intent = _read_json(path)
    if not isinstance(intent, dict) or not _is_int(intent.get("after_step")) or not isinstance(intent.get("dir"), str):
        _fail(f'{path} (an interrupted set-aside of abandoned checkpoints) is malformed: it needs "after_step" '
              f'(an integer) and "dir" (a folder name); inspect it and the run directory, then remove it')
    return intent["after_step"]


def list_checkpoints(run_dir):
    """Complete checkpoints (step-*/index.json) of run_dir as (step, folder name), ascending, without
    those a pending set-aside intent is moving away."""
    try:
        names = os.listdir(run_dir)
    except OSError as e:
        _fail(f"cannot list run directory {run_dir}: {e.strerror}")
    steps = [(step, name) for step, name in _step_folders(run_dir, names)
             if os.path.exists(os.path.join(run_dir, name, "index.json"))]
    after = _set_aside_after_step(run_dir)
    return sorted(s for s in steps if after is None or s[0] <= after)


def _step_folders(run_dir, names):
    """(step, name) of the folders among names that carry a name saves give (zero-padded to six
    digits: step-000002, not a copy named step-2), complete or not."""
    for name in names:
        m = re.fullmatch(r"step-([0-9]{6,18})", name)
        if m and name == f"step-{int(m.group(1)):06d}" and os.path.isdir(os.path.join(run_dir, name)):
            yield int(m.group(1)), name


def resolve_checkpoint(path):
    """A step-* folder as is; a run folder or <run>/latest -> its newest complete checkpoint."""
    p = path.rstrip("/") or path
    if os.path.isdir(p) and os.path.exists(os.path.join(p, "index.json")):
        return p
    run = p
    if os.path.basename(p) == "latest" and not os.path.exists(p):  # a run folder named latest is itself
        run = os.path.dirname(p) or "."
    if not os.path.lexists(run):
        _fail(f"cannot resolve checkpoint {path}: {run} does not exist")
    if not os.path.isdir(run):
        _fail(f"cannot resolve checkpoint {path}: neither a checkpoint directory nor a run directory")
    steps = list_checkpoints(run)
    # As moetrain resolves it: a step-N folder newer than every complete checkpoint but without
    # index.json is damage (saves name a folder step-N only once it is complete), not skipped.
    newest = steps[-1][0] if steps else -1
    after = _set_aside_after_step(run)
    for step, name in sorted(_step_folders(run, os.listdir(run))):
        if step > newest and (after is None or step <= after) and not os.path.exists(os.path.join(run, name, "index.json")):
            hint = f", or name the checkpoint to use, e.g. {os.path.join(run, steps[-1][1])}" if steps else ""
            _fail(f"cannot resolve checkpoint {path}: {os.path.join(run, name)} is newer than every complete checkpoint "
                  f"there but has no index.json (saves name a folder step-N only once it is complete: it was damaged, "
                  f"or copied in unfinished); move it out of {run}{hint}")
    if not steps:
        _fail(f"no complete checkpoint (step-*/index.json) in {run}")
    return os.path.join(run, steps[-1][1])


# ---------------------------------------------------------------------------------------------
# Safetensors rank files

class _RankFile:
    """A memory-mapped safetensors file whose header has been checked (as SafetensorsReader does)."""

    def __init__(self, path):
        self.path = path
        where = f"safetensors file {path}"
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 8:
                    _fail(f"{where} is truncated: {size} bytes, shorter than the 8-byte header length")
                self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            _fail(f"cannot open {where}: {e.strerror}")
        (header_len,) = struct.unpack("<Q", self.map[:8])
        if header_len > SAFETENSORS_MAX_HEADER:
            _fail(f"{where}: header length {header_len} exceeds the limit of {SAFETENSORS_MAX_HEADER} bytes "
                  f"(corrupt file?)")
        if header_len > size - 8:
            _fail(f"{where}: header length {header_len} runs past the end of the file ({size} bytes; truncated?)")
        self.data_offset = 8 + header_len
        data_size = size - self.data_offset
        try:
            header = json.loads(self.map[8:self.data_offset])
        except ValueError as e:
            _fail(f"{where}: header is not valid JSON: {e}")
        except RecursionError:
            _fail(f"{where}: header is not valid JSON: nested too deeply to be a safetensors header")
        if not isinstance(header, dict):
            _fail(f"{where}: header is not a JSON object")
        self.entries = {}  # name -> (dtype, shape, begin, end), byte offsets in the data section
        for name, e in header.items():
            if name == "__metadata__":
                continue
            what = f"{where}, tensor '{name}'"
            if not isinstance(e, dict):
                _fail(f"{what}: entry is not a JSON object")
            dtype, shape, offsets = e.get("dtype"), e.get("shape"), e.get("data_offsets")
            if not isinstance(dtype, str) or not isinstance(shape, list) or not isinstance(offsets, list):
                _fail(f"{what}: needs a string 'dtype', an array 'shape' and an array 'data_offsets'")
            if not all(_is_int(d) and d >= 0 for d in shape):
                _fail(f"{what}: shape {shape} has an entry that is not a non-negative integer")
            if len(offsets) != 2 or not all(_is_int(o) and o >= 0 for o in offsets) or offsets[0] > offsets[1]:
                _fail(f"{what}: data_offsets {offsets} is not [begin, end] with 0 <= begin <= end")
            if offsets[1] > data_size:
                _fail(f"{what}: data_offsets {offsets} run past the data section ({data_size} bytes; truncated file?)")
            self.entries[name] = (dtype, shape, offsets[0], offsets[1])
        # Packed, as the format requires (and the C++ reader checks): no overlap, gap or trailing bytes.
        covered, previous = 0, None
        for name, (_, _, begin, end) in sorted(self.entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
            if begin < covered:
                _fail(f"{where}: tensors '{previous[0]}' [{previous[1]}, {previous[2]}) and '{name}' "
                      f"[{begin}, {end}) overlap")
            if begin != covered:
                _fail(f"{where}: bytes [{covered}, {begin}) of the data section belong to no tensor (before "
                      f"'{name}'); the format packs tensors without gaps (damaged file?)")
            covered, previous = end, (name, begin, end)
        if covered != data_size:
            _fail(f"{where}: the tensors end at byte {covered} of the {data_size}-byte data section; the "
                  f"{data_size - covered} bytes after them belong to no tensor (damaged or concatenated file?)")

    def raw(self, name):
        """The stored bytes of tensor `name` (a view into the mapping)."""
        _, _, begin, end = self.entries[name]
        return memoryview(self.map)[self.data_offset + begin:self.data_offset + end]


# ---------------------------------------------------------------------------------------------
# The checkpoint

class Checkpoint:
    """Opens a checkpoint and validates index.json, the rank files' headers and train_state.json.

    Chunk data is verified when a tensor is read: tensor() hashes each chunk it uses (the first time)
    and refuses a mismatch; verify_all() hashes every chunk.
    """

    def __init__(self, path):
        self.dir = resolve_checkpoint(path)
        index_path = os.path.join(self.dir, "index.json")
        index = _read_json(index_path)
        if not isinstance(index, dict) or index.get("format") != FORMAT:
            _fail(f'{index_path}: not a moetrain checkpoint index (missing "format": "{FORMAT}")')
        self.version = self._int(index, "version", index_path, "version", default=1, low=1)
        if self.version > NEWEST_VERSION:
            _fail(f"{index_path}: checkpoint format version {self.version} is newer than this reader handles "
                  f"(1 to {NEWEST_VERSION}); read it with the moetrain version that wrote it")
        self.step = self._int(index, "step", index_path, "step", low=0)
        tensors = index.get("tensors")
        if not isinstance(tensors, dict):
            _fail(f'{index_path}: "tensors" must be an object')
        self._files = {}
        self._tensors = {}  # key -> (dtype, shape, numel, chunks sorted by begin)
        self._verified = set()  # (file, in-file key) of chunks whose checksum matched
        self.bytes_verified = 0
        for key, t in tensors.items():
            self._tensors[key] = self._read_tensor_record(index_path, key, t)
        state_path = os.path.join(self.dir, "train_state.json")
        self.train_state = _read_json(state_path)
        if not isinstance(self.train_state, dict):
            _fail(f"{state_path}: expected a JSON object")

    @property
    def has_checksums(self):
        """False for version-1 checkpoints, whose chunks are read unverified."""
        return self.version >= 2

    @staticmethod
    def _int(obj, field, source, name, default=None, low=None, high=None):
        value = obj.get(field, default)
        if not _is_int(value) or (low is not None and value < low) or (high is not None and value > high):
            bounds = f" in [{low}, {high}]" if high is not None else (f" >= {low}" if low is not None else "")
            _fail(f"{source}: {name} must be an integer{bounds}, got {json.dumps(value)}")
        return value

    def _read_tensor_record(self, index_path, key, t):
        field = f"tensors.{key}"
        where = f"{index_path}: {field}"
        if not isinstance(t, dict):
            _fail(f"{where} must be an object")
        dtype, shape, chunks = t.get("dtype"), t.get("shape"), t.get("chunks")
        if not isinstance(dtype, str):
            _fail(f"{where}.dtype must be a string")
        if dtype not in STORED_DTYPES:
            known = dtype in KNOWN_UNSUPPORTED
            _fail(f"{where}.dtype: {'unsupported' if known else 'unknown'} dtype '{dtype}' (this reader handles "
                  f"{', '.join(STORED_DTYPES)})")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            _fail(f"{where}.shape must be an array of integers >= 0")
        numel = math.prod(shape)
        if numel > 2**63 - 1:  # as the C++ reader: an element count that fits in 64 bits
            _fail(f"{where}.shape {shape} holds {numel} elements, more than a 64-bit count")
        if not isinstance(chunks, list):
            _fail(f"{where}.chunks must be an array")
        esize = STORED_DTYPES[dtype][0]
        records = []
        for i, r in enumerate(chunks):
            at = f"{where}.chunks[{i}]"
            if not isinstance(r, dict):
                _fail(f"{at} must be an object")
            file, file_key = r.get("file"), r.get("key")
            if not _plain_file_name(file):
                _fail(f"{at}.file must be a plain file name inside the checkpoint directory")
            if not isinstance(file_key, str):
                _fail(f"{at}.key must be a string")
            begin = self._int(r, "begin", index_path, f"{field}.chunks[{i}].begin", low=0, high=numel)
            end = self._int(r, "end", index_path, f"{field}.chunks[{i}].end", low=begin, high=numel)
            checksum = None
            if self.version >= 2:
                s = r.get("checksum")
                if not isinstance(s, dict):
                    _fail(f"{at}.checksum must be an object with \"algorithm\" and \"value\"")
                if s.get("algorithm") != CHECKSUM_ALGORITHM:
                    _fail(f"{at}.checksum.algorithm: unsupported checksum algorithm {json.dumps(s.get('algorithm'))} "
                          f"(this reader verifies {CHECKSUM_ALGORITHM})")
                value = s.get("value")
                if not isinstance(value, str) or not re.fullmatch(r"[0-9a-fA-F]{16}", value):
                    _fail(f"{at}.checksum.value must be 16 hexadecimal digits")
                checksum = int(value, 16)
            if file not in self._files:
                path = os.path.join(self.dir, file)
                if not os.path.exists(path):
                    _fail(f"{at}.file: rank file {path} does not exist")
                self._files[file] = _RankFile(path)
            f = self._files[file]
            if file_key not in f.entries:
                _fail(f"{at}.key: chunk tensor '{file_key}' not found in {f.path}")
            stored_dtype, stored_shape, b0, b1 = f.entries[file_key]
            if stored_dtype != dtype or stored_shape != [end - begin] or b1 - b0 != (end - begin) * esize:
                _fail(f"{index_path}, tensor '{key}': chunk '{file_key}' in {f.path} is {stored_dtype} {stored_shape} "
                      f"({b1 - b0} bytes), index says {dtype} [{end - begin}]")
            records.append((begin, end, file, file_key, checksum))
        records.sort(key=lambda c: (c[0], c[1]))
        prev, covered = None, 0  # elements [0, covered) are stored
        for c in records:
            if c[0] == c[1]:
                continue
            if prev is not None and c[0] < prev[1]:
                _fail(f"{index_path}: chunks of tensor '{key}' overlap: [{prev[0]}, {prev[1]}) in {prev[2]} and "
                      f"[{c[0]}, {c[1]}) in {c[2]}")
            if c[0] > covered:
                break
            prev, covered = c, c[1]
        # Every element in some chunk, as the C++ reader requires (a verify that passed used to
        # vouch for a checkpoint neither it nor moetrain could read).
        if covered < numel:
            gap_end = next((c[0] for c in records if c[0] > covered and c[1] > c[0]), numel)
            _fail(f"{index_path}: elements [{covered}, {gap_end}) of tensor '{key}' are not stored in any chunk")
        return dtype, shape, numel, records

    @property
    def rank_files(self):
        """The rank files the index refers to, sorted."""
        return sorted(self._files)

    def keys(self):
        """Every stored tensor name (weights and moments), sorted."""
        return sorted(self._tensors)

    def dtype(self, key):
        return self._record(key)[0]

    def shape(self, key):
        return list(self._record(key)[1])

    def chunks(self, key):
        """[(begin, end, rank file)] of tensor `key`, by begin."""
        return [(c[0], c[1], c[2]) for c in self._record(key)[3]]

    def _record(self, key):
        if key not in self._tensors:
            _fail(f"tensor '{key}' not found in checkpoint {self.dir}")
        return self._tensors[key]

    def _verified_bytes(self, key, chunk):
        """The chunk's stored bytes, hashed and compared with index.json the first time it is used."""
        begin, end, file, file_key, checksum = chunk
        raw = self._files[file].raw(file_key)
        if checksum is None or (file, file_key) in self._verified:
            return raw
        if xxhash is None:
            _fail(f"checkpoint {self.dir} has checksums, and verifying them needs the Python package xxhash "
                  f"(scripts/setup.sh installs it into .deps/python; or pip install xxhash)")
        found = xxhash.xxh3_64_intdigest(raw)
        if found != checksum:
            _fail(f"checkpoint {self.dir}: rank file {file}, tensor '{key}' (in-file key '{file_key}', elements "
                  f"[{begin}, {end})): {CHECKSUM_ALGORITHM} checksum mismatch: index.json has {checksum:016x}, the "
                  f"stored bytes hash to {found:016x} (the file changed after it was written; restore it or use "
                  f"another checkpoint)")
        self._verified.add((file, file_key))
        self.bytes_verified += len(raw)
        return raw

    def tensor(self, key):
        """The whole logical tensor `key` in its logical shape (BF16 as float32), after checking its chunks."""
        dtype, shape, numel, chunks = self._record(key)
        esize, stored = STORED_DTYPES[dtype]
        flat = np.empty(numel, dtype=stored)
        out = flat.view(np.uint8)
        cursor = 0  # elements before it have been copied
        for c in chunks:
            if c[1] <= cursor:
                continue
            if c[0] > cursor:
                break
            out[cursor * esize:c[1] * esize] = np.frombuffer(self._verified_bytes(key, c), np.uint8)
            cursor = c[1]
        if cursor < numel:
            nxt = next((c[0] for c in chunks if c[0] > cursor), numel)
            _fail(f"checkpoint {self.dir}: elements [{cursor}, {nxt}) of tensor '{key}' are not stored in any chunk")
        if dtype == "BF16":  # exact: a BF16 value is the upper half of the float32 with the same value
            flat = (flat.astype(np.uint32) << 16).view(np.float32)
        return flat.reshape(shape)

    def verify_all(self):
        """Hashes every chunk of every tensor (version 2); returns the bytes verified so far."""
        for key in self.keys():
            for c in self._record(key)[3]:
                self._verified_bytes(key, c)
        return self.bytes_verified


def load(path):
    """Everything in a checkpoint: {"dir", "step", "version", "train_state", "tensors": {name: array}}.

    `tensors` holds the weights under their Hugging Face names, the AdamW moments under
    `<name>.exp_avg` and `<name>.exp_avg_sq` and `router_bias`, each whole and in its logical shape. For a checkpoint
    too large for memory, read tensors one at a time with Checkpoint(path).tensor(name).
    """
    ckpt = Checkpoint(path)
    tensors = {key: ckpt.tensor(key) for key in ckpt.keys()}
    return {"dir": ckpt.dir, "step": ckpt.step, "version": ckpt.version, "train_state": ckpt.train_state,
            "tensors": tensors}


# ---------------------------------------------------------------------------------------------
# Command line

def _save_npy_new(path, array):
    """Writes a new .npy file (never replacing one): a temporary name beside it, then a link to `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    temp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        data = array if array.flags.c_contiguous else array.copy(order="C")
        with open(temp, "wb") as f:
            # What np.save writes, but not through its ndarray.tofile, which reports a short write (a
            # full disk) without the reason.
            np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(data))
            f.write(data.reshape(-1).view(np.uint8))
            f.flush()
            os.fsync(f.fileno())
        os.link(temp, path)  # fails if `path` appeared meanwhile, unlike a rename
    except FileExistsError:
        _fail(f"{path} exists; nothing is overwritten, choose another --out")
    except OSError as e:
        _fail(f"cannot write {path}: {e.strerror}")
    finally:
        if os.path.exists(temp):
            os.remove(temp)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="a step-* folder, a run folder (its newest checkpoint) or <run>/latest")
    ap.add_argument("--list", action="store_true", help="list the tensors (dtype, shape, chunks) without reading them")
    ap.add_argument("--tensor", help="the tensor to write to --out (a name from --list)")
    ap.add_argument("--out", help="the .npy file to write --tensor to (must not exist)")
    args = ap.parse_args(argv)
    if (args.tensor is None) != (args.out is None):
        ap.error("--tensor and --out go together")
    if args.list and args.tensor is not None:
        ap.error("--list only lists; --tensor and --out write one tensor: give one or the other")
    if args.out is not None and os.path.lexists(args.out):
        ap.error(f"--out {args.out} exists; nothing is overwritten, choose another file")
    try:
        ckpt = Checkpoint(args.checkpoint)
        if args.list:
            for key in ckpt.keys():
                files = sorted({c[2] for c in ckpt.chunks(key)})
                print(f"{key}\t{ckpt.dtype(key)}\t{ckpt.shape(key)}\t{len(ckpt.chunks(key))} chunk(s) in "
                      f"{', '.join(files)}")
        elif args.tensor is not None:
            array = ckpt.tensor(args.tensor)
            _save_npy_new(args.out, array)
            print(f"wrote {args.tensor} ({ckpt.dtype(args.tensor)} stored, {array.dtype} {list(array.shape)}) to "
                  f"{args.out}")
        else:
            verified = ckpt.verify_all()
            check = (f"every chunk's {CHECKSUM_ALGORITHM} checksum matches ({verified} bytes)" if ckpt.has_checksums
                     else "version 1: no checksums to verify")
            print(f"{ckpt.dir}: step {ckpt.step}, format version {ckpt.version}, {len(ckpt.keys())} tensors in "
                  f"{len(ckpt.rank_files)} rank file(s); {check}")
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # --list into `head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
