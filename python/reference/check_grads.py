#!/usr/bin/python3
"""Self-check of the PyTorch reference.

    /usr/bin/python3 python/reference/check_grads.py [CONFIG.toml ...] [--seed S] [--entries N]

1. Gradients: autograd gradients of lm_loss, lb_loss, z_loss and loss against float64
   central finite differences for a few entries of every parameter tensor (the largest-|grad|
   entry plus N random ones), at the same seed that make_fixture.py would use.
2. Forward: the vectorized attention and MoE block against naive per-token loops written
   independently from the spec (RoPE by explicit pair rotation, top-K by sorting).
Prints the max relative error; exits non-zero if it exceeds the tolerance.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from olmoe_ref import DTYPE, attention, forward, moe_block  # noqa: E402
from make_fixture import draw, find_valid, load_config  # noqa: E402

FD_STEP = 1e-5
GRAD_TOL = 1e-5  # FD roundoff is ~1e-10 absolute; a real bug shows as O(1)
FWD_TOL = 1e-10
COMPONENTS = ("lm_loss", "lb_loss", "z_loss", "loss")


def rel_err(a: float, b: float, floor: float = 1e-4) -> float:
    """Relative error; below |g| = floor it turns into absolute error / floor, since the
    central difference itself carries ~1e-10 absolute roundoff at FD_STEP = 1e-5."""
    return abs(a - b) / max(abs(a), abs(b), floor)


def check_grads(cfg, tr, seed, entries, gen):
    P, tokens, targets = draw(cfg, tr, seed)
    names = list(P)
    Pg = {n: P[n].clone().requires_grad_(True) for n in names}
    out = forward(Pg, cfg, tokens, targets)
    ad = {}
    for c in COMPONENTS:
        gs = torch.autograd.grad(out[c], [Pg[n] for n in names], retain_graph=True, allow_unused=True)
        ad[c] = {n: (g if g is not None else torch.zeros_like(P[n])) for n, g in zip(names, gs)}

    def losses(Q):
        with torch.no_grad():
            o = forward(Q, cfg, tokens, targets)
        return {c: o[c].item() for c in COMPONENTS}

    worst = {c: (0.0, None) for c in COMPONENTS}
    max_abs, max_abs_at = 0.0, None
    n_checked = 0
    for n in names:
        flat = P[n].view(-1)
        idx = [int(ad["loss"][n].view(-1).abs().argmax())]
        idx += torch.randint(0, flat.numel(), (entries,), generator=gen).tolist()
        for i in idx:
            Q = dict(P)
            orig = flat[i].item()
            tp = P[n].clone(); tp.view(-1)[i] = orig + FD_STEP
            tm = P[n].clone(); tm.view(-1)[i] = orig - FD_STEP
            Q[n] = tp; lp = losses(Q)
            Q[n] = tm; lm = losses(Q)
            for c in COMPONENTS:
                fd = (lp[c] - lm[c]) / (2 * FD_STEP)
                a = ad[c][n].view(-1)[i].item()
                e = rel_err(a, fd)
                if abs(a - fd) > max_abs:
                    max_abs, max_abs_at = abs(a - fd), f"{c} {n}[{i}] |g| {abs(a):.3g}"
                if e > worst[c][0]:
                    worst[c] = (e, f"{n}[{i}] autograd {a:.9g} fd {fd:.9g}")
            n_checked += 1
    return worst, n_checked, (max_abs, max_abs_at)


# ----- naive forward pieces, written from the spec without reusing olmoe_ref helpers -----

def naive_rms(x, w, eps):
    return [x[i] / math.sqrt(sum(v * v for v in x) / len(x) + eps) * w[i] for i in range(len(x))]


def naive_attention(P, p, cfg, a):
    B, T, D = a.shape
    Hq, Hkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    eps, half = cfg.rms_norm_eps, hd // 2
    Wq, Wk, Wv, Wo = (P[p + f"self_attn.{x}_proj.weight"] for x in "qkvo")
    out = torch.zeros(B, T, D, dtype=DTYPE)
    for b in range(B):
        Q, K, V = [], [], []
        for t in range(T):
            q = (Wq @ a[b, t]).tolist(); k = (Wk @ a[b, t]).tolist(); v = (Wv @ a[b, t]).tolist()
            if cfg.qk_norm == "full":
                q = naive_rms(q, P[p + "self_attn.q_norm.weight"].tolist(), eps)
                k = naive_rms(k, P[p + "self_attn.k_norm.weight"].tolist(), eps)
            qh = [q[j * hd:(j + 1) * hd] for j in range(Hq)]
            kh = [k[j * hd:(j + 1) * hd] for j in range(Hkv)]
            vh = [v[j * hd:(j + 1) * hd] for j in range(Hkv)]
            if cfg.qk_norm == "per_head":
                qh = [naive_rms(x, P[p + "self_attn.q_norm.weight"].tolist(), eps) for x in qh]
                kh = [naive_rms(x, P[p + "self_attn.k_norm.weight"].tolist(), eps) for x in kh]

            def rope(x):  # rotate pair (i, i+hd/2) by angle t * theta^(-2i/hd)
                y = list(x)
                for i in range(half):
                    ang = t * cfg.rope_theta ** (-2.0 * i / hd)
                    c, s = math.cos(ang), math.sin(ang)
                    y[i] = x[i] * c - x[i + half] * s
                    y[i + half] = x[i + half] * c + x[i] * s
                return y
            Q.append([rope(x) for x in qh]); K.append([rope(x) for x in kh]); V.append(vh)
        for t in range(T):
            cat = []
            for j in range(Hq):
                g = j // (Hq // Hkv)
                sc = [sum(Q[t][j][d] * K[s][g][d] for d in range(hd)) / math.sqrt(hd) for s in range(t + 1)]
                mx = max(sc); ex = [math.exp(x - mx) for x in sc]; z = sum(ex)
                cat += [sum(ex[s] / z * V[s][g][d] for s in range(t + 1)) for d in range(hd)]
            out[b, t] = Wo @ torch.tensor(cat, dtype=DTYPE)
    return out


def naive_moe(P, p, cfg, m):
    B, T, D = m.shape
    N, K, H = cfg.num_experts, cfg.num_experts_per_tok, cfg.intermediate_size
    Wg, Wgu, Wd = P[p + "mlp.gate.weight"], P[p + "mlp.experts.gate_up_proj"], P[p + "mlp.experts.down_proj"]
    x = m.reshape(B * T, D)
    out = torch.zeros(B * T, D, dtype=DTYPE)
    counts = [0] * N
    Psum = [0.0] * N
    zsum = 0.0
    for t in range(B * T):
        lg = (Wg @ x[t]).tolist()
        if cfg.router_score == "softmax":
            mx = max(lg); ex = [math.exp(v - mx) for v in lg]; sc = [v / sum(ex) for v in ex]
        else:
            sc = [1.0 / (1.0 + math.exp(-v)) for v in lg]
        sel = sorted(range(N), key=lambda e: -sc[e])[:K]
        w = [sc[e] for e in sel]
        if cfg.norm_topk_prob:
            w = [v / sum(w) for v in w]
        for e, we in zip(sel, w):
            counts[e] += 1
            g = Wgu[e, :H] @ x[t]; u = Wgu[e, H:] @ x[t]
            out[t] += we * (Wd[e] @ (g / (1 + torch.exp(-g)) * u))
        if cfg.shared_expert_intermediate_size:
            g = P[p + "mlp.shared_expert.gate_proj.weight"] @ x[t]
            u = P[p + "mlp.shared_expert.up_proj.weight"] @ x[t]
            out[t] += P[p + "mlp.shared_expert.down_proj.weight"] @ (g / (1 + torch.exp(-g)) * u)
        for e in range(N):
            Psum[e] += sc[e]
        mx = max(lg)
        zsum += (mx + math.log(sum(math.exp(v - mx) for v in lg))) ** 2
    BT = B * T
    lb = (N / K) * sum(counts[e] / BT * Psum[e] / BT for e in range(N))
    return out.view(B, T, D), lb, zsum / BT


def check_forward(cfg, tr, seed, gen):
    P, _, _ = draw(cfg, tr, seed)
    B, T, D = int(tr["micro_batch_size"]), int(tr["seq_len"]), cfg.hidden_size
    worst = 0.0
    for l in range(cfg.num_hidden_layers):
        p = f"model.layers.{l}."
        a = torch.randn(B, T, D, generator=gen, dtype=DTYPE)
        ref, nv = attention(P, p, cfg, a), naive_attention(P, p, cfg, a)
        worst = max(worst, ((ref - nv).abs().max() / nv.abs().max()).item())
        if not cfg.is_dense_layer(l):
            out, lb, z, _ = moe_block(P, p, cfg, a)
            nout, nlb, nz = naive_moe(P, p, cfg, a)
            worst = max(worst, ((out - nout).abs().max() / nout.abs().max()).item(),
                        rel_err(lb.item(), nlb), rel_err(z.item(), nz))
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="*", default=[os.path.join(HERE, "..", "..", "tests", "fixtures", f)
                                                  for f in ("ref_tiny.toml", "ref_variants.toml")])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--entries", type=int, default=4, help="random entries per tensor (plus the max-|grad| one)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    ok = True
    for path in args.configs:
        cfg, tr, _ = load_config(path)
        seed, _ = find_valid(cfg, tr, args.seed, verbose=False)
        gen = torch.Generator().manual_seed(1234)
        worst, n, max_abs = check_grads(cfg, tr, seed, args.entries, gen)
        fwd = check_forward(cfg, tr, seed, gen)
        print(f"{os.path.basename(path)} (seed {seed}): {n} entries checked by finite differences")
        for c in COMPONENTS:
            e, where = worst[c]
            print(f"  d{c}: max rel err {e:.3e}  at {where}")
        print(f"  max abs err (all components) {max_abs[0]:.3e} at {max_abs[1]}")
        print(f"  forward vs naive loops: max rel err {fwd:.3e}")
        gmax = max(w[0] for w in worst.values())
        ok &= gmax < GRAD_TOL and fwd < FWD_TOL
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
