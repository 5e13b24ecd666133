#!/usr/bin/env python3
"""Tokenize text or JSONL files with a Hugging Face tokenizer.json into moetrain's token format.

Same layout as `moetrain prepare` (src/moe/data/prepare.h): each input becomes <out>/<stem>.npy
(uint16 when the vocabulary has at most 65535 entries, else uint32) and <out>/dataset.json lists
them; training reads exactly the files dataset.json lists (src/moe/data/token_folder.h). Every
non-empty document is its tokens followed by one EOS.

Inputs (text and JSONL optionally compressed: *.gz, or *.zst as The Pile and SlimPajama ship):
  text    a line consisting of exactly a form feed ("\\f") separates documents within a file.
  JSONL   *.jsonl or *.ndjson: one JSON object per line, whose --jsonl-field (default "text") string
          is one document; blank lines are skipped, an empty string is an empty document (no EOS).
  Parquet *.parquet (the Hugging Face Hub's format): each row's --jsonl-field column is one
          document; errors name the row ("file.parquet:ROW"). Needs pyarrow.
The stem drops .gz/.zst and the extension: corpus.jsonl.gz -> corpus.npy.

Streaming: inputs are read in pieces of about --chunk-bytes that end at line ends and the tokens
are appended to the .npy as they come, so memory stays bounded by the pieces in flight, not the
file. A document longer than a piece is cut only between a line that ends in a non-space character
and a line that starts with one, where the tokenizers that split words at whitespace (byte-level
BPE as in GPT-2, Llama 3, OLMoE; WordLevel and WordPiece with whitespace pre-tokenizers) give the
ids they give for the whole document. This is checked on sample text first: a tokenizer that
encodes the start of its input differently (SentencePiece's word-start marker, add_prefix_space)
gets every document whole instead, and a note says so. --workers N encodes pieces in N processes;
pieces and their order do not depend on N, so the output is identical for every N.

Text must be UTF-8: an invalid byte is an error naming the file and line (JSONL as well), and so
is a JSON escape of a lone surrogate ("\\udc80"), which no UTF-8 text holds. An input that holds no
document (empty, only blank lines, only "" texts) is refused, as `moetrain prepare` refuses it.

Nothing is overwritten: <out> must be new or empty, unless --append adds the inputs to the dataset
already there (same tokenizer, vocabulary, EOS and dtype; no input may become a file already listed
or present). The tokenizer is the same when its file's bytes are: dataset.json records their
SHA-256 ("tokenizer_sha256"); a dataset.json without one (an older tokenize_hf.py) is appended to
only with --trust-tokenizer and a tokenizer file of the recorded name (its hash is recorded then).
Files are written under temporary names and renamed at the end (dataset.json last), never over a
file that appeared meanwhile; on failure, a worker process that dies, SIGINT or SIGTERM, the
temporary files are removed and nothing is left behind (a signal during the final renames waits
for them to finish). One writer at a time per output folder (moetrain prepare included).

  python3 python/tokenize_hf.py --tokenizer tokenizer.json --out data/mine a.txt b.jsonl.gz
                                [--workers N] [--jsonl-field text] [--eos-id N] [--append] [--trust-tokenizer]
"""
import argparse
import collections
import concurrent.futures
import concurrent.futures.process
import hashlib
import json
import multiprocessing
import os
import signal
import struct
import sys

import dataset_output
from token_inputs import InputError, cut_is_safe, is_jsonl, is_separator, pieces, stem_of

try:
    import numpy as np
    from tokenizers import Tokenizer
except ImportError as e:  # said in one line by main()
    np, Tokenizer, IMPORT_ERROR = None, None, e

EOS_CANDIDATES = ["<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[SEP]"]
DEFAULT_CHUNK_BYTES = 1 << 20
# Within a piece, documents are encoded in parts of about this size, cut where pieces may be cut: the
# tokenizer's batch encoding runs the parts on its threads, and short inputs encode faster.
ENCODE_PART_BYTES = 1 << 14
NPY_HEADER_BYTES = 128  # fixed, so the length can be patched in after the tokens are written
# Where a document may be cut: "<non-space>\n" | "<non-space>". A tokenizer must give the same ids
# for each pair joined as for its two halves apart.
CUT_PROBES = [("Hello world.\n", "Next line, here."), ("x = f(1);\n", "return x"), ("naïve café\n", "über 42"),
              ("1234\n", "5678"), ("end\n", "The start")]


class WorkerError(Exception):
    """An encoding worker process that ended without finishing its piece (killed, out of memory)."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: raised in the main thread so that the temporary files are removed."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def die(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------------------------------------
# Encoding a piece (in this process or in a worker)

_worker = {}


def init_worker(tokenizer_json, eos, dtype_name, jsonl_field, cut_inside_documents, own_threads):
    """tokenizer_json is the text of the tokenizer file the main process hashed (not the file again)."""
    if not own_threads:  # several worker processes: one thread each instead of a thread pool each
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        # A Ctrl-C reaches the whole process group: the main process stops the workers and cleans up.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker.update(tokenizer=Tokenizer.from_str(tokenizer_json), eos=eos, dtype=np.dtype(dtype_name),
                   field=jsonl_field, cut_inside=cut_inside_documents)


def decode_text(path, first_line, data):
    """data (whole lines of path from first_line on) as UTF-8 text; an invalid byte is an InputError."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        line = first_line + data.count(b"\n", 0, e.start)
        raise InputError(f"{path}:{line}: not valid UTF-8: byte 0x{data[e.start]:02x} at byte "
                         f"{e.start - line_start + 1} of the line ({e.reason}); text inputs must be UTF-8 (convert the "
                         f"file, e.g. with iconv)")


def check_encodable(text, where, field):
    """A JSON string can escape a lone surrogate ("\\udc80"), which is no character: refused."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f'{where}: field "{field}" holds the lone surrogate \\u{ord(text[e.start]):04x} at character '
                         f"{e.start + 1}, an escape that is not a Unicode character (no UTF-8 text holds it)")


def documents_of(path, first_line, data, ends_document):
    """[(text, ends_document)] of one piece: its documents, long ones in parts where they may be cut."""
    if is_jsonl(path):
        docs, field = [], _worker["field"]
        for number, line in enumerate(data.split(b"\n"), first_line):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except ValueError as e:
                raise InputError(f"{where} is not valid JSON: {e}")
            except RecursionError:
                raise InputError(f"{where} is not valid JSON: nested too deeply")
            if not isinstance(record, dict):
                raise InputError(f"{where} is not a JSON object")
            if field not in record:
                raise InputError(f'{where} has no field "{field}" (--jsonl-field names the field that holds the text)')
            text = record[field]
            if not isinstance(text, str):
                raise InputError(f'{where}: field "{field}" is {json.dumps(text)[:40]}, not a string')
            check_encodable(text, where, field)
            docs.append((text, True))
        return docs
    segments, current, size, start = [], [], 0, first_line  # segments: (bytes, ends_document, first line)
    lines = data.split(b"\n")
    for k, content in enumerate(lines):
        line = content + b"\n" if k < len(lines) - 1 else content
        if is_separator(line):
            segments.append((b"".join(current), True, start))
            current, size, start = [], 0, first_line + k + 1
            continue
        if size >= ENCODE_PART_BYTES and _worker["cut_inside"] and cut_is_safe(current[-1], line):
            segments.append((b"".join(current), False, start))
            current, size, start = [], 0, first_line + k
        current.append(line)
        size += len(line)
    segments.append((b"".join(current), ends_document, start))
    # Segments end at line ends, and no UTF-8 character holds a "\n" byte: each decodes on its own.
    return [(decode_text(path, line, s), ends) for s, ends, line in segments]


def encode_piece(task):
    """(token bytes, tokens, documents ended) of one piece."""
    path, first_line, data, ends_document = task
    docs = [(text, ends) for text, ends in documents_of(path, first_line, data, ends_document) if text]
    encodings = _worker["tokenizer"].encode_batch([text for text, _ in docs], add_special_tokens=False)
    ids, ended = [], 0
    for (_, ends), enc in zip(docs, encodings):
        ids.extend(enc.ids)
        if ends:
            ids.append(_worker["eos"])
            ended += 1
    return np.asarray(ids, dtype=_worker["dtype"]).tobytes(), len(ids), ended


def encoded_pieces(tasks, workers, init_args):
    """encode_piece of each (input index, task), in order, with at most 2 x workers pieces in flight."""
    if workers == 1:
        init_worker(*init_args, own_threads=True)
        for i, task in tasks:
            yield i, encode_piece(task)
        return
    ctx = multiprocessing.get_context("spawn")  # fresh processes: nothing inherited from this one
    # A ProcessPoolExecutor notices a worker that dies (multiprocessing.Pool would wait for its piece forever).
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx, initializer=init_worker,
                                                  initargs=(*init_args, False))
    try:
        in_flight = collections.deque()
        for i, task in tasks:
            in_flight.append((i, pool.submit(encode_piece, task)))
            if len(in_flight) >= 2 * workers:
                j, future = in_flight.popleft()
                yield j, future.result()
        while in_flight:
            j, future = in_flight.popleft()
            yield j, future.result()
    except concurrent.futures.process.BrokenProcessPool:
        raise WorkerError("tokenize_hf.py: an encoding worker process (--workers) ended before finishing its piece "
                          "(killed, e.g. by the out-of-memory killer, or crashed); nothing was written") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # after an error: the pieces being encoded, no more


# ---------------------------------------------------------------------------------------------
# Output

def npy_header(descr, length):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (descr, length)
    d = d.ljust(NPY_HEADER_BYTES - 11) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode("latin1")


class NpyAppender:
    """A 1-D .npy file written as tokens arrive; the header, written first with room for any length,
    gets the real length at close."""

    def __init__(self, path, descr):
        self.path, self.descr, self.tokens = path, descr, 0
        self.file = open(path, "wb")
        self.file.write(npy_header(descr, 0))

    def append(self, token_bytes, tokens):
        self.file.write(token_bytes)
        self.tokens += tokens

    def close(self):
        self.file.seek(0)
        self.file.write(npy_header(self.descr, self.tokens))
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()


def leftover_temp_pid(name):
    """The writer's process id of a temporary file a tokenize_hf.py or moetrain prepare run leaves
    when it is killed (".<stem>.npy.tmp-<pid>", ".dataset.json.tmp-<pid>", prepare's
    ".write-check.tmp-<pid>", and the older ".<stem>.npy.tmp-<pid>.tmp-<pid>"), or 0 for any other
    name."""
    def strip_tmp(n):
        head, sep, digits = n.rpartition(".tmp-")
        if not sep or not digits.isdigit() or len(digits) > 9 or not digits.isascii():
            return None, 0
        return head, int(digits)
    if len(name) < 2 or not name.startswith("."):
        return 0
    target, pid = strip_tmp(name[1:])
    if pid <= 0:
        return 0
    if target.endswith(".npy.tmp-" + str(pid)):
        target, _ = strip_tmp(target)
    if target not in ("dataset.json", "write-check") and not (len(target) > 4 and target.endswith(".npy")):
        return 0
    return pid


def refuse_leftover_temps(out, entries, append):
    """Exits naming the temporaries of an interrupted run in <out>: they were never part of the
    dataset, and this process did not create them, so they are not deleted here."""
    leftovers = [(name, leftover_temp_pid(name)) for name in entries]
    leftovers = [(name, pid) for name, pid in leftovers if pid > 0]
    if not leftovers:
        return
    running = []
    for _, pid in leftovers:
        try:
            os.kill(pid, 0)
            running.append(pid)
        except PermissionError:
            running.append(pid)
        except OSError:
            pass
    one = len(leftovers) == 1
    paths = [os.path.join(out, name) for name, _ in leftovers]
    if running:
        whose = (f"a process with the id in {'its' if one else 'a'} name ({running[0]}) is running: if it is a "
                 f"tokenize_hf.py or prepare writing into this folder, wait for it to end; otherwise "
                 f"{'it is' if one else 'they are'} safe to delete")
    else:
        whose = (f"the process that wrote {'it is' if one else 'them are'} gone, so "
                 f"{'it is' if one else 'they are'} safe to delete")
    die(f"tokenize_hf.py{' --append' if append else ''}: output folder {out} holds "
        f"{'a temporary file' if one else 'temporary files'} left by an interrupted tokenize_hf.py or prepare "
        f"({names_text(paths)}), never part of the dataset; {whose}. Delete {'it' if one else 'them'} and run "
        f"again; nothing was written")


def names_text(names, shown=5):
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def check_same_tokenizer(meta, meta_path, header, trust):
    """Exits unless the Hugging Face dataset.json `meta` was written with a tokenizer file of the same bytes.

    A dataset.json of an older tokenize_hf.py records no hash: with `trust` (--trust-tokenizer, the
    user's word that it is the same tokenizer) the append goes on when the tokenizer file's name
    matches, and the hash is recorded from then on; without it the append is refused."""
    recorded, file = meta.get("tokenizer_sha256"), meta.get("tokenizer_file")
    if recorded is None:
        same_name = os.path.basename(str(file)) == os.path.basename(header["tokenizer_file"])
        if trust and same_name:
            print(f"warning: {meta_path} records no tokenizer_sha256 (an older tokenize_hf.py wrote it); "
                  f"--trust-tokenizer: taking {header['tokenizer_file']} for the tokenizer its files were written "
                  f"with, and recording its sha256", file=sys.stderr)
            meta["tokenizer_sha256"] = header["tokenizer_sha256"]
            return
        die(f"tokenize_hf.py --append: {meta_path} records no tokenizer_sha256 (an older tokenize_hf.py wrote it), so "
            f"its files' tokenizer ({json.dumps(file)}) cannot be verified to be {header['tokenizer_file']}; "
            + ("pass --trust-tokenizer if it is that very file, or " if same_name and not trust else "")
            + "write these inputs into a new folder (training reads several: data.sources)")
    if recorded != header["tokenizer_sha256"]:
        die(f"tokenize_hf.py --append: {meta_path} was written with the tokenizer {json.dumps(file)} (sha256 "
            f"{str(recorded)[:16]}...), but --tokenizer {header['tokenizer_file']} is another file (sha256 "
            f"{header['tokenizer_sha256'][:16]}...): their ids would mix in one dataset; write into a new folder, "
            f"or pass the tokenizer file the dataset was written with")


def existing_dataset(out, append, header, inputs, names, trust=False):
    """The dataset.json that the new files are added to (None for a new or empty folder).

    Exits naming the problem when <out> holds anything and --append is not given, or when --append
    cannot add to it: a dataset.json from another tokenizer, a folder that does not match its
    dataset.json, or an input whose token file name is taken.
    """
    if not os.path.exists(out):
        return None
    if not os.path.isdir(out):
        die(f"tokenize_hf.py: output path {out} exists and is not a folder")
    entries = sorted(os.listdir(out))
    if not entries:
        return None
    refuse_leftover_temps(out, entries, append)
    if not append:
        advice = ("pass --append to add these inputs to the dataset there, or choose a new or empty folder"
                  if os.path.exists(os.path.join(out, "dataset.json")) else
                  "it holds no dataset.json, so --append cannot add to it either; choose a new or empty folder")
        die(f"tokenize_hf.py: output folder {out} is not empty (it holds {names_text(entries)}); nothing is "
            f"overwritten: {advice}")
    npy_on_disk = [e for e in entries if e.endswith(".npy") and os.path.isfile(os.path.join(out, e))]
    meta_path = os.path.join(out, "dataset.json")
    if not os.path.exists(meta_path):
        # Not a dataset this script or prepare wrote (they write dataset.json into a folder that was
        # new or empty): refused whatever it holds, rather than filled among the user's own files.
        unknown = " and what its .npy files hold is unknown" if npy_on_disk else ""
        die(f"tokenize_hf.py --append: {out} holds {names_text(npy_on_disk or entries)} but no dataset.json, so it "
            f"is not a dataset tokenize_hf.py or prepare wrote{unknown}; --append adds to such a dataset only: "
            f"write into a new or empty folder")
    else:
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (OSError, ValueError, RecursionError) as e:
            why = "nested too deeply" if isinstance(e, RecursionError) else e
            die(f"tokenize_hf.py --append: {meta_path} is not valid JSON ({why})")
        files = meta.get("files") if isinstance(meta, dict) else None
        if not isinstance(files, list) or not all(isinstance(f, dict) and isinstance(f.get("name"), str)
                                                  for f in files):
            die(f'tokenize_hf.py --append: {meta_path}: "files" must be an array of {{"name": ...}} objects')
        if meta.get("tokenizer") == header["tokenizer"]:
            check_same_tokenizer(meta, meta_path, header, trust)
        for key in ("tokenizer", "vocab_size", "eos_token_id", "dtype"):
            # type() as well: 257.0 == 257 in Python, but moetrain refuses a vocab_size that is no integer.
            if meta.get(key) != header[key] or type(meta.get(key)) is not type(header[key]):
                die(f'tokenize_hf.py --append: {meta_path} has "{key}": {json.dumps(meta.get(key))}, but this '
                    f"tokenizer gives {json.dumps(header[key])}, so the new files would not belong to that dataset")
        listed = [f["name"] for f in files]
        for name in listed:
            if not os.path.isfile(os.path.join(out, name)):
                die(f"tokenize_hf.py --append: {meta_path} lists {name}, but {os.path.join(out, name)} does not exist")
        unlisted = [e for e in npy_on_disk if e not in listed]
        if unlisted:
            die(f"tokenize_hf.py --append: {meta_path} does not list {names_text(unlisted)} found in {out}, so "
                f"training would refuse the folder; move such files out of it first")
    for path, name in zip(inputs, names):
        target = os.path.join(out, name)
        if name in (f["name"] for f in meta["files"]) or os.path.lexists(target):
            die(f"tokenize_hf.py --append: input {path} would become {target}, which already exists or is listed in "
                f"dataset.json; nothing was written. Rename the input (its stem names the token file)")
    return meta


# ---------------------------------------------------------------------------------------------
# Command line

def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def utf8_name(path):
    """Whether a path (as Python decodes the bytes of the command line) is valid UTF-8."""
    try:
        path.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def no_text(path, jsonl_field):
    records = f'; blank lines and records whose "{jsonl_field}" is "" hold none' if is_jsonl(path) else ""
    return f"tokenize_hf.py: input {path} holds no text (no document to tokenize{records}); nothing was written"


# SIGINT and SIGTERM raise Interrupted in the main thread, except while the output is renamed into
# place (defer): then the signal is noted and the renames finish.
_signals = {"defer": False, "deferred": None}


def on_signal(signum, frame):
    if _signals["defer"]:
        _signals["deferred"] = signum
        return
    raise Interrupted(signum)


def main(argv=None):
    """The command line: signals are turned into a clean stop (temporary files removed, exit 128 + signal)."""
    # A signal ignored at start stays ignored (a background job of a script starts with SIGINT
    # ignored; a Ctrl-C meant for the foreground job must not stop it), as moetrain prepare does.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(sig) is not signal.SIG_IGN}
    _signals.update(defer=False, deferred=None)
    try:
        tokenize(argv)
    except Interrupted as e:
        print(f"error: tokenize_hf.py: stopped by {signal.Signals(e.signum).name}; its temporary files were removed "
              f"and nothing was written", file=sys.stderr)
        sys.exit(128 + e.signum)
    finally:
        dataset_output.release_locks()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if _signals["deferred"] is not None:
        print(f"note: {signal.Signals(_signals['deferred']).name} arrived while the finished output was renamed into "
              f"place; the output is complete", file=sys.stderr)


def tokenize(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="text or JSONL files (.gz or .zst too), or Parquet files; each becomes "
                    "<stem>.npy")
    ap.add_argument("--tokenizer", required=True, help="path to a Hugging Face tokenizer.json")
    ap.add_argument("--out", required=True, help="output folder: new or empty, unless --append")
    ap.add_argument("--append", action="store_true",
                    help="add the inputs to the dataset already in --out (never overwrites a file)")
    ap.add_argument("--trust-tokenizer", action="store_true",
                    help="with --append to a dataset.json of an older tokenize_hf.py (no tokenizer hash): take "
                         "--tokenizer, a file of the recorded name, for the one its files were written with")
    ap.add_argument("--eos-id", type=int, help="EOS token id (default: looked up in the tokenizer)")
    ap.add_argument("--workers", type=positive_int, default=1,
                    help="encoding processes (default 1: this process, with the tokenizer's own threads)")
    ap.add_argument("--jsonl-field", default="text", help='the field of each JSONL record (the column of a Parquet '
                    'file) that holds its text (default "text")')
    ap.add_argument("--chunk-bytes", type=positive_int, default=DEFAULT_CHUNK_BYTES,
                    help=f"size of the pieces inputs are read and encoded in (default {DEFAULT_CHUNK_BYTES})")
    args = ap.parse_args(argv)
    if Tokenizer is None:
        die(f"tokenize_hf.py needs numpy and the Hugging Face 'tokenizers' package (scripts/setup.sh installs them "
            f"into .deps/python; or pip install numpy tokenizers): {IMPORT_ERROR}")

    # Check everything before creating anything. dataset.json records these names, and its readers take
    # it as UTF-8 (Python would write an escaped surrogate for each byte that is not: the C++ reader refuses).
    for what, path in [("tokenizer", args.tokenizer)] + [("input", p) for p in args.inputs]:
        if not utf8_name(path):
            die(f"tokenize_hf.py: the {what} file name {os.fsencode(path)!r} is not valid UTF-8, and dataset.json "
                f"records it; rename the file")
    for path in args.inputs:
        if os.path.isdir(path):
            die(f"tokenize_hf.py: input {path} is a directory; pass the files in it")
        if not os.path.exists(path):
            die(f"tokenize_hf.py: input file {path} does not exist")
        if not os.path.isfile(path):
            die(f"tokenize_hf.py: input {path} is not a regular file")
        if os.path.getsize(path) == 0:
            die(no_text(path, args.jsonl_field))
    first_with_stem = {}
    for p in args.inputs:
        stem = stem_of(p)
        if stem in first_with_stem:
            die(f"tokenize_hf.py: inputs {first_with_stem[stem]} and {p} would both become {stem}.npy; inputs must "
                "have distinct file stems (each becomes <stem>.npy): rename one, or give a file once")
        first_with_stem[stem] = p
    stems = list(first_with_stem)
    try:
        with open(args.tokenizer, "rb") as f:
            tokenizer_bytes = f.read()
        # Everything encodes with the tokenizer of these bytes, whose hash dataset.json records.
        tokenizer_json = tokenizer_bytes.decode("utf-8")
        tok = Tokenizer.from_str(tokenizer_json)
    except Exception as e:  # OSError, UnicodeDecodeError; the tokenizers package raises plain Exceptions
        die(f"tokenize_hf.py: cannot load tokenizer {args.tokenizer}: {e}")
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    eos = args.eos_id
    if eos is None:
        eos = next((tok.token_to_id(t) for t in EOS_CANDIDATES if tok.token_to_id(t) is not None), None)
        if eos is None:
            die(f"tokenize_hf.py: no EOS token among {EOS_CANDIDATES} in {args.tokenizer}; pass --eos-id")
    if not 0 <= eos < vocab_size:
        die(f"tokenize_hf.py: EOS id {eos} outside the vocabulary of size {vocab_size}")
    dtype_name, descr = ("uint16", "<u2") if vocab_size <= 65535 else ("uint32", "<u4")
    header = {"tokenizer": "huggingface", "tokenizer_file": args.tokenizer,
              "tokenizer_sha256": hashlib.sha256(tokenizer_bytes).hexdigest(), "vocab_size": vocab_size,
              "eos_token_id": eos, "dtype": dtype_name}
    names = [s + ".npy" for s in stems]
    def ids(text):
        return tok.encode(text, add_special_tokens=False).ids
    cut_inside = all(ids(a + b) == ids(a) + ids(b) for a, b in CUT_PROBES)
    if not cut_inside:
        print(f"note: {args.tokenizer} encodes the start of an input differently from the same text inside a "
              f"document, so every document is encoded whole (memory grows with the longest document)",
              file=sys.stderr)

    if os.path.exists(args.out) and not os.path.isdir(args.out):
        die(f"tokenize_hf.py: output path {args.out} exists and is not a folder")
    # One writer at a time per output folder, held until this run ends (python/dataset_output.py).
    try:
        created = dataset_output.lock_output_folder(args.out)
    except OSError as e:
        die(f"tokenize_hf.py: cannot create or lock the output folder {args.out}: {e}")
    suffix = f".tmp-{os.getpid()}"
    temps, files, writer = [], [], None

    def finish_file():
        writer.close()
        if writer.tokens == 0:
            raise InputError(no_text(args.inputs[current], args.jsonl_field))
        files.append({"name": names[current], "tokens": writer.tokens, "documents": documents,
                      "source": args.inputs[current]})
    try:
        meta = existing_dataset(args.out, args.append, header, args.inputs, names, args.trust_tokenizer) or \
            dict(header, files=[])
        meta_path = os.path.join(args.out, "dataset.json")
        replaceable = [meta_path] if os.path.exists(meta_path) else []  # read above, under the lock
        tasks = ((i, (path, *piece)) for i, path in enumerate(args.inputs)
                 for piece in pieces(path, args.chunk_bytes, cut_inside, args.jsonl_field))
        init_args = (tokenizer_json, eos, dtype_name, args.jsonl_field, cut_inside)
        current = -1
        documents = 0
        for i, (token_bytes, tokens, ended) in encoded_pieces(tasks, args.workers, init_args):
            while current < i:  # the next input's pieces begin (an input always yields a piece)
                if writer:
                    finish_file()
                current, documents = current + 1, 0
                temp = os.path.join(args.out, "." + names[current] + suffix)
                temps.append((temp, os.path.join(args.out, names[current])))
                writer = NpyAppender(temp, descr)
            writer.append(token_bytes, tokens)
            documents += ended
        finish_file()
        meta["files"] = meta["files"] + files
        temp = os.path.join(args.out, ".dataset.json" + suffix)
        temps.append((temp, os.path.join(args.out, "dataset.json")))
        with open(temp, "w") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
        # A signal from here on waits until the renames are done. dataset.json last: its new list marks
        # the new files as the dataset's. Anything created in the folder since it was checked is not
        # overwritten: then no new file is left.
        _signals["defer"] = True
        try:
            dataset_output.place_outputs(temps, replaceable)
        except FileExistsError as e:
            raise InputError(f"tokenize_hf.py: {e.filename} appeared while tokenizing; nothing was written, "
                             f"run again") from None
    except BaseException as e:
        _signals["defer"] = True  # a second Ctrl-C does not stop the cleanup
        if writer and not writer.file.closed:
            try:
                writer.file.close()
            except OSError:  # a full disk fails the flush of its last bytes again; the file is closed all the same
                pass
        for temp, _ in temps:
            if os.path.exists(temp):
                os.remove(temp)
        dataset_output.remove_empty_folders(created)
        if isinstance(e, (InputError, WorkerError)):
            die(str(e))
        if isinstance(e, OSError):  # writing: a full disk, a folder that cannot be created
            die(f"tokenize_hf.py: cannot write into {args.out}: {e}; its temporary files were removed")
        raise
    total = sum(f["tokens"] for f in files)
    print(f"wrote {len(files)} files, {total} tokens ({dtype_name}, vocab {vocab_size}, eos {eos}) to {args.out}; "
          f"dataset.json lists {len(meta['files'])}")


if __name__ == "__main__":
    main()
