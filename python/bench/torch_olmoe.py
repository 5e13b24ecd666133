#!/usr/bin/env python3
"""Plain-PyTorch OLMoE-style trainer: the "careful PyTorch" peer of moetrain (issue 6).

Same model as configs/bench-olmoe-4l.toml: d_model 2048, 4 layers, 16 heads of 128, full
QK-norm over the projections, RoPE (theta 1e4), causal SDPA (cuDNN backend by default),
64 experts top-8 with expert hidden 1024, vocab 50304, untied LM head, no shared expert.

  * router: BF16 logits, FP32 softmax over all experts, top-K, no renormalisation (OLMoE);
    load-balancing loss (0.01) and z-loss (0.001) as moetrain computes them by default
  * dispatch: stable argsort of the (token, k) expert ids, gather, torch._grouped_mm SwiGLU
    experts with device-side offsets (no host sync), weighted index_add combine
  * BF16 weights and activations; FP32 master weights with fused AdamW
    (lr 4e-4, betas 0.9/0.95, weight decay 0.1 on matrices), global-norm clip 1.0;
    the BF16 weights are refreshed from the masters after each step
  * one microbatch of 8 x 4096 random tokens per step (learned routing on random data)

MFU uses moetrain's convention (src/moe/train/flops.cpp):
  6 x (attention projections + router + K routed experts + LM head) + 12 x L x S x d
FLOPs per token against 989 TFLOP/s.

Modes
  python3 torch_olmoe.py [--compile] [--experts N --topk K] [--steps S --warmup W]
  python3 torch_olmoe.py --moe-layer-only --experts N [--topk 4 --tokens 32768]
The last line printed is "RESULT_JSON {...}".
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PEAK_TFLOPS = 989.0


# --------------------------------------------------------------------------------------------
# MoE layer (shared by the model and --moe-layer-only)
# --------------------------------------------------------------------------------------------
def moe_forward(x, router_w, w13, w2, top_k, norm_topk=False, with_aux=True):
    """x (T, d) BF16; router_w (N, d); w13 (N, 2h, d) [gate; up]; w2 (N, d, h).

    Returns (out (T, d), aux_loss, z_loss) with the losses None when with_aux is False.
    """
    T, d = x.shape
    N = router_w.shape[0]
    logits = F.linear(x, router_w).float()                 # (T, N) FP32
    probs = logits.softmax(dim=-1)
    top_w, top_i = probs.topk(top_k, dim=-1)               # (T, K)
    if norm_topk:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)

    flat = top_i.reshape(-1)                               # (T*K,)
    sorted_ids, perm = torch.sort(flat, stable=True)       # argsort permutation
    token_of = perm // top_k                               # source token of each sorted row
    # cumulative group ends, computed on the device: no bincount (which syncs for its size)
    experts = torch.arange(N, device=x.device, dtype=sorted_ids.dtype)
    ends = torch.searchsorted(sorted_ids, experts, right=True)
    offs = ends.to(torch.int32)

    xs = x.index_select(0, token_of)                       # (T*K, d)
    h13 = torch._grouped_mm(xs, w13.transpose(-2, -1), offs=offs)   # (T*K, 2h)
    g, u = h13.chunk(2, dim=-1)
    a = F.silu(g) * u
    y = torch._grouped_mm(a, w2.transpose(-2, -1), offs=offs)      # (T*K, d)
    ws = top_w.reshape(-1).index_select(0, perm).to(y.dtype)
    y = y * ws.unsqueeze(-1)
    out = x.new_zeros(T, d).index_add(0, token_of, y)

    if not with_aux:
        return out, None, None
    with torch.no_grad():
        counts = torch.diff(ends, prepend=ends.new_zeros(1)).float()
    # Switch/OLMoE load balancing: N * sum_e f_e * P_e with f_e = assignments_e / T
    aux = N * torch.sum(counts / T * probs.mean(dim=0))
    z = torch.logsumexp(logits, dim=-1).square().mean()
    return out, aux, z


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------
def rope_tables(seq_len, head_dim, theta, device, dtype):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    pos = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(pos, inv)
    emb = torch.cat([freqs, freqs], dim=-1)                 # (S, hd), HF rotate_half layout
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x, cos, sin):
    # x (B, S, H, hd); cos/sin (S, hd)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos[None, :, None, :] + rot * sin[None, :, None, :]


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        d, N, h = a.d_model, a.experts, a.expert_hidden
        self.a = a
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.wqkv = nn.Parameter(torch.empty(3 * d, d))     # fused Q, K, V projection
        self.q_norm = nn.Parameter(torch.ones(d))           # full QK-norm over the projection
        self.k_norm = nn.Parameter(torch.ones(d))
        self.wo = nn.Parameter(torch.empty(d, d))
        self.mlp_norm = nn.Parameter(torch.ones(d))
        self.router = nn.Parameter(torch.empty(N, d))
        self.w13 = nn.Parameter(torch.empty(N, 2 * h, d))
        self.w2 = nn.Parameter(torch.empty(N, d, h))
        for p in (self.wqkv, self.wo, self.router, self.w13, self.w2):
            nn.init.normal_(p, std=a.init_std)

    def forward(self, x, cos, sin):
        a = self.a
        B, S, d = x.shape
        H, hd = a.heads, d // a.heads
        eps = a.eps
        hn = F.rms_norm(x, (d,), self.attn_norm, eps)
        q, k, v = F.linear(hn, self.wqkv).split(d, dim=-1)
        q = F.rms_norm(q, (d,), self.q_norm, eps).view(B, S, H, hd)
        k = F.rms_norm(k, (d,), self.k_norm, eps).view(B, S, H, hd)
        v = v.reshape(B, S, H, hd)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        o = o.transpose(1, 2).reshape(B, S, d)
        x = x + F.linear(o, self.wo)

        hn = F.rms_norm(x, (d,), self.mlp_norm, eps).view(B * S, d)
        y, aux, z = moe_forward(hn, self.router, self.w13, self.w2, a.topk,
                                with_aux=a.aux_coef > 0 or a.z_coef > 0)
        x = x + y.view(B, S, d)
        if aux is None:
            return x, x.new_zeros((), dtype=torch.float32)
        return x, a.aux_coef * aux + a.z_coef * z


def head_loss(x, norm_w, head_w, targets, eps):
    h = F.rms_norm(x, (x.shape[-1],), norm_w, eps)
    logits = F.linear(h, head_w)
    return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))


class Model(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.embed = nn.Parameter(torch.empty(a.vocab, a.d_model))
        self.blocks = nn.ModuleList([Block(a) for _ in range(a.layers)])
        self.final_norm = nn.Parameter(torch.ones(a.d_model))
        self.head = nn.Parameter(torch.empty(a.vocab, a.d_model))   # untied
        nn.init.normal_(self.embed, std=a.init_std)
        nn.init.normal_(self.head, std=a.init_std)
        self.head_loss = head_loss
        self.cos = self.sin = None

    def forward(self, tokens, targets):
        if self.cos is None:
            self.cos, self.sin = rope_tables(tokens.shape[1], self.a.d_model // self.a.heads,
                                             self.a.rope_theta, tokens.device, torch.bfloat16)
        x = F.embedding(tokens, self.embed)
        aux_total = 0.0
        for blk in self.blocks:
            x, aux = blk(x, self.cos, self.sin)
            aux_total = aux_total + aux
        loss = self.head_loss(x, self.final_norm, self.head, targets, self.a.eps)
        return loss + aux_total / len(self.blocks), loss


def flops_per_token(a):
    d, L, V = a.d_model, a.layers, a.vocab
    q_out = a.heads * (d // a.heads)
    kv_out = q_out                                          # num_key_value_heads == heads
    matmul = d * V + L * (d * (q_out + 2 * kv_out) + q_out * d + d * a.experts
                          + a.topk * 3 * d * a.expert_hidden)
    return 6.0 * matmul + 12.0 * L * a.seq * q_out


# --------------------------------------------------------------------------------------------
def setup_sdpa(mode, B, H, S, hd):
    """Prefer cuDNN attention (1.7x the flash backend on the H200, GPU.md); check it runs."""
    if mode == "default":
        return "default"
    if mode == "cudnn":
        torch.backends.cuda.enable_cudnn_sdp(True)
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_math_sdp(False)
        try:
            q = torch.randn(B, S, H, hd, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            q.requires_grad_(True)
            o = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            # the gradient arrives in the model's (B, S, H, hd) layout, transposed
            o.backward(torch.randn(B, S, H, hd, device="cuda", dtype=torch.bfloat16).transpose(1, 2))
            torch.cuda.synchronize()
            return "cudnn"
        except Exception as e:  # noqa: BLE001
            print(f"cuDNN SDPA unavailable ({type(e).__name__}: {str(e)[:200]}); using flash",
                  flush=True)
            mode = "flash"
    torch.backends.cuda.enable_cudnn_sdp(False)
    torch.backends.cuda.enable_flash_sdp(True)
    torch.backends.cuda.enable_mem_efficient_sdp(True)
    torch.backends.cuda.enable_math_sdp(True)
    return "flash"


def foreach_copy(dst, src):
    try:
        torch._foreach_copy_(dst, src)
    except Exception:  # noqa: BLE001  (older builds: no mixed-dtype foreach copy)
        for d_, s_ in zip(dst, src):
            d_.copy_(s_)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def peak_gb(dev):
    return torch.cuda.max_memory_allocated() / 1e9 if dev.type == "cuda" else 0.0


def run_model(a):
    dev = torch.device(a.device)
    B, S = a.batch, a.seq
    sdpa = setup_sdpa(a.sdpa, B, a.heads, S, a.d_model // a.heads) if dev.type == "cuda" else "cpu"

    torch.manual_seed(0)
    with torch.device(dev):
        model = Model(a)                                   # FP32 init on the GPU
    params = [p for p in model.parameters()]
    masters = [p.detach().clone() for p in params]         # FP32 master copy
    for m in masters:
        m.grad = torch.zeros_like(m)                       # FP32 gradient buffers, reused
    model.to(torch.bfloat16)
    params = [p for p in model.parameters()]
    n_params = sum(p.numel() for p in params)

    decay = [m for m in masters if m.ndim >= 2]
    no_decay = [m for m in masters if m.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)

    if a.compile:
        for blk in model.blocks:
            blk.compile(mode=a.compile_mode)
        model.head_loss = torch.compile(head_loss, mode=a.compile_mode)

    def step():
        tok = torch.randint(0, a.vocab, (B, S + 1), device=dev)
        total, lm = model(tok[:, :-1], tok[:, 1:])
        total.backward()
        with torch.no_grad():
            grads = [p.grad for p in params]
            foreach_copy([m.grad for m in masters], grads)
            for p in params:
                p.grad = None
            if a.clip > 0:
                torch.nn.utils.clip_grad_norm_(masters, a.clip, foreach=True)
            opt.step()
            foreach_copy([p.data for p in params], masters)   # BF16 refresh
        return lm

    fpt = flops_per_token(a)
    print(f"torch_olmoe: d {a.d_model} L {a.layers} heads {a.heads} N {a.experts} top-{a.topk} "
          f"h {a.expert_hidden} V {a.vocab}; {B} x {S} tokens/step; params {n_params / 1e9:.3f}B; "
          f"{fpt / 1e9:.3f} GFLOP/token; sdpa {sdpa}; compile {a.compile}; torch {torch.__version__}",
          flush=True)

    t0 = time.perf_counter()
    for i in range(a.warmup):
        lm = step()
        sync(dev)
        print(f"warmup {i}: loss {lm.item():.4f} ({time.perf_counter() - t0:.1f} s since start)",
              flush=True)
    sync(dev)
    t_start = time.perf_counter()
    step_ms = []
    losses = []
    for i in range(a.steps):
        ts = time.perf_counter()
        lm = step()
        losses.append(lm.detach())
        if a.sync_each_step:
            sync(dev)
            step_ms.append((time.perf_counter() - ts) * 1e3)
    sync(dev)
    elapsed = time.perf_counter() - t_start
    tokens = a.steps * B * S
    tps = tokens / elapsed
    mfu = tps * fpt / (PEAK_TFLOPS * 1e12)
    mem_gb = peak_gb(dev)
    ls = [float(x) for x in losses]
    for i, l_ in enumerate(ls):
        extra = f" {step_ms[i]:.1f} ms" if step_ms else ""
        print(f"step {i}: loss {l_:.4f}{extra}")
    print(f"tokens/s {tps:,.0f}   step {elapsed / a.steps * 1e3:.1f} ms   MFU {mfu * 100:.1f}%   "
          f"peak memory {mem_gb:.1f} GB", flush=True)
    res = dict(bench="torch_olmoe", compile=a.compile, experts=a.experts, topk=a.topk,
               batch=B, seq=S, steps=a.steps, warmup=a.warmup, tokens_per_s=round(tps, 1),
               step_ms=round(elapsed / a.steps * 1e3, 2), mfu=round(mfu, 4),
               peak_mem_gb=round(mem_gb, 2), final_loss=round(ls[-1], 4), sdpa=sdpa,
               params_b=round(n_params / 1e9, 4), gflop_per_token=round(fpt / 1e9, 4),
               torch=torch.__version__)
    print("RESULT_JSON " + json.dumps(res), flush=True)


# --------------------------------------------------------------------------------------------
def run_moe_layer(a):
    dev = torch.device("cuda")
    T, d, h, N, K = a.tokens, a.d_model, a.expert_hidden, a.experts, a.topk
    torch.manual_seed(0)
    x = torch.randn(T, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    router = (torch.randn(N, d, device=dev) * a.init_std).bfloat16().requires_grad_(True)
    w13 = (torch.randn(N, 2 * h, d, device=dev) * a.init_std).bfloat16().requires_grad_(True)
    w2 = (torch.randn(N, d, h, device=dev) * a.init_std).bfloat16().requires_grad_(True)
    gy = torch.randn(T, d, device=dev, dtype=torch.bfloat16)
    fn = moe_forward
    if a.compile:
        fn = torch.compile(moe_forward, mode=a.compile_mode)

    def once():
        for t in (x, router, w13, w2):
            t.grad = None
        y, _, _ = fn(x, router, w13, w2, K, with_aux=False)
        y.backward(gy)

    for _ in range(a.warmup if a.warmup > 0 else 5):
        once()
    torch.cuda.synchronize()
    times = []
    for _ in range(a.iters):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        once()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    ms = statistics.median(times)
    flops = 6.0 * T * K * 3 * d * h
    tf = flops / (ms * 1e-3) / 1e12
    peak_gb = torch.cuda.max_memory_allocated() / 1e9
    print(f"moe layer fwd+bwd: T {T} d {d} h {h} N {N} top-{K} compile {a.compile}: "
          f"median {ms:.2f} ms (min {min(times):.2f}, max {max(times):.2f}) over {a.iters}; "
          f"expert GEMMs {tf:.0f} TFLOP/s; peak memory {peak_gb:.1f} GB", flush=True)
    res = dict(bench="moe_layer", compile=a.compile, experts=N, topk=K, tokens=T, d_model=d,
               expert_hidden=h, ms=round(ms, 3), expert_tflops=round(tf, 1),
               peak_mem_gb=round(peak_gb, 2), torch=torch.__version__)
    print("RESULT_JSON " + json.dumps(res), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compile", action="store_true", help="torch.compile each block and the head+loss")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (default: inductor default)")
    p.add_argument("--experts", type=int, default=None, help="routed experts (default 64; layer mode needs it)")
    p.add_argument("--topk", type=int, default=None, help="experts per token (default 8; layer mode 4)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--expert-hidden", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--lr", type=float, default=4e-4)
    p.add_argument("--clip", type=float, default=1.0, help="global-norm clip (0 = off)")
    p.add_argument("--aux-coef", type=float, default=0.01, help="load-balancing loss (0 = off)")
    p.add_argument("--z-coef", type=float, default=0.001, help="router z-loss (0 = off)")
    p.add_argument("--sdpa", choices=["cudnn", "flash", "default"], default="cudnn")
    p.add_argument("--sync-each-step", action="store_true", help="also time each step (adds a sync)")
    p.add_argument("--moe-layer-only", action="store_true",
                   help="time one MoE layer forward+backward (T=--tokens, top-4 unless --topk)")
    p.add_argument("--tokens", type=int, default=32768, help="tokens for --moe-layer-only")
    p.add_argument("--iters", type=int, default=20, help="timed iterations for --moe-layer-only")
    p.add_argument("--device", default="cuda", help="cpu only for a tiny functional check")
    a = p.parse_args()
    a.init_std, a.eps, a.rope_theta = 0.02, 1e-5, 10000.0
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    if not hasattr(torch, "_grouped_mm"):
        sys.exit("torch._grouped_mm missing: needs PyTorch 2.9 or later")
    if a.moe_layer_only:
        a.experts = a.experts or 64
        a.topk = a.topk or 4
        run_moe_layer(a)
    else:
        a.experts = a.experts or 64
        a.topk = a.topk or 8
        run_model(a)


if __name__ == "__main__":
    main()
