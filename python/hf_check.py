#!/usr/bin/env python3
"""Hugging Face OLMoE round trip against stock `transformers` (issue 4).

A. Train a small moetrain model, `moetrain export-hf` it, load it with
   OlmoeForCausalLM.from_pretrained and compare logits (first microbatch) and the mean loss
   over the same token windows with `moetrain eval`.
B. Create a random OlmoeForCausalLM in transformers, save it, `moetrain import-hf` it, and
   compare the same way.
Both in float32 on the CPU; the bar is a relative error of at most 1e-4.

Usage: python3 python/hf_check.py --moetrain build/moetrain [--workdir DIR]
Needs torch, transformers and numpy (present on the H200 machine's image). --workdir (default: a
new temporary folder) must be new or empty: the check writes its corpus, token data, run and
exports there.
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

TOL = 1e-4


def run(cmd):
    print("$", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True)
    print(out.stdout + out.stderr, flush=True)
    if out.returncode != 0:
        sys.exit(f"command failed ({out.returncode}): {' '.join(cmd)}")
    return out.stdout


def eval_loss(stdout):
    for line in stdout.splitlines():
        if "mean loss" in line:
            return float(line.split("mean loss")[1].split()[0])
    sys.exit("no 'mean loss' in moetrain eval output")


def windows(data_dir, seq_len, max_tokens):
    """The windows moetrain eval reads: seq_len + 1 tokens, stride seq_len, files in name order."""
    out, predicted = [], 0
    for path in sorted(glob.glob(os.path.join(data_dir, "*.npy"))):
        tokens = np.load(path)
        start = 0
        while start + seq_len + 1 <= len(tokens) and (max_tokens == 0 or predicted < max_tokens):
            out.append(np.asarray(tokens[start:start + seq_len + 1], dtype=np.int64))
            predicted += seq_len
            start += seq_len
    return out


def hf_reference(model, wins, batch):
    import torch
    import torch.nn.functional as F
    n = len(wins) // batch * batch
    first, total, count = None, 0.0, 0
    with torch.no_grad():
        for i in range(0, n, batch):
            x = torch.from_numpy(np.stack(wins[i:i + batch]))
            logits = model(input_ids=x[:, :-1]).logits.float()
            vocab = logits.shape[-1]
            if first is None:
                first = logits.reshape(-1, vocab).numpy()
            total += F.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1), reduction="sum").item()
            count += x[:, 1:].numel()
    return first, total / count


def compare(label, ours_logits, ours_loss, ref_logits, ref_loss):
    rel_logits = float(np.max(np.abs(ours_logits - ref_logits)) / np.max(np.abs(ref_logits)))
    rel_loss = abs(ours_loss - ref_loss) / abs(ref_loss)
    ok = rel_logits <= TOL and rel_loss <= TOL
    print(f"{label}: logits max rel error {rel_logits:.2e}, loss moetrain {ours_loss:.6f} vs transformers "
          f"{ref_loss:.6f} (rel {rel_loss:.2e}) -> {'PASS' if ok else 'FAIL'} (bar {TOL:g})", flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moetrain", required=True)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--tokens", type=int, default=8192)
    args = ap.parse_args()
    mt = os.path.abspath(args.moetrain)
    if not os.path.isfile(mt) or not os.access(mt, os.X_OK):
        sys.exit(f"error: --moetrain {args.moetrain} is not an executable file (build/moetrain after the build)")
    if args.workdir is not None:  # never among a user's files: corpus.txt, data/, run/ ... would replace theirs
        if os.path.exists(args.workdir) and not os.path.isdir(args.workdir):
            sys.exit(f"error: --workdir {args.workdir} exists and is not a folder")
        if os.path.isdir(args.workdir) and os.listdir(args.workdir):
            sys.exit(f"error: --workdir {args.workdir} is not empty; hf_check.py writes its corpus, data, run and "
                     f"exports there: give a new or empty folder")
    try:  # numpy too (the helpers above use it): a missing package is this one line, not a traceback
        global np
        import numpy as np
        import torch
        import transformers
        from transformers import OlmoeConfig, OlmoeForCausalLM
    except ImportError as e:
        sys.exit(f"error: hf_check.py needs numpy, torch and transformers ({e}): pip install numpy torch "
                 f"transformers")
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}", flush=True)
    work = args.workdir or tempfile.mkdtemp(prefix="hf-check-")
    try:
        os.makedirs(work, exist_ok=True)
    except OSError as e:
        sys.exit(f"error: cannot create --workdir {work}: {e.strerror}")
    seq_len, batch = 128, 8  # the tiny config's train.seq_len and train.micro_batch_size

    # Token data: byte-level text (vocab 257 fits the tiny model's 512).
    text = os.path.join(work, "corpus.txt")
    with open(text, "w") as f:
        src = open(__file__).read()
        for i in range(40):
            f.write(f"document {i}\n{src}\n")
    data = os.path.join(work, "data")
    run([mt, "prepare", text, "--out", data])
    wins = windows(data, seq_len, args.tokens)

    # A. moetrain -> transformers
    run_dir = os.path.join(work, "run")
    # Training runs wherever run.device = auto puts it (the GPU where there is one, which also
    # checks that GPU checkpoints load); evaluation runs on the CPU in FP32, for exact comparisons.
    run([mt, "train", "--steps", "40", "--set", f"run.dir={run_dir}", "--set", "train.log_every=20"])
    logits_a = os.path.join(work, "moetrain_a.npy")
    loss_a = eval_loss(run([mt, "eval", "--checkpoint", run_dir, "--data", data, "--tokens", str(args.tokens),
                            "--logits", logits_a, "--set", 'run.device="cpu"']))
    hf_a = os.path.join(work, "hf_export")
    run([mt, "export-hf", run_dir, hf_a])
    model_a = OlmoeForCausalLM.from_pretrained(hf_a, dtype=torch.float32).eval()
    ref_logits, ref_loss = hf_reference(model_a, wins, batch)
    ok_a = compare("export-hf (trained tiny model)", np.load(logits_a), loss_a, ref_logits, ref_loss)

    # B. transformers -> moetrain
    cfg = OlmoeConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, num_experts=8, num_experts_per_tok=2,
                      eos_token_id=511, pad_token_id=None, bos_token_id=None, initializer_range=0.1)
    model_b = OlmoeForCausalLM(cfg).eval()
    hf_b = os.path.join(work, "hf_random")
    model_b.save_pretrained(hf_b)
    print("saved random OlmoeForCausalLM:", sorted(os.listdir(hf_b)), flush=True)
    imported = os.path.join(work, "imported")
    run([mt, "import-hf", hf_b, imported])
    logits_b = os.path.join(work, "moetrain_b.npy")
    loss_b = eval_loss(run([mt, "eval", "--checkpoint", imported, "--data", data, "--tokens", str(args.tokens),
                            "--logits", logits_b, "--set", 'run.device="cpu"']))
    ref_logits, ref_loss = hf_reference(model_b, wins, batch)
    ok_b = compare("import-hf (random transformers model)", np.load(logits_b), loss_b, ref_logits, ref_loss)
    sys.exit(0 if ok_a and ok_b else 1)


if __name__ == "__main__":
    main()
