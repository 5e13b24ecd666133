"""python/wandb_sidecar.py with the real wandb package in offline mode (no network): the offline
run's history, read back from the run file wandb writes, holds every metrics.jsonl record at its
step, and a restarted sidecar adds nothing.

The run file (offline-run-*/run-<id>.wandb) is W&B's transaction log: a 7-byte header (":W&B",
magic 0xBEE1, version 0) then LevelDB-log blocks of 32 KiB, each record framed as
uint32 CRC-32 (seeded with the CRC of the type byte) | uint16 length | uint8 type (1 full,
2 first, 3 middle, 4 last) | data, holding serialized wandb_internal_pb2.Record messages. The
wandb package no longer ships a reader for it, so the few lines below read it."""
import glob
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import unittest
import zlib

from tracking_util import PYTHON_TOOLS, metrics, moe_metrics, require, train

wandb_internal_pb2 = require("wandb.proto.wandb_internal_pb2", "the W&B sidecar's offline test")

SIDECAR = os.path.join(PYTHON_TOOLS, "wandb_sidecar.py")
BLOCK = 32768


def transaction_log_records(path):
    """The Record messages of a .wandb file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:7] != b":W&B" + struct.pack("<HB", 0xBEE1, 0):
        raise AssertionError(f"{path}: not a W&B run file (header {data[:7]!r})")
    records, parts, at = [], b"", 7
    while at + 7 <= len(data):
        left = BLOCK - at % BLOCK
        if left < 7:  # a block's trailer
            at += left
            continue
        crc, length, kind = struct.unpack_from("<IHB", data, at)
        if length == 0 and kind == 0:  # zero padding to the end of the block
            at += left
            continue
        body = data[at + 7:at + 7 + length]
        if zlib.crc32(body, zlib.crc32(bytes([kind]))) != crc:
            raise AssertionError(f"{path}: record at byte {at} fails its CRC")
        parts += body
        at += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            records.append(record)
            parts = b""
    return records


def history(path):
    """{step: {key: value}} of a run file's history rows, without W&B's own _-keys."""
    rows = {}
    for r in transaction_log_records(path):
        if r.WhichOneof("record_type") == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            rows[r.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return rows


class WandbOffline(unittest.TestCase):
    def test_the_offline_run_history_holds_every_metrics_record_and_a_restart_adds_nothing(self):
        with tempfile.TemporaryDirectory(prefix="moe-wandb-offline-") as tmp:
            run_dir = os.path.join(tmp, "run")
            train(run_dir, sets=["train.steps=5", "train.eval_every=2"])
            wandb_dir = os.path.join(tmp, "wandb-files")
            os.makedirs(wandb_dir)
            env = dict(os.environ, WANDB_MODE="offline", WANDB_DIR=wandb_dir, WANDB_SILENT="true",
                       WANDB_CONFIG_DIR=os.path.join(tmp, "config"), WANDB_CACHE_DIR=os.path.join(tmp, "cache"),
                       WANDB_DATA_DIR=os.path.join(tmp, "data"), WANDB_DISABLE_GIT="true", WANDB_DISABLE_CODE="true")

            def sidecar():
                p = subprocess.run([sys.executable, SIDECAR, run_dir, "--project", "moetrain-test"], env=env,
                                   capture_output=True, text=True, timeout=120)
                self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
                return p.stdout

            self.assertIn("logged 5 steps", sidecar())
            [run_file] = glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb"))
            rows = history(run_file)
            records = metrics(run_dir)
            self.assertEqual(sorted(rows), [r["step"] for r in records])
            for r in records:
                want = moe_metrics.scalars(r)
                got = rows[r["step"]]
                self.assertEqual(sorted(got), sorted(want), f"step {r['step']}")
                for tag, v in want.items():
                    if math.isnan(v):
                        self.assertTrue(math.isnan(got[tag]), f"{tag} at step {r['step']}")
                    else:
                        self.assertEqual(got[tag], v, f"{tag} at step {r['step']}")
            self.assertIn("eval_loss", rows[2])
            self.assertIn("expert_load/layer_1", rows[5])

            self.assertIn("nothing new to log", sidecar())
            self.assertEqual(glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb")), [run_file])


if __name__ == "__main__":
    unittest.main()
