"""python/moetrain_checkpoint.py against the C++ CheckpointReader (tests/python/checkpoint_dump.cpp).

A tiny model trains under 2 MPI ranks with expert parallelism 2, so the experts' tensors and the
sharded AdamW moments are split over both rank files; every tensor the Python reader assembles
must equal the C++ reader's bit for bit, and a flipped byte must be refused by both, naming the
rank file and the tensor.
"""
import io
import json
import os
import shutil
import struct
import sys
import tempfile
import unittest

import numpy as np
import xxhash

import moetrain_checkpoint as mc
from moe_test_util import BINARY_DIR, SOURCE_DIR, TempDirTest, moetrain_train, python_tool, run

CHECKPOINT_DUMP = os.path.join(BINARY_DIR, "checkpoint_dump")


def cpp_tensors(ckpt_dir, out_dir, check=True):
    """The C++ reader's view: {name: (dtype, shape, stored bytes)}, or the failed run when check is False."""
    os.makedirs(out_dir)
    r = run([CHECKPOINT_DUMP, ckpt_dir, out_dir], check=check)
    if r.returncode != 0:
        return r
    with open(os.path.join(out_dir, "manifest.json")) as f:
        manifest = json.load(f)
    out = {}
    for name, t in manifest["tensors"].items():
        with open(os.path.join(out_dir, name + ".bin"), "rb") as f:
            out[name] = (t["dtype"], t["shape"], f.read())
    return out


def python_bytes(dtype, array):
    """The stored bytes behind a tensor the Python reader returned (BF16 comes back as float32)."""
    if dtype == "BF16":
        return (array.view(np.uint32) >> 16).astype("<u2").tobytes()
    return array.tobytes()


def chunk_location(rank_file, file_key):
    """(absolute byte offset, byte length) of tensor file_key's data in a safetensors file."""
    with open(rank_file, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    begin, end = header[file_key]["data_offsets"]
    return 8 + n + begin, end - begin


def write_safetensors(path, tensors):
    """A safetensors file of flat tensors [(name, dtype, raw bytes)], packed in order."""
    header, offset = {}, 0
    for name, dtype, raw in tensors:
        size = {"F32": 4, "BF16": 2, "I64": 8}[dtype]
        header[name] = {"dtype": dtype, "shape": [len(raw) // size], "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(raw for _, _, raw in tensors))


class CheckpointReaderTest(TempDirTest):
    @classmethod
    def setUpClass(cls):
        cls.shared = tempfile.mkdtemp(prefix="moe-py-ckpt-")
        cls.run_dir = os.path.join(cls.shared, "run")
        moetrain_train(cls.run_dir, ["train.steps=2", "train.save_every=1", "parallel.ep=2"], ranks=2)
        cls.step2 = os.path.join(cls.run_dir, "step-000002")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.shared, ignore_errors=True)

    def copy_checkpoint(self):
        dst = self.path("ckpt")
        shutil.copytree(self.step2, dst)
        return dst

    def test_every_tensor_equals_the_cpp_readers_bit_for_bit(self):
        loaded = mc.load(self.step2)
        expected = cpp_tensors(self.step2, self.path("cpp"))
        self.assertEqual(sorted(loaded["tensors"]), sorted(expected))
        self.assertEqual(loaded["step"], 2)
        ckpt = mc.Checkpoint(self.step2)
        for name, (dtype, shape, raw) in expected.items():
            array = loaded["tensors"][name]
            self.assertEqual(list(array.shape), shape, name)
            self.assertEqual(array.dtype, np.float32, name)
            self.assertEqual(python_bytes(dtype, array), raw, name)
        # What makes this a test of assembly: tensors whose chunks come from both rank files, and the moments.
        split = [n for n in expected if len({c[2] for c in ckpt.chunks(n)}) == 2]
        self.assertIn("model.layers.0.mlp.experts.gate_up_proj", split)
        self.assertIn("model.layers.1.mlp.experts.down_proj.exp_avg_sq", split)
        self.assertIn("lm_head.weight.exp_avg", loaded["tensors"])
        self.assertEqual(list(loaded["tensors"]["model.layers.0.mlp.experts.gate_up_proj"].shape), [8, 64, 16])
        self.assertIn("config", loaded["train_state"])
        self.assertEqual(ckpt.verify_all(), sum(len(raw) for _, _, raw in expected.values()))

    def test_a_run_folder_resolves_to_its_newest_checkpoint_unless_a_set_aside_excludes_it(self):
        self.assertEqual(mc.Checkpoint(self.run_dir).step, 2)
        self.assertEqual(mc.Checkpoint(os.path.join(self.run_dir, "latest")).step, 2)
        # A run folder that is itself named latest is that folder, as moetrain reads it.
        named_latest = self.path("exp", "latest")
        shutil.copytree(self.run_dir, named_latest)
        shutil.rmtree(os.path.join(named_latest, "step-000002"))
        self.assertEqual(mc.Checkpoint(named_latest).step, 1)
        run_dir = self.path("run")
        shutil.copytree(self.run_dir, run_dir)
        # An interrupted resume from step 1 is moving step-000002 away: readers must not pick it.
        with open(os.path.join(run_dir, ".set-aside.json"), "w") as f:
            json.dump({"after_step": 1, "dir": "20260101-000000-after-step-000001"}, f)
        self.assertEqual(mc.Checkpoint(run_dir).step, 1)
        self.assertEqual(os.path.basename(mc.resolve_checkpoint(run_dir)), "step-000001")
        with self.assertRaisesRegex(mc.CheckpointError, "no complete checkpoint"):
            mc.resolve_checkpoint(self.tmp)
        with self.assertRaisesRegex(mc.CheckpointError, "no-such-run does not exist"):
            mc.resolve_checkpoint(self.path("no-such-run"))
        # A copy under a name no save gives is not a checkpoint of the run, as moetrain reads it.
        copied = self.path("copied")
        shutil.copytree(self.run_dir, copied)
        shutil.copytree(os.path.join(copied, "step-000001"), os.path.join(copied, "step-99"))
        self.assertEqual(os.path.basename(mc.resolve_checkpoint(copied)), "step-000002")
        # A newer step-N without index.json is damage, as moetrain reads it: refused, not skipped.
        os.makedirs(os.path.join(copied, "step-000003"))
        with self.assertRaisesRegex(mc.CheckpointError, "step-000003 is newer than every complete checkpoint"):
            mc.resolve_checkpoint(copied)
        self.assertEqual(mc.Checkpoint(os.path.join(copied, "step-000002")).step, 2)

    def test_a_flipped_byte_is_refused_naming_the_rank_file_and_tensor(self):
        ckpt = self.copy_checkpoint()
        name = "model.layers.0.mlp.experts.down_proj.exp_avg"
        at, _ = chunk_location(os.path.join(ckpt, "rank-00001.safetensors"), name + "@2048")
        with open(os.path.join(ckpt, "rank-00001.safetensors"), "r+b") as f:
            f.seek(at + 5)
            byte = f.read(1)
            f.seek(at + 5)
            f.write(bytes([byte[0] ^ 0x10]))
        with self.assertRaises(mc.CheckpointError) as e:
            mc.load(ckpt)
        for needle in ("rank-00001.safetensors", f"tensor '{name}'", "checksum mismatch"):
            self.assertIn(needle, str(e.exception))
        mc.Checkpoint(ckpt).tensor("lm_head.weight")  # other tensors still read
        # The command line says the same in one line; the C++ reader refuses it too.
        self.assert_one_line_error(python_tool("moetrain_checkpoint.py", ckpt, check=False),
                                   "rank-00001.safetensors", name)
        self.assert_one_line_error(cpp_tensors(ckpt, self.path("cpp"), check=False),
                                   "rank-00001.safetensors", name, "checksum mismatch")

    def test_a_version_1_checkpoint_loads_unverified(self):
        ckpt = self.copy_checkpoint()
        with open(os.path.join(ckpt, "index.json")) as f:
            index = json.load(f)
        index["version"] = 1
        for t in index["tensors"].values():
            for c in t["chunks"]:
                del c["checksum"]
        with open(os.path.join(ckpt, "index.json"), "w") as f:
            json.dump(index, f)
        name = "lm_head.weight"
        at, _ = chunk_location(os.path.join(ckpt, "rank-00000.safetensors"), name + "@0")
        with open(os.path.join(ckpt, "rank-00000.safetensors"), "r+b") as f:
            f.seek(at + 3)  # the top byte of element 0
            f.write(bytes([0x7f]))
        loaded = mc.load(ckpt)
        self.assertEqual(loaded["version"], 1)
        self.assertFalse(mc.Checkpoint(ckpt).has_checksums)
        expected = cpp_tensors(ckpt, self.path("cpp"))
        for n, (dtype, _, raw) in expected.items():
            self.assertEqual(python_bytes(dtype, loaded["tensors"][n]), raw, n)
        original = mc.load(self.step2)["tensors"][name]
        changed = np.flatnonzero(loaded["tensors"][name] != original)
        self.assertEqual(changed.tolist(), [0])

    def test_bf16_and_int_chunks_of_several_files_assemble_like_the_cpp_reader(self):
        # A hand-made checkpoint: a BF16 [2, 3] tensor split over two rank files (and an empty
        # chunk), an I64 tensor in one, each chunk with its XXH3-64 checksum.
        ckpt = self.path("step-000007")
        os.makedirs(ckpt)
        bf16 = np.array([0x3f80, 0xc000, 0x0001, 0x7f80, 0x8000, 0x4049], dtype="<u2")  # 1, -2, tiny, inf, -0, 3.14
        ints = np.array([-5, 1 << 40, 7], dtype="<i8")
        pieces = {"rank-00000.safetensors": [("w@0", "BF16", bf16[:4].tobytes()), ("w@4", "BF16", b""),
                                             ("steps@0", "I64", ints.tobytes())],
                  "rank-00001.safetensors": [("w@4", "BF16", bf16[4:].tobytes())]}
        for file, tensors in pieces.items():
            write_safetensors(os.path.join(ckpt, file), tensors)

        def chunk(file, key, begin, end, raw):
            return {"file": file, "key": key, "begin": begin, "end": end,
                    "checksum": {"algorithm": "xxh3-64", "value": xxhash.xxh3_64_hexdigest(raw)}}
        index = {"format": "moetrain-checkpoint", "version": 2, "step": 7, "tensors": {
            "w": {"dtype": "BF16", "shape": [2, 3], "chunks": [
                chunk("rank-00001.safetensors", "w@4", 4, 6, bf16[4:].tobytes()),
                chunk("rank-00000.safetensors", "w@4", 4, 4, b""),
                chunk("rank-00000.safetensors", "w@0", 0, 4, bf16[:4].tobytes())]},
            "steps": {"dtype": "I64", "shape": [3], "chunks": [
                chunk("rank-00000.safetensors", "steps@0", 0, 3, ints.tobytes())]}}}
        with open(os.path.join(ckpt, "index.json"), "w") as f:
            json.dump(index, f)
        with open(os.path.join(ckpt, "train_state.json"), "w") as f:
            json.dump({"step": 7}, f)
        loaded = mc.load(ckpt)
        w = loaded["tensors"]["w"]
        self.assertEqual(w.dtype, np.float32)
        np.testing.assert_array_equal(w, np.array([[1, -2, 2.0 ** -133], [np.inf, -0.0, 3.140625]], np.float32))
        self.assertEqual(loaded["tensors"]["steps"].dtype, np.int64)
        np.testing.assert_array_equal(loaded["tensors"]["steps"], ints)
        expected = cpp_tensors(ckpt, self.path("cpp"))
        for name, (dtype, _, raw) in expected.items():
            self.assertEqual(python_bytes(dtype, loaded["tensors"][name]), raw, name)

    def test_a_gap_between_chunks_is_refused_naming_the_missing_elements(self):
        ckpt = self.copy_checkpoint()
        with open(os.path.join(ckpt, "index.json")) as f:
            index = json.load(f)
        chunks = index["tensors"]["model.layers.1.mlp.experts.gate_up_proj"]["chunks"]
        index["tensors"]["model.layers.1.mlp.experts.gate_up_proj"]["chunks"] = [c for c in chunks if c["begin"] != 0]
        with open(os.path.join(ckpt, "index.json"), "w") as f:
            json.dump(index, f)
        with self.assertRaisesRegex(mc.CheckpointError,
                                    r"elements \[0, 4096\) of tensor 'model.layers.1.mlp.experts.gate_up_proj' "
                                    r"are not stored in any chunk"):
            mc.Checkpoint(ckpt).tensor("model.layers.1.mlp.experts.gate_up_proj")
        # The verify mode refuses it too (it said every checksum matched and exited 0), as do a tensor
        # with no chunks, one whose shape is larger than its chunks, and a shape past a 64-bit count
        # (a numpy traceback before).
        self.assert_one_line_error(python_tool("moetrain_checkpoint.py", ckpt, check=False),
                                   "elements [0, 4096) of tensor 'model.layers.1.mlp.experts.gate_up_proj'")
        shutil.rmtree(ckpt)
        rows, cols = mc.Checkpoint(self.step2).shape("lm_head.weight")
        for change, message in ((lambda t: t.update(chunks=[]),
                                 f"elements [0, {rows * cols}) of tensor 'lm_head.weight'"),
                                (lambda t: t.update(shape=[rows + 1, cols]),
                                 f"elements [{rows * cols}, {(rows + 1) * cols}) of tensor 'lm_head.weight'"),
                                (lambda t: t.update(shape=[2**40, 2**40]), "more than a 64-bit count")):
            ckpt = self.copy_checkpoint()
            with open(os.path.join(ckpt, "index.json")) as f:
                index = json.load(f)
            change(index["tensors"]["lm_head.weight"])
            with open(os.path.join(ckpt, "index.json"), "w") as f:
                json.dump(index, f)
            self.assert_one_line_error(python_tool("moetrain_checkpoint.py", ckpt, check=False), message)
            shutil.rmtree(ckpt)

    def test_bytes_appended_to_a_rank_file_are_refused_by_both_readers_naming_the_file(self):
        ckpt = self.copy_checkpoint()
        rank_file = os.path.join(ckpt, "rank-00001.safetensors")
        with open(rank_file, "ab") as f:
            f.write(b"\0" * 16)
        expect = r"rank-00001\.safetensors: the tensors end at byte \d+ of the \d+-byte data section; the 16 bytes"
        with self.assertRaisesRegex(mc.CheckpointError, expect):
            mc.Checkpoint(ckpt)
        r = cpp_tensors(ckpt, self.path("cpp"), check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertRegex(r.stderr, expect)

    def test_deeply_nested_json_is_refused_in_one_line_naming_the_file(self):
        for name in ("train_state.json", "index.json"):
            ckpt = self.copy_checkpoint()
            with open(os.path.join(ckpt, name), "w") as f:
                f.write("[" * 100000)
            with self.assertRaisesRegex(mc.CheckpointError, f"{name} is not valid JSON: nested too deeply"):
                mc.Checkpoint(ckpt)
            self.assert_one_line_error(python_tool("moetrain_checkpoint.py", ckpt, check=False),
                                       os.path.join(ckpt, name), "nested too deeply")
            shutil.rmtree(ckpt)

    def test_command_line_without_numpy_says_what_to_install_in_one_line(self):
        # numpy made unimportable (a None entry in sys.modules), the script run as a command.
        script = os.path.join(SOURCE_DIR, "python", "moetrain_checkpoint.py")
        r = run([sys.executable, "-c", "import runpy, sys; sys.modules['numpy'] = None; "
                 f"sys.argv = [{script!r}, {self.step2!r}]; runpy.run_path({script!r}, run_name='__main__')"],
                check=False)
        self.assert_one_line_error(r, "moetrain_checkpoint.py needs numpy", "pip install numpy")

    def test_command_line_writes_one_tensor_and_never_overwrites(self):
        out = self.path("norm.npy")
        r = python_tool("moetrain_checkpoint.py", self.run_dir, "--tensor", "model.norm.weight", "--out", out)
        self.assertIn("model.norm.weight", r.stdout)
        np.testing.assert_array_equal(np.load(out), mc.Checkpoint(self.step2).tensor("model.norm.weight"))
        with open(out, "rb") as f:
            before = f.read()
        r = python_tool("moetrain_checkpoint.py", self.run_dir, "--tensor", "lm_head.weight", "--out", out,
                        check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("exists", r.stderr)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), before)
        # --list with --tensor/--out: refused (the write was skipped without a word).
        r = python_tool("moetrain_checkpoint.py", self.step2, "--list", "--tensor", "lm_head.weight", "--out",
                        self.path("l.npy"), check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--list only lists", r.stderr)
        listing = python_tool("moetrain_checkpoint.py", self.step2, "--list").stdout.splitlines()
        self.assertEqual(len(listing), len(mc.Checkpoint(self.step2).keys()))
        self.assertIn("model.layers.0.mlp.experts.gate_up_proj\tF32\t[8, 64, 16]\t2 chunk(s)", "\n".join(listing))
        summary = python_tool("moetrain_checkpoint.py", self.run_dir).stdout
        self.assertIn("step 2", summary)
        self.assertIn("checksum matches", summary)
        self.assert_one_line_error(python_tool("moetrain_checkpoint.py", self.run_dir, "--tensor", "nope",
                                               "--out", self.path("x.npy"), check=False), "tensor 'nope' not found")
        self.assertFalse(os.path.exists(self.path("x.npy")))

    def test_command_line_on_a_full_disk_names_the_reason_and_leaves_nothing(self):
        # RLIMIT_FSIZE stands in for a full disk. np.save's short write carries no reason: the error
        # said "cannot write ...: None".
        tensor = mc.Checkpoint(self.step2).tensor("lm_head.weight")
        out = self.path("head.npy")
        r = python_tool("moetrain_checkpoint.py", self.run_dir, "--tensor", "lm_head.weight", "--out", out,
                        check=False, file_size_limit=tensor.nbytes // 2)
        self.assert_one_line_error(r, out, "File too large")
        self.assertEqual(os.listdir(self.tmp), [])
        python_tool("moetrain_checkpoint.py", self.run_dir, "--tensor", "lm_head.weight", "--out", out)
        saved = io.BytesIO()
        np.save(saved, tensor)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), saved.getvalue())  # what np.save writes


if __name__ == "__main__":
    unittest.main(verbosity=2)
