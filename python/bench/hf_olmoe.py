#!/usr/bin/env python3
"""Hugging Face transformers OlmoeForCausalLM peer of moetrain (issue 6).

bench-olmoe-4l dimensions through OlmoeConfig (d_model 2048, 4 layers, 16 heads, 64 experts
top-8, expert hidden 1024, vocab 50304, untied head), random init, one microbatch of
8 x 4096 random tokens per step, SDPA attention, fused AdamW (lr 4e-4, betas 0.9/0.95,
weight decay 0.1 on matrices), global-norm clip 1.0.

Precision (--precision):
  autocast     FP32 weights, BF16 autocast, fused AdamW on the FP32 weights (default; GPU.md)
  bf16-master  BF16 weights, FP32 master copy with fused AdamW, BF16 refresh (as torch_olmoe.py)

Experts backend (--experts-impl): transformers 5 dispatches OlmoeExperts through
config._experts_implementation ("eager", "grouped_mm", "batched_mm"; integrations/moe.py),
chosen with from_pretrained/_from_config(experts_implementation=...) or
model.set_experts_implementation(...). The backend in force is printed and reported.

The router aux loss follows the transformers default (output_router_logits=False: off);
--router-aux turns it on (coefficient 0.01).

MFU: moetrain's convention (6 x active matmul parameters + 12 x L x S x d per token, 989 TFLOP/s).
The last line printed is "RESULT_JSON {...}".
"""
import argparse
import json
import sys
import time

import torch

PEAK_TFLOPS = 989.0


def flops_per_token(d, L, heads, V, N, K, h, S):
    q_out = d
    matmul = d * V + L * (d * 3 * q_out + q_out * d + d * N + K * 3 * d * h)
    return 6.0 * matmul + 12.0 * L * S * q_out


def build(a, dtype):
    import transformers
    from transformers import OlmoeConfig, OlmoeForCausalLM

    cfg = OlmoeConfig(vocab_size=a.vocab, hidden_size=a.d_model, intermediate_size=a.expert_hidden,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.heads, num_experts=a.experts,
                      num_experts_per_tok=a.topk, max_position_embeddings=a.seq,
                      tie_word_embeddings=False, norm_topk_prob=False,
                      output_router_logits=a.router_aux, router_aux_loss_coef=0.01,
                      use_cache=False, eos_token_id=50279, pad_token_id=1)
    how = "_from_config(experts_implementation=...)"
    with torch.device(a.device):
        try:
            model = OlmoeForCausalLM._from_config(cfg, attn_implementation="sdpa",
                                                  experts_implementation=a.experts_impl, dtype=dtype)
        except (TypeError, ValueError) as e:
            print(f"_from_config(experts_implementation=...) refused: {e}", flush=True)
            model = OlmoeForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=dtype)
            if hasattr(model, "set_experts_implementation"):
                model.set_experts_implementation(a.experts_impl)
                how = "set_experts_implementation(...)"
            else:
                model.config._experts_implementation = a.experts_impl
                how = "config._experts_implementation"
    model = model.to(a.device)
    impl = getattr(model.config, "_experts_implementation", None)
    experts_cls = type(model.model.layers[0].mlp.experts).__name__ \
        if hasattr(model.model.layers[0].mlp, "experts") else type(model.model.layers[0].mlp).__name__
    print(f"transformers {transformers.__version__}: experts backend requested {a.experts_impl!r} "
          f"via {how}; in force {impl!r}; experts module {experts_cls}; "
          f"attention {getattr(model.config, '_attn_implementation', None)!r}", flush=True)
    if impl is not None and impl != a.experts_impl:
        print(f"WARNING: experts backend in force is {impl!r}, not {a.experts_impl!r}", flush=True)
    return model, impl


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experts-impl", default="grouped_mm", choices=["grouped_mm", "eager", "batched_mm"])
    p.add_argument("--precision", default="autocast", choices=["autocast", "bf16-master"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--expert-hidden", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--lr", type=float, default=4e-4)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--device", default="cuda", help="cpu only for a tiny functional check")
    p.add_argument("--router-aux", action="store_true", help="output_router_logits=True (aux loss 0.01)")
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    torch.manual_seed(0)
    B, S = a.batch, a.seq

    bf16_master = a.precision == "bf16-master"
    model, impl = build(a, torch.float32)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    if bf16_master:
        params = list(model.parameters())
        masters = [p.detach().clone() for p in params]
        for m in masters:
            m.grad = torch.zeros_like(m)
        model.to(torch.bfloat16)
        params = list(model.parameters())
        opt_params = masters
    else:
        opt_params = list(model.parameters())
    decay = [q for q in opt_params if q.ndim >= 2]
    no_decay = [q for q in opt_params if q.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    def step():
        tok = torch.randint(0, a.vocab, (B, S), device=a.device)
        if bf16_master:
            out = model(input_ids=tok, labels=tok, use_cache=False)
        else:
            with torch.autocast(a.device, dtype=torch.bfloat16):
                out = model(input_ids=tok, labels=tok, use_cache=False)
        out.loss.backward()
        with torch.no_grad():
            if bf16_master:
                torch._foreach_copy_([m.grad for m in masters], [q.grad for q in params])
                for q in params:
                    q.grad = None
            if a.clip > 0:
                torch.nn.utils.clip_grad_norm_(opt_params, a.clip, foreach=True)
            opt.step()
            if bf16_master:
                torch._foreach_copy_([q.data for q in params], masters)
            else:
                opt.zero_grad(set_to_none=True)
        return out.loss.detach()

    fpt = flops_per_token(a.d_model, a.layers, a.heads, a.vocab, a.experts, a.topk, a.expert_hidden, S)
    print(f"hf_olmoe: {B} x {S} tokens/step; params {n_params / 1e9:.3f}B; {fpt / 1e9:.3f} GFLOP/token; "
          f"precision {a.precision}; torch {torch.__version__}", flush=True)
    t0 = time.perf_counter()
    for i in range(a.warmup):
        l_ = step()
        sync()
        print(f"warmup {i}: loss {l_.item():.4f} ({time.perf_counter() - t0:.1f} s since start)", flush=True)
    sync()
    ts = time.perf_counter()
    losses = [step() for _ in range(a.steps)]
    sync()
    el = time.perf_counter() - ts
    tps = a.steps * B * S / el
    mfu = tps * fpt / (PEAK_TFLOPS * 1e12)
    peak_gb = torch.cuda.max_memory_allocated() / 1e9 if a.device == "cuda" else 0.0
    ls = [float(x) for x in losses]
    for i, l_ in enumerate(ls):
        print(f"step {i}: loss {l_:.4f}")
    print(f"tokens/s {tps:,.0f}   step {el / a.steps * 1e3:.1f} ms   MFU {mfu * 100:.1f}%   "
          f"peak memory {peak_gb:.1f} GB", flush=True)
    import transformers
    res = dict(bench="hf_olmoe", experts_impl=impl, experts_impl_requested=a.experts_impl,
               precision=a.precision, experts=a.experts, topk=a.topk, batch=B, seq=S, steps=a.steps,
               warmup=a.warmup, tokens_per_s=round(tps, 1), step_ms=round(el / a.steps * 1e3, 2),
               mfu=round(mfu, 4), peak_mem_gb=round(peak_gb, 2), final_loss=round(ls[-1], 4),
               params_b=round(n_params / 1e9, 4), torch=torch.__version__,
               transformers=transformers.__version__)
    print("RESULT_JSON " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
