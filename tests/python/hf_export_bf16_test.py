#!/usr/bin/python3
"""`moetrain export-hf --dtype bf16` read the way transformers reads a Hugging Face folder.

Runs with Debian's python3-torch (1.13, /usr/bin/python3; CMake picks the interpreter from the
first line) and the `safetensors` package, whose torch loader is the one from_pretrained uses. The
shards load as torch.bfloat16 tensors equal to PyTorch's own rounding of the F32 export, and the
PyTorch reference model (python/reference/olmoe_ref.py) on those weights gives the logits that
`moetrain eval` gives after `import-hf` of the same folder.
"""
import json
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np
import torch
from safetensors.torch import load_file

from moe_test_util import MOETRAIN, SOURCE_DIR, moetrain_train, run

sys.path.insert(0, os.path.join(SOURCE_DIR, "python", "reference"))
from olmoe_ref import ModelConfig, forward  # noqa: E402

SEQ_LEN, BATCH = 16, 2
LOGITS_TOL = 1e-5  # relative to the largest logit: moetrain computes in FP32, the reference in float64


def load_hf_folder(folder):
    """{name: tensor} of a sharded Hugging Face folder, through its index, as from_pretrained reads it."""
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(load_file(os.path.join(folder, shard)))
    assert sorted(tensors) == sorted(weight_map), "the index and the shards disagree"
    return tensors


def fused_reference_params(hf, cfg):
    """The reference model's parameters (experts fused, float64) from per-expert Hub tensors."""
    params = {}
    for name, t in hf.items():
        if ".mlp.experts." not in name:
            params[name] = t.to(torch.float64)
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}.mlp.experts."
        experts = range(cfg.num_experts)
        params[p + "gate_up_proj"] = torch.stack(
            [torch.cat([hf[f"{p}{x}.gate_proj.weight"], hf[f"{p}{x}.up_proj.weight"]]) for x in experts]).double()
        params[p + "down_proj"] = torch.stack([hf[f"{p}{x}.down_proj.weight"] for x in experts]).double()
    return params


class HfExportBf16Test(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="moe-py-bf16-")
        path = lambda *p: os.path.join(cls.tmp, *p)  # noqa: E731
        moetrain_train(path("run"), ["train.steps=2"])
        run([MOETRAIN, "export-hf", path("run"), path("hf32")])
        run([MOETRAIN, "export-hf", path("run"), path("hf16"), "--dtype", "bf16"])
        cls.hf32, cls.hf16 = path("hf32"), path("hf16")
        with open(path("doc.txt"), "w") as f:
            f.write("".join(f"the quick brown fox {i} jumps over the lazy dog\n" for i in range(20)))
        run([MOETRAIN, "prepare", path("doc.txt"), "--out", path("data")])
        cls.tokens = np.load(path("data", "doc.npy")).astype(np.int64)
        run([MOETRAIN, "import-hf", path("hf16"), path("imported")])
        run([MOETRAIN, "eval", "--checkpoint", path("imported"), "--data", path("data"), "--logits", path("logits.npy"),
             "--set", f"train.seq_len={SEQ_LEN}", "--set", f"train.micro_batch_size={BATCH}", "--set",
             "run.device=cpu"])
        cls.moetrain_logits = np.load(path("logits.npy"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_shards_load_as_bfloat16_equal_to_pytorch_rounding_of_the_f32_export(self):
        f32, bf16 = load_hf_folder(self.hf32), load_hf_folder(self.hf16)
        self.assertEqual(sorted(f32), sorted(bf16))
        self.assertIn("model.layers.1.mlp.experts.7.up_proj.weight", bf16)
        for name, t in bf16.items():
            self.assertEqual(t.dtype, torch.bfloat16, name)
            self.assertEqual(f32[name].dtype, torch.float32, name)
            self.assertTrue(torch.equal(t.view(torch.int16), f32[name].to(torch.bfloat16).view(torch.int16)), name)
        with open(os.path.join(self.hf16, "config.json")) as f:
            config16 = json.load(f)
        with open(os.path.join(self.hf32, "config.json")) as f:
            config32 = json.load(f)
        self.assertEqual(config16.pop("torch_dtype"), "bfloat16")
        self.assertEqual(config32.pop("torch_dtype"), "float32")
        self.assertEqual(config16, config32)

    def test_reference_model_on_the_bf16_weights_gives_moetrains_logits_after_import(self):
        with open(os.path.join(self.hf16, "config.json")) as f:
            cfg = ModelConfig.from_dict(json.load(f))
        params = fused_reference_params(load_hf_folder(self.hf16), cfg)
        windows = np.stack([self.tokens[b * SEQ_LEN:b * SEQ_LEN + SEQ_LEN] for b in range(BATCH)])
        with torch.no_grad():
            logits = forward(params, cfg, torch.from_numpy(windows))["logits"].numpy()
        self.assertEqual(self.moetrain_logits.shape, logits.shape)
        err = np.max(np.abs(self.moetrain_logits - logits)) / np.max(np.abs(logits))
        self.assertLessEqual(err, LOGITS_TOL)
        # The F32 export's weights give other logits: the comparison sees the rounding.
        params32 = fused_reference_params(load_hf_folder(self.hf32), cfg)
        with torch.no_grad():
            logits32 = forward(params32, cfg, torch.from_numpy(windows))["logits"].numpy()
        self.assertGreater(np.max(np.abs(logits32 - logits)) / np.max(np.abs(logits)), 100 * LOGITS_TOL)


if __name__ == "__main__":
    unittest.main(verbosity=2)
