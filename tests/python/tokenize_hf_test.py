"""python/tokenize_hf.py: the ids are tokenizer.encode's for each document followed by EOS, the same
for any number of workers and any piece size, inputs stream in bounded pieces, JSONL errors name the
file and line and leave nothing behind, and moetrain trains on the output. Bad inputs are refused in
one line and leave nothing behind: text that is not UTF-8, file names that are not, inputs without
text, an --append with another tokenizer, a worker process that dies, SIGTERM and SIGINT.

The tokenizers are built here with the `tokenizers` package: a byte-level BPE (as GPT-2, Llama 3
and OLMoE use), a WordLevel with a whitespace pre-tokenizer, and a SentencePiece-style Metaspace
one, which marks the start of every input and so must get its documents whole.
"""
import gzip
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np
import pyarrow
import pyarrow.parquet
import zstandard
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import dataset_output
import token_inputs
import tokenize_hf
from moe_test_util import SOURCE_DIR, TempDirTest, moetrain_train, python_tool

WORDS = ("the quick brown fox jumps over the lazy dog while naïve café owners say über 42 times: "
         "x = f(1); return x").split()


def sentence(i):
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(5 + i % 9))


def training_text():
    return [sentence(i) + "\n" for i in range(300)]


def make_bpe(path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_text(), trainer)
    tok.save(path)


def make_wordlevel(path):
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(training_text(), trainers.WordLevelTrainer(special_tokens=["[UNK]", "</s>"]))
    tok.save(path)


def make_metaspace(path):
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "</s>"])
    tok.train_from_iterator(training_text(), trainer)
    tok.save(path)


# Documents of the text corpus: separated by form-feed lines ("\f\n", "\f\r\n"; the newline before one
# belongs to the document before it), one empty (no EOS), one with CRLF lines, long ones spanning
# many pieces at small piece sizes.
TEXT_DOCS = ["".join(sentence(i) + "\n" for i in range(120)),
             "short one\n",
             "",
             "crlf line one\r\ncrlf line two\r\n",
             "".join(sentence(i) + ("\n\n" if i % 4 == 0 else "\n") + ("  indented\n" if i % 5 == 0 else "")
                     for i in range(200, 330))]
JSONL_DOCS = [sentence(i) + "\nsecond line " + str(i) for i in range(60)] + ["", "tail: ünïcode ✓"]


def zstd_open(path, mode):
    """A zstd-compressed file to write, as gzip.open gives a gzip one."""
    assert mode == "wb"
    return zstandard.ZstdCompressor().stream_writer(open(path, "wb"), closefd=True)


def write_text_corpus(path, opener=open):
    with opener(path, "wb") as f:
        for k, doc in enumerate(TEXT_DOCS):
            f.write(doc.encode())
            if k + 1 < len(TEXT_DOCS):
                f.write(b"\f\r\n" if k == 2 else b"\f\n")


def write_jsonl_corpus(path, opener=open):
    with opener(path, "wb") as f:
        for k, doc in enumerate(JSONL_DOCS):
            f.write((json.dumps({"id": k, "text": doc}) + "\n").encode())
            if k == 10:
                f.write(b"\n")  # blank lines are skipped


def expected_ids(tokenizer_path, docs, eos):
    tok = Tokenizer.from_file(tokenizer_path)
    ids = []
    for doc in docs:
        if doc:
            ids += tok.encode(doc, add_special_tokens=False).ids + [eos]
    return ids


def write_big_text(path, copies=40):
    """A few MB of text: long enough that a run is still encoding when a test interrupts it."""
    block = "".join(sentence(i) + "\n" for i in range(2000))
    with open(path, "w") as f:
        for _ in range(copies):
            f.write(block)


def worker_processes(pid):
    """Pids of the multiprocessing worker processes (spawned) whose parent is pid."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(entry))
    return found


class TokenizeHfTest(TempDirTest):
    @classmethod
    def setUpClass(cls):
        cls.tokenizers = tempfile.mkdtemp(prefix="moe-py-tokenizers-")
        cls.bpe, cls.wordlevel, cls.metaspace = (os.path.join(cls.tokenizers, n) for n in ("bpe.json", "wl.json",
                                                                                             "ms.json"))
        make_bpe(cls.bpe)
        make_wordlevel(cls.wordlevel)
        make_metaspace(cls.metaspace)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tokenizers, ignore_errors=True)

    def setUp(self):
        super().setUp()
        self.text, self.jsonl = self.path("corpus.txt"), self.path("records.jsonl")
        write_text_corpus(self.text)
        write_jsonl_corpus(self.jsonl)

    def tokenize(self, out, *args, inputs=None, check=True, file_size_limit=None):
        return python_tool("tokenize_hf.py", "--out", self.path(out), *args, *(inputs or [self.text, self.jsonl]),
                           check=check, file_size_limit=file_size_limit)

    def npy(self, out, name):
        return np.load(self.path(out, name))

    def test_ids_are_tokenizer_encode_of_each_document_followed_by_eos(self):
        for tokenizer, eos_name in ((self.bpe, "<|endoftext|>"), (self.wordlevel, "</s>")):
            out = os.path.basename(tokenizer) + "-out"
            self.tokenize(out, "--tokenizer", tokenizer)
            eos = Tokenizer.from_file(tokenizer).token_to_id(eos_name)
            text_ids, jsonl_ids = self.npy(out, "corpus.npy"), self.npy(out, "records.npy")
            self.assertEqual(text_ids.dtype, np.uint16)
            self.assertEqual(text_ids.tolist(), expected_ids(tokenizer, TEXT_DOCS, eos))
            self.assertEqual(jsonl_ids.tolist(), expected_ids(tokenizer, JSONL_DOCS, eos))
            with open(self.path(out, "dataset.json")) as f:
                meta = json.load(f)
            self.assertEqual(meta["eos_token_id"], eos)
            with open(tokenizer, "rb") as f:
                self.assertEqual(meta["tokenizer_sha256"], hashlib.sha256(f.read()).hexdigest())
            self.assertEqual([(f["name"], f["tokens"], f["documents"]) for f in meta["files"]],
                             [("corpus.npy", text_ids.size, 4), ("records.npy", jsonl_ids.size, len(JSONL_DOCS) - 1)])

    def test_output_is_identical_for_1_and_3_workers_and_any_piece_size(self):
        self.tokenize("one", "--tokenizer", self.bpe)
        for out, args in (("three", ["--workers", "3"]), ("three-small", ["--workers", "3", "--chunk-bytes", "64"]),
                          ("one-tiny", ["--chunk-bytes", "1"])):
            self.tokenize(out, "--tokenizer", self.bpe, *args)
            for name in ("corpus.npy", "records.npy", "dataset.json"):
                with open(self.path("one", name), "rb") as a, open(self.path(out, name), "rb") as b:
                    self.assertEqual(a.read(), b.read(), f"{out}/{name}")

    def test_a_tokenizer_that_marks_input_starts_gets_whole_documents(self):
        r = self.tokenize("ms", "--tokenizer", self.metaspace, "--workers", "3", "--chunk-bytes", "64",
                          inputs=[self.text])
        self.assertIn("every document is encoded whole", r.stderr)
        eos = Tokenizer.from_file(self.metaspace).token_to_id("</s>")
        self.assertEqual(self.npy("ms", "corpus.npy").tolist(), expected_ids(self.metaspace, TEXT_DOCS, eos))
        # Cutting inside a document would have changed the ids: the check is not vacuous.
        tok = Tokenizer.from_file(self.metaspace)
        self.assertNotEqual(tok.encode("end\nThe start").ids, tok.encode("end\n").ids + tok.encode("The start").ids)

    def test_compressed_inputs_give_the_same_tokens(self):
        self.tokenize("plain", "--tokenizer", self.bpe)
        for ext, opener in ((".gz", gzip.open), (".zst", zstd_open)):
            write_text_corpus(self.path("z.txt" + ext), opener)
            write_jsonl_corpus(self.path("zr.jsonl" + ext), opener)
            self.tokenize(ext, "--tokenizer", self.bpe, "--chunk-bytes", "100",
                          inputs=[self.path("z.txt" + ext), self.path("zr.jsonl" + ext)])
            np.testing.assert_array_equal(self.npy(ext, "z.npy"), self.npy("plain", "corpus.npy"))
            np.testing.assert_array_equal(self.npy(ext, "zr.npy"), self.npy("plain", "records.npy"))
        # A highly compressible .zst (4 KB -> 40 MB) is read in linear time: consumed bytes were copied
        # again on every read (quadratic: 11 s for 36 MB), now about a second on 2 busy cores.
        data = b'{"text": "the same line again and again"}\n' * 1000000
        with open(self.path("rep.jsonl.zst"), "wb") as f:
            f.write(zstandard.ZstdCompressor(level=19).compress(data))
        start = time.monotonic()
        self.assertEqual(sum(len(p[1]) for p in token_inputs.pieces(self.path("rep.jsonl.zst"), 1 << 20, True)),
                         len(data))
        self.assertLess(time.monotonic() - start, 5.0)
        # A .zst of several frames (pzstd, `cat a.zst b.zst`) reads whole.
        with open(self.text, "rb") as f:
            text = f.read()
        with open(self.path("frames.txt.zst"), "wb") as f:
            for part in (text[:1000], text[1000:2000], text[2000:]):
                f.write(zstandard.ZstdCompressor().compress(part))
        self.tokenize("frames", "--tokenizer", self.bpe, inputs=[self.path("frames.txt.zst")])
        np.testing.assert_array_equal(self.npy("frames", "frames.npy"), self.npy("plain", "corpus.npy"))

    def test_a_parquet_column_gives_the_tokens_of_the_same_records_in_jsonl(self):
        # The JSONL corpus's records as Parquet rows, in small row groups: one document per row.
        docs = [json.loads(line)["text"] for line in open(self.jsonl, encoding="utf-8") if line.strip()]
        table = pyarrow.table({"id": list(range(len(docs))), "text": docs})
        pyarrow.parquet.write_table(table, self.path("records.parquet"), row_group_size=7)
        self.tokenize("plain", "--tokenizer", self.bpe, inputs=[self.jsonl])
        self.tokenize("pq", "--tokenizer", self.bpe, "--chunk-bytes", "100", "--workers", "2",
                      inputs=[self.path("records.parquet")])
        np.testing.assert_array_equal(self.npy("pq", "records.npy"), self.npy("plain", "records.npy"))
        # Errors name the file, and the row or the column.
        pyarrow.parquet.write_table(pyarrow.table({"body": ["a", None]}), self.path("nulls.parquet"))
        for args, needle in ((["--jsonl-field", "body"], 'nulls.parquet:2: column "body" is null'),
                             ([], 'nulls.parquet has no column "text"')):
            r = self.tokenize("bad", "--tokenizer", self.bpe, *args, inputs=[self.path("nulls.parquet")], check=False)
            self.assert_one_line_error(r, needle)
            self.assertFalse(os.path.exists(self.path("bad")))
        # A categorical (dictionary-encoded) column reads as its strings.
        pyarrow.parquet.write_table(pyarrow.table({"text": pyarrow.array(docs).dictionary_encode()}),
                                    self.path("cat.parquet"))
        self.tokenize("cat", "--tokenizer", self.bpe, inputs=[self.path("cat.parquet")])
        np.testing.assert_array_equal(self.npy("cat", "cat.npy"), self.npy("plain", "records.npy"))
        # Parquet does not check its strings' UTF-8: a bad one is named by row.
        offsets = pyarrow.py_buffer(np.array([0, 2, 6, 10], dtype=np.int32).tobytes())
        bad = pyarrow.Array.from_buffers(pyarrow.string(), 3, [None, offsets, pyarrow.py_buffer(b"okcaf\xe9fine")])
        pyarrow.parquet.write_table(pyarrow.table({"text": bad}), self.path("latin1.parquet"))
        self.assert_one_line_error(self.tokenize("bad", "--tokenizer", self.bpe, inputs=[self.path("latin1.parquet")],
                                                 check=False), 'latin1.parquet:2: column "text" is not valid UTF-8')
        two = pyarrow.Table.from_arrays([pyarrow.array(["a"]), pyarrow.array(["b"])], names=["text", "text"])
        pyarrow.parquet.write_table(two, self.path("two.parquet"))
        self.assert_one_line_error(self.tokenize("bad", "--tokenizer", self.bpe, inputs=[self.path("two.parquet")],
                                                 check=False), 'two.parquet has 2 columns named "text"')
        pyarrow.parquet.write_table(pyarrow.table({"text": [1, 2]}), self.path("ints.parquet"))
        self.assert_one_line_error(self.tokenize("bad", "--tokenizer", self.bpe, inputs=[self.path("ints.parquet")],
                                                 check=False), 'ints.parquet: column "text" holds int64, not strings')
        with open(self.path("fake.parquet"), "wb") as f:
            f.write(b"not parquet at all")
        self.assert_one_line_error(self.tokenize("bad", "--tokenizer", self.bpe, inputs=[self.path("fake.parquet")],
                                                 check=False), "cannot read", "fake.parquet", "as Parquet")

    def test_inputs_are_read_in_bounded_pieces_that_cover_the_file(self):
        big = self.path("big.txt")
        with open(big, "w") as f:
            for i in range(4000):
                f.write(sentence(i) + "\n" + ("\f\n" if i % 500 == 499 else ""))
        for path in (big, self.jsonl):
            with open(path, "rb") as f:
                data = f.read()
            longest_line = max(len(line) for line in data.split(b"\n")) + 1
            parts = list(token_inputs.pieces(path, 1000, True))
            self.assertEqual(b"".join(p[1] for p in parts), data)
            self.assertGreater(len(parts), len(data) // 2000, path)
            self.assertLessEqual(max(len(p[1]) for p in parts), 1000 + longest_line, path)
            self.assertEqual([p[2] for p in parts], [False] * (len(parts) - 1) + [True])

    def test_bad_jsonl_is_refused_naming_the_file_and_line_and_nothing_is_written(self):
        bad = self.path("bad.jsonl")
        cases = [(b'{"text": "fine"}\n{"txt": "no"}\n', 'bad.jsonl:2 has no field "text"'),
                 (b'{"text": "fine"}\n\n{"text": 5}\n', 'bad.jsonl:3: field "text" is 5, not a string'),
                 (b'{"text": "fine"}\n{"text": "cut\n', "bad.jsonl:2 is not valid JSON"),
                 (b'["text"]\n', "bad.jsonl:1 is not a JSON object"),
                 (b'{"text": "fine"}\n{"text": "caf\xe9"}\n', "bad.jsonl:2 is not valid JSON"),  # Latin-1, not UTF-8
                 # A JSON escape of a lone surrogate: no UTF-8 text holds it, and the tokenizer cannot take it.
                 (b'{"text": "fine"}\n{"text": "bad \\udc80 x"}\n',
                  'bad.jsonl:2: field "text" holds the lone surrogate \\udc80 at character 5'),
                 (b'{"text": "bad \\udc80 x"}\n', 'bad.jsonl:1: field "text" holds the lone surrogate'),
                 # Nested past Python's recursion limit: a RecursionError traceback before.
                 (b'{"text": "fine"}\n' + b"[" * 100000 + b"]" * 100000 + b"\n",
                  "bad.jsonl:2 is not valid JSON: nested too deeply")]
        for k, (content, needle) in enumerate(cases):
            with open(bad, "wb") as f:
                f.write(content)
            workers = "3" if k in (0, 6) else "1"  # an error in a worker process reaches the main one as well
            r = self.tokenize("out", "--tokenizer", self.bpe, "--workers", workers, inputs=[self.text, bad],
                              check=False)
            self.assert_one_line_error(r, needle)
            self.assertFalse(os.path.exists(self.path("out")), needle)
        with open(bad, "wb") as f:
            f.write(b'{"body": "the text"}\n')
        self.tokenize("body", "--tokenizer", self.bpe, "--jsonl-field", "body", inputs=[bad])
        eos = Tokenizer.from_file(self.bpe).token_to_id("<|endoftext|>")
        self.assertEqual(self.npy("body", "bad.npy").tolist(), expected_ids(self.bpe, ["the text"], eos))

    def test_a_corrupt_compressed_input_is_refused_naming_it_and_nothing_is_written(self):
        for name, opener in (("cut.txt.gz", gzip.open), ("cut.txt.zst", zstd_open)):
            with opener(self.path(name), "wb") as f:
                f.write(b"".join(sentence(i).encode() + b"\n" for i in range(2000)))
            with open(self.path(name), "r+b") as f:
                f.truncate(os.path.getsize(self.path(name)) // 2)
            r = self.tokenize("out", "--tokenizer", self.bpe, inputs=[self.text, self.path(name)], check=False)
            self.assert_one_line_error(r, "cannot read", name)
            self.assertFalse(os.path.exists(self.path("out")))

    def test_nothing_is_overwritten_and_append_adds_files(self):
        self.tokenize("data", "--tokenizer", self.bpe, inputs=[self.text])
        with open(self.path("data", "corpus.npy"), "rb") as f:
            before = f.read()
        self.assert_one_line_error(self.tokenize("data", "--tokenizer", self.bpe, inputs=[self.jsonl], check=False),
                                   "not empty", "--append")
        self.assert_one_line_error(self.tokenize("data", "--tokenizer", self.bpe, "--append", inputs=[self.text],
                                                 check=False), "corpus.npy", "already exists")
        self.tokenize("data", "--tokenizer", self.bpe, "--append", "--workers", "3", inputs=[self.jsonl])
        with open(self.path("data", "dataset.json")) as f:
            self.assertEqual([x["name"] for x in json.load(f)["files"]], ["corpus.npy", "records.npy"])
        with open(self.path("data", "corpus.npy"), "rb") as f:
            self.assertEqual(f.read(), before)
        self.assertEqual(sorted(os.listdir(self.path("data"))), ["corpus.npy", "dataset.json", "records.npy"])

    def test_a_full_disk_at_the_last_bytes_is_one_error_and_an_append_leaves_the_folder_as_it_was(self):
        # A file small enough to stay in the write buffer fails when it is closed; the cleanup closed
        # it again, which failed again: a traceback that left the temporary file in the way of the
        # next run. RLIMIT_FSIZE just below the file's size stands in for the full disk.
        small = self.path("small.txt")
        with open(small, "w") as f:
            f.write("".join(sentence(i) + "\n" for i in range(10)))
        self.tokenize("probe", "--tokenizer", self.bpe, inputs=[small])
        size = os.path.getsize(self.path("probe", "small.npy"))
        self.assertLess(size, 4096, "the whole file must fit in the write buffer")
        self.tokenize("data", "--tokenizer", self.bpe, inputs=[self.text])

        def contents():
            files = {}
            for name in os.listdir(self.path("data")):
                with open(self.path("data", name), "rb") as f:
                    files[name] = f.read()
            return files
        before = contents()
        r = self.tokenize("data", "--tokenizer", self.bpe, "--append", inputs=[small], check=False,
                          file_size_limit=size - 16)
        self.assert_one_line_error(r, self.path("data"), "File too large", "temporary files were removed")
        self.assertEqual(contents(), before)
        self.tokenize("data", "--tokenizer", self.bpe, "--append", inputs=[small])  # with room again

    def test_text_that_is_not_utf8_is_refused_naming_the_file_and_line(self):
        bad = self.path("latin1.txt")
        with open(bad, "wb") as f:
            f.write("".join(sentence(i) + "\n" for i in range(40)).encode())
            f.write(b"\f\nfirst line\nmenu: caf\xe9 au lait\n")
        for workers, chunk in (("1", "1048576"), ("3", "64")):  # the line number holds across pieces
            r = self.tokenize("out", "--tokenizer", self.bpe, "--workers", workers, "--chunk-bytes", chunk,
                              inputs=[self.text, bad], check=False)
            self.assert_one_line_error(r, "latin1.txt:43: not valid UTF-8: byte 0xe9 at byte 10 of the line")
            self.assertFalse(os.path.exists(self.path("out")))

    def test_a_file_name_that_is_not_utf8_is_refused_before_anything_is_written(self):
        name = os.fsdecode(b"caf\xe9.txt")  # Latin-1: what Python decodes it to, with a surrogate for the byte
        shutil.copy(self.text, self.path(name))
        r = self.tokenize("out", "--tokenizer", self.bpe, inputs=[self.path(name)], check=False)
        self.assert_one_line_error(r, "input file name", repr(os.fsencode(self.path(name))), "not valid UTF-8")
        self.assertFalse(os.path.exists(self.path("out")))
        shutil.copy(self.bpe, self.path(os.fsdecode(b"tok\xe9.json")))
        r = self.tokenize("out", "--tokenizer", self.path(os.fsdecode(b"tok\xe9.json")), check=False)
        self.assert_one_line_error(r, "tokenizer file name", "not valid UTF-8")

    def test_inputs_without_text_and_folders_are_refused_as_prepare_refuses_them(self):
        empties = {"empty.txt": b"", "separators.txt": b"\f\n\f\n", "blank.jsonl": b'\n \n{"text": ""}\n'}
        for name, content in empties.items():
            with open(self.path(name), "wb") as f:
                f.write(content)
        with gzip.open(self.path("empty.txt.gz"), "wb"):
            pass
        for name in list(empties) + ["empty.txt.gz"]:
            workers = "3" if name == "blank.jsonl" else "1"
            r = self.tokenize("out", "--tokenizer", self.bpe, "--workers", workers, inputs=[self.text, self.path(name)],
                              check=False)
            self.assert_one_line_error(r, f"input {self.path(name)} holds no text", "nothing was written")
            self.assertFalse(os.path.exists(self.path("out")), name)
        os.mkdir(self.path("folder"))
        r = self.tokenize("out", "--tokenizer", self.bpe, inputs=[self.text, self.path("folder")], check=False)
        self.assert_one_line_error(r, f"input {self.path('folder')} is a directory")

    def test_inputs_whose_stems_collide_are_named_and_nothing_is_written(self):
        os.mkdir(self.path("b"))
        other = self.path("b", "corpus.txt")
        write_text_corpus(other)
        for inputs, second in (([self.text, other], other), ([self.text, self.text], self.text)):
            r = self.tokenize("out", "--tokenizer", self.bpe, inputs=inputs, check=False)
            self.assert_one_line_error(r, f"inputs {self.text} and {second} would both become corpus.npy")
            self.assertFalse(os.path.exists(self.path("out")))

    def test_append_refuses_a_folder_neither_tool_wrote(self):
        # A folder of the user's own files, without dataset.json: --append wrote the token files and a
        # dataset.json among them. Now refused, naming what it holds, and left as it was.
        os.mkdir(self.path("mine"))
        with open(self.path("mine", "notes.txt"), "w") as f:
            f.write("the user's notes\n")
        r = self.tokenize("mine", "--tokenizer", self.bpe, "--append", inputs=[self.text], check=False)
        self.assert_one_line_error(r, f"{self.path('mine')} holds notes.txt but no dataset.json",
                                   "not a dataset tokenize_hf.py or prepare wrote", "new or empty folder")
        self.assertEqual(os.listdir(self.path("mine")), ["notes.txt"])
        # Without --append the refusal does not suggest it (it would be refused as above).
        r = self.tokenize("mine", "--tokenizer", self.bpe, inputs=[self.text], check=False)
        self.assert_one_line_error(r, "holds no dataset.json, so --append cannot add to it either")
        self.assertNotIn("pass --append", r.stderr)

    def test_append_refuses_another_tokenizer_and_a_dataset_whose_tokenizer_is_unknown(self):
        # Another tokenizer with the same vocabulary size, EOS and dtype: two tokens trade ids.
        with open(self.bpe) as f:
            other = json.load(f)
        vocab = other["model"]["vocab"]
        vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
        other_path, same_path = self.path("other.json"), self.path("same-bytes.json")
        with open(other_path, "w") as f:
            json.dump(other, f)
        shutil.copy(self.bpe, same_path)
        self.assertEqual(Tokenizer.from_file(other_path).get_vocab_size(),
                         Tokenizer.from_file(self.bpe).get_vocab_size())

        self.tokenize("data", "--tokenizer", self.bpe, inputs=[self.text])
        with open(self.path("data", "dataset.json"), "rb") as f:
            before = f.read()
        r = self.tokenize("data", "--tokenizer", other_path, "--append", inputs=[self.jsonl], check=False)
        self.assert_one_line_error(r, json.dumps(self.bpe), f"--tokenizer {other_path}", "sha256", "new folder")
        self.assertEqual(sorted(os.listdir(self.path("data"))), ["corpus.npy", "dataset.json"])
        with open(self.path("data", "dataset.json"), "rb") as f:
            self.assertEqual(f.read(), before)
        # The same bytes under another name are the same tokenizer.
        self.tokenize("data", "--tokenizer", same_path, "--append", inputs=[self.jsonl])

        # A dataset.json of an older tokenize_hf.py (no hash): its tokenizer cannot be verified.
        self.tokenize("old", "--tokenizer", self.bpe, inputs=[self.text])
        with open(self.path("old", "dataset.json")) as f:
            meta = json.load(f)
        del meta["tokenizer_sha256"]
        with open(self.path("old", "dataset.json"), "w") as f:
            json.dump(meta, f)
        r = self.tokenize("old", "--tokenizer", self.bpe, "--append", inputs=[self.jsonl], check=False)
        self.assert_one_line_error(r, "records no tokenizer_sha256", "cannot be verified", "--trust-tokenizer",
                                   "new folder")
        self.assertEqual(sorted(os.listdir(self.path("old"))), ["corpus.npy", "dataset.json"])
        # The user's word that it is that very file: appended, and the hash recorded from then on.
        r = self.tokenize("old", "--tokenizer", self.bpe, "--append", "--trust-tokenizer", inputs=[self.jsonl])
        self.assertIn("--trust-tokenizer", r.stderr)
        with open(self.path("old", "dataset.json")) as f:
            meta = json.load(f)
        self.assertEqual(len(meta["files"]), 2)
        self.assertIn("tokenizer_sha256", meta)
        # A vocab_size equal in value but not an integer (257.0): moetrain refuses such a folder, so
        # appending to it is refused too, naming the key.
        meta["vocab_size"] = float(meta["vocab_size"])
        with open(self.path("old", "dataset.json"), "w") as f:
            json.dump(meta, f)
        r = self.tokenize("old", "--tokenizer", self.bpe, "--append", inputs=[self.text], check=False)
        self.assert_one_line_error(r, '"vocab_size": %s' % json.dumps(meta["vocab_size"]))

    def start(self, out, *args, inputs):
        cmd = [sys.executable, os.path.join(SOURCE_DIR, "python", "tokenize_hf.py"), "--tokenizer", self.bpe,
               "--out", self.path(out), *args, *inputs]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))

    def finish(self, process):
        """CompletedProcess of a started run; a run that hangs fails the test."""
        try:
            out, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            self.fail("tokenize_hf.py hangs")
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def test_a_worker_process_that_dies_is_an_error_and_leaves_nothing_behind(self):
        write_big_text(self.path("big.txt"))
        p = self.start("out", "--workers", "2", "--chunk-bytes", "4096", inputs=[self.path("big.txt")])
        temp = self.path("out", f".big.npy.tmp-{p.pid}")  # the first piece is written: the workers are busy
        deadline = time.monotonic() + 30
        while not os.path.exists(temp) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        workers = worker_processes(p.pid)
        self.assertTrue(os.path.exists(temp) and workers, "no worker process while tokenizing")
        os.kill(workers[0], signal.SIGKILL)  # as the out-of-memory killer would
        self.assert_one_line_error(self.finish(p), "worker process", "nothing was written")
        self.assertFalse(os.path.exists(self.path("out")))

    def test_sigterm_and_sigint_remove_the_temporary_files(self):
        write_big_text(self.path("big.txt"))
        self.tokenize("data", "--tokenizer", self.bpe, inputs=[self.text])
        with open(self.path("data", "dataset.json"), "rb") as f:
            before = f.read()
        for out, sig, args in (("data", signal.SIGTERM, ["--append"]), ("new", signal.SIGINT, ["--workers", "2"])):
            p = self.start(out, "--chunk-bytes", "4096", *args, inputs=[self.path("big.txt")])
            temp = self.path(out, f".big.npy.tmp-{p.pid}")
            deadline = time.monotonic() + 30
            while not os.path.exists(temp) and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.002)
            self.assertTrue(os.path.exists(temp), f"no {temp} while tokenizing")
            p.send_signal(sig)
            r = self.finish(p)
            self.assert_one_line_error(r, f"stopped by {sig.name}", "temporary files were removed", code=128 + sig)
        self.assertEqual(sorted(os.listdir(self.path("data"))), ["corpus.npy", "dataset.json"])
        with open(self.path("data", "dataset.json"), "rb") as f:
            self.assertEqual(f.read(), before)
        self.assertFalse(os.path.exists(self.path("new")))

    def test_leftover_temporaries_of_a_killed_run_are_named_not_appended_past(self):
        # What a kill -9 leaves: the folder's dataset stays as it was, the temporary is in the way.
        self.tokenize("data", "--tokenizer", self.bpe, inputs=[self.text])
        leftover = self.path("data", ".more.npy.tmp-999999")
        with open(leftover, "wb") as f:
            f.write(b"partial")
        for args in ([], ["--append"]):
            r = self.tokenize("data", "--tokenizer", self.bpe, *args, inputs=[self.jsonl], check=False)
            self.assert_one_line_error(r, "left by an interrupted", ".more.npy.tmp-999999", "safe to delete",
                                       "nothing was written")
        self.assertEqual(sorted(os.listdir(self.path("data"))), [".more.npy.tmp-999999", "corpus.npy", "dataset.json"])
        os.remove(leftover)
        # moetrain prepare's write check, killed between creating and removing it, is named alike.
        self.assertEqual(tokenize_hf.leftover_temp_pid(".write-check.tmp-999999"), 999999)
        self.tokenize("data", "--tokenizer", self.bpe, "--append", inputs=[self.jsonl])

    def test_moetrain_trains_on_the_output(self):
        self.tokenize("data", "--tokenizer", self.bpe, "--workers", "3")
        vocab = Tokenizer.from_file(self.bpe).get_vocab_size()
        eos = Tokenizer.from_file(self.bpe).token_to_id("<|endoftext|>")
        r = moetrain_train(self.path("run"), ["train.steps=3", f"data.path={self.path('data')}",
                                              f"model.vocab_size={vocab}", f"model.eos_token_id={eos}"])
        self.assertIn("done after step 3", r.stdout)
        with open(self.path("run", "metrics.jsonl")) as f:
            losses = [json.loads(line)["loss"] for line in f if line.strip()]
        self.assertTrue(losses and all(np.isfinite(losses)), losses)


    def test_a_prepare_into_a_folder_this_is_creating_waits_for_it(self):
        # tokenize_hf.py creates new/data and is stopped (SIGSTOP) once a temporary file is there;
        # moetrain prepare --append into that folder waits for it, then judges the finished dataset.
        # Before, tokenize_hf.py held only the folder's parent, and prepare took its temporary file
        # for a killed run's.
        write_big_text(self.path("big.txt"))
        with open(self.path("bytes.txt"), "w") as f:
            f.write("some text for moetrain prepare\n" * 50)
        out = self.path("new", "data")
        tokenize = self.start(os.path.join("new", "data"), "--chunk-bytes", "4096", inputs=[self.path("big.txt")])
        temp = os.path.join(out, f".big.npy.tmp-{tokenize.pid}")
        deadline = time.monotonic() + 30
        while not os.path.exists(temp) and tokenize.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        tokenize.send_signal(signal.SIGSTOP)
        self.assertTrue(os.path.exists(temp), f"no {temp} while tokenizing")
        prepare = subprocess.Popen([os.path.join(os.environ["MOE_BINARY_DIR"], "moetrain"), "prepare",
                                    self.path("bytes.txt"), "--append", "--out", out],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # Resumed once prepare says it waits (30 s at most), not after a fixed time: a loaded machine
        # may take longer than any fixed time to start it.
        ready, _, _ = select.select([prepare.stderr], [], [], 30)
        first_line = prepare.stderr.readline() if ready else ""
        waited = prepare.poll() is None
        tokenize.send_signal(signal.SIGCONT)
        self.assertTrue(waited, "prepare did not wait for tokenize_hf.py: " + first_line)
        self.assertEqual(self.finish(tokenize).returncode, 0)
        err = first_line + prepare.communicate(timeout=60)[1]
        self.assertEqual(prepare.returncode, 1, err)
        self.assertIn(f"prepare: waiting for another prepare or tokenize_hf.py writing into {out} to finish", err)
        self.assertTrue(err.splitlines()[-1].startswith(f"error: prepare --append: {out}/dataset.json has"), err)
        self.assertEqual(sorted(os.listdir(out)), ["big.npy", "dataset.json"])


class LockOutputFolderTest(TempDirTest):
    """python/dataset_output.py's lock: released at the end of a run, so a second run in the same process
    (tokenize_hf.main called twice) does not wait for itself; made folders go again on failure."""

    def test_two_runs_into_one_folder_in_one_process_do_not_wait_for_each_other(self):
        out = self.path("new", "data")
        code = ("import sys, tokenize_hf\n"
                "for append in ([], ['--append']):\n"
                f"    tokenize_hf.main(['--tokenizer', sys.argv[1], '--out', {out!r}, *append,\n"
                "                      sys.argv[2 + len(append)]])\n")
        inputs = []
        for name in ("a.txt", "b.txt"):
            with open(self.path(name), "w") as f:
                f.write(sentence(len(inputs)) + "\n")
            inputs.append(self.path(name))
        make_bpe(self.path("bpe.json"))
        r = subprocess.run([sys.executable, "-c", code, self.path("bpe.json"), *inputs], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("waiting", r.stderr)
        self.assertEqual(sorted(os.listdir(out)), ["a.npy", "b.npy", "dataset.json"])

    def test_a_file_system_without_folder_locks_is_written_to_unlocked_and_said_once(self):
        # NFS answers flock on a folder opened read-only with EBADF; a test hook fakes it. Before, it failed.
        with open(self.path("a.txt"), "w") as f:
            f.write(sentence(1) + "\n")
        make_bpe(self.path("bpe.json"))
        r = subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "python", "tokenize_hf.py"), "--tokenizer",
                            self.path("bpe.json"), "--out", self.path("new", "data"), self.path("a.txt")],
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, MOE_TEST_NO_FOLDER_LOCKS="1"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr.count("cannot lock folders (NFS"), 1, r.stderr)
        self.assertEqual(sorted(os.listdir(self.path("new", "data"))), ["a.npy", "dataset.json"])

    def test_a_folder_that_cannot_be_made_leaves_none_of_the_folders_made_before_it(self):
        with self.assertRaises(OSError):  # new/ is made, then the name too long for a folder is not
            dataset_output.lock_output_folder(self.path("new", "x" * 300, "data"))
        self.assertFalse(os.path.exists(self.path("new")))
        dataset_output.release_locks()


class PlaceOutputsTest(TempDirTest):
    """python/dataset_output.py: all of the new files or none, and nothing replaced."""

    def write(self, name, text):
        with open(self.path(name), "w") as f:
            f.write(text)
        return self.path(name)

    def test_a_final_name_that_exists_stops_the_renames_and_removes_the_files_placed(self):
        renames = [(self.write(".a.tmp", "a"), self.path("a.npy")), (self.write(".b.tmp", "b"), self.path("b.npy")),
                   (self.write(".meta.tmp", "m"), self.path("dataset.json"))]
        self.write("b.npy", "mine")
        with self.assertRaises(FileExistsError) as caught:
            dataset_output.place_outputs(renames)
        self.assertEqual(caught.exception.filename, self.path("b.npy"))
        self.assertEqual(sorted(os.listdir(self.tmp)), [".a.tmp", ".b.tmp", ".meta.tmp", "b.npy"])
        with open(self.path("b.npy")) as f:
            self.assertEqual(f.read(), "mine")

    def test_only_a_replaceable_final_is_replaced(self):
        self.write("dataset.json", "old")
        renames = [(self.write(".a.tmp", "a"), self.path("a.npy")),
                   (self.write(".meta.tmp", "new"), self.path("dataset.json"))]
        with self.assertRaises(FileExistsError):
            dataset_output.place_outputs(renames)
        self.assertEqual(sorted(os.listdir(self.tmp)), [".a.tmp", ".meta.tmp", "dataset.json"])
        dataset_output.place_outputs(renames, replaceable=[self.path("dataset.json")])
        self.assertEqual(sorted(os.listdir(self.tmp)), ["a.npy", "dataset.json"])
        with open(self.path("dataset.json")) as f:
            self.assertEqual(f.read(), "new")

if __name__ == "__main__":
    unittest.main(verbosity=2)
