"""Functional PyTorch reference of the moetrain OLMoE-family model (DESIGN.md sections 5, 10).

The model is a pure function of a dict of parameters keyed by their Hugging Face names
(experts fused as `mlp.experts.gate_up_proj` [N, 2H, D] and `mlp.experts.down_proj`
[N, D, H]). Everything runs in float64; the C++ model must match it within FP32 tolerance.

Run with Debian's interpreter (/usr/bin/python3, torch 1.13).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

DTYPE = torch.float64


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    num_experts: int
    num_experts_per_tok: int
    num_key_value_heads: Optional[int] = None  # default: num_attention_heads
    norm_topk_prob: bool = False
    router_score: str = "softmax"  # softmax | sigmoid
    qk_norm: str = "full"  # none | full | per_head
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    shared_expert_intermediate_size: int = 0
    first_k_dense_replace: int = 0
    dense_intermediate_size: int = 0
    router_aux_loss_coef: float = 0.01
    router_z_loss_coef: float = 0.001

    @staticmethod
    def from_dict(d: dict) -> "ModelConfig":
        names = {f.name for f in fields(ModelConfig)}
        cfg = ModelConfig(**{k: v for k, v in d.items() if k in names})
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        self.rope_theta = float(self.rope_theta)
        self.rms_norm_eps = float(self.rms_norm_eps)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be divisible by num_key_value_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even for RoPE")
        if self.router_score not in ("softmax", "sigmoid"):
            raise ValueError(f"router_score must be softmax|sigmoid, got {self.router_score!r}")
        if self.qk_norm not in ("none", "full", "per_head"):
            raise ValueError(f"qk_norm must be none|full|per_head, got {self.qk_norm!r}")
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError("need 1 <= num_experts_per_tok <= num_experts")
        if self.first_k_dense_replace > 0 and self.dense_intermediate_size <= 0:
            raise ValueError("first_k_dense_replace > 0 needs dense_intermediate_size > 0")
        if self.first_k_dense_replace > self.num_hidden_layers:
            raise ValueError("first_k_dense_replace > num_hidden_layers")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def is_dense_layer(self, l: int) -> bool:
        return l < self.first_k_dense_replace


def param_shapes(cfg: ModelConfig) -> Dict[str, tuple]:
    """All parameter names and shapes, in model order."""
    V, D, hd = cfg.vocab_size, cfg.hidden_size, cfg.head_dim
    Hq, Hkv, H, N = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size, cfg.num_experts
    S = cfg.shared_expert_intermediate_size
    out: Dict[str, tuple] = {"model.embed_tokens.weight": (V, D)}
    for l in range(cfg.num_hidden_layers):
        p = f"model.layers.{l}."
        out[p + "input_layernorm.weight"] = (D,)
        out[p + "self_attn.q_proj.weight"] = (Hq * hd, D)
        out[p + "self_attn.k_proj.weight"] = (Hkv * hd, D)
        out[p + "self_attn.v_proj.weight"] = (Hkv * hd, D)
        out[p + "self_attn.o_proj.weight"] = (D, Hq * hd)
        if cfg.qk_norm == "full":
            out[p + "self_attn.q_norm.weight"] = (Hq * hd,)
            out[p + "self_attn.k_norm.weight"] = (Hkv * hd,)
        elif cfg.qk_norm == "per_head":
            out[p + "self_attn.q_norm.weight"] = (hd,)
            out[p + "self_attn.k_norm.weight"] = (hd,)
        out[p + "post_attention_layernorm.weight"] = (D,)
        if cfg.is_dense_layer(l):
            Hd = cfg.dense_intermediate_size
            out[p + "mlp.gate_proj.weight"] = (Hd, D)
            out[p + "mlp.up_proj.weight"] = (Hd, D)
            out[p + "mlp.down_proj.weight"] = (D, Hd)
        else:
            out[p + "mlp.gate.weight"] = (N, D)
            out[p + "mlp.experts.gate_up_proj"] = (N, 2 * H, D)
            out[p + "mlp.experts.down_proj"] = (N, D, H)
            if S > 0:
                out[p + "mlp.shared_expert.gate_proj.weight"] = (S, D)
                out[p + "mlp.shared_expert.up_proj.weight"] = (S, D)
                out[p + "mlp.shared_expert.down_proj.weight"] = (D, S)
    out["model.norm.weight"] = (D,)
    out["lm_head.weight"] = (V, D)
    return out


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_cos_sin(T: int, hd: int, theta: float):
    inv_freq = theta ** (-torch.arange(0, hd, 2, dtype=DTYPE) / hd)  # [hd/2], theta^(-2i/hd)
    ang = torch.arange(T, dtype=DTYPE)[:, None] * inv_freq[None, :]  # [T, hd/2]
    emb = torch.cat([ang, ang], dim=-1)  # [T, hd]
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [B, heads, T, hd]; cos/sin [T, hd]
    return x * cos + rotate_half(x) * sin


def swiglu(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_gate.t()) * (x @ w_up.t())) @ w_down.t()


def attention(P: Dict[str, torch.Tensor], p: str, cfg: ModelConfig, a: torch.Tensor) -> torch.Tensor:
    B, T, D = a.shape
    Hq, Hkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    eps = cfg.rms_norm_eps
    q = a @ P[p + "self_attn.q_proj.weight"].t()  # [B, T, Hq*hd]
    k = a @ P[p + "self_attn.k_proj.weight"].t()  # [B, T, Hkv*hd]
    v = a @ P[p + "self_attn.v_proj.weight"].t()
    if cfg.qk_norm == "full":
        q = rms_norm(q, P[p + "self_attn.q_norm.weight"], eps)
        k = rms_norm(k, P[p + "self_attn.k_norm.weight"], eps)
    q = q.view(B, T, Hq, hd)
    k = k.view(B, T, Hkv, hd)
    v = v.view(B, T, Hkv, hd)
    if cfg.qk_norm == "per_head":
        q = rms_norm(q, P[p + "self_attn.q_norm.weight"], eps)
        k = rms_norm(k, P[p + "self_attn.k_norm.weight"], eps)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, T, hd]
    cos, sin = rope_cos_sin(T, hd, cfg.rope_theta)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    group = Hq // Hkv
    k = k.repeat_interleave(group, dim=1)  # query head j -> kv head j // group
    v = v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)  # [B, Hq, T, T]
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    s = s.masked_fill(causal, float("-inf"))
    o = torch.softmax(s, dim=-1) @ v  # [B, Hq, T, hd]
    o = o.transpose(1, 2).reshape(B, T, Hq * hd)
    return o @ P[p + "self_attn.o_proj.weight"].t()


def moe_block(P: Dict[str, torch.Tensor], p: str, cfg: ModelConfig, m: torch.Tensor):
    B, T, D = m.shape
    N, K, H = cfg.num_experts, cfg.num_experts_per_tok, cfg.intermediate_size
    x = m.reshape(B * T, D)
    logits = x @ P[p + "mlp.gate.weight"].t()  # [BT, N]
    if cfg.router_score == "softmax":
        scores = torch.softmax(logits, dim=-1)
    else:
        scores = torch.sigmoid(logits)
    top_w, top_i = torch.topk(scores, K, dim=-1, largest=True, sorted=True)  # descending
    if cfg.norm_topk_prob:
        top_w = top_w / top_w.sum(-1, keepdim=True)
    wgu = P[p + "mlp.experts.gate_up_proj"]  # [N, 2H, D]
    wd = P[p + "mlp.experts.down_proj"]  # [N, D, H]
    routed = torch.zeros_like(x)
    for e in range(N):
        tok, kk = torch.nonzero(top_i == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        y = swiglu(x[tok], wgu[e, :H], wgu[e, H:], wd[e])
        routed = routed.index_add(0, tok, top_w[tok, kk].unsqueeze(-1) * y)
    out = routed
    if cfg.shared_expert_intermediate_size > 0:
        out = out + swiglu(
            x,
            P[p + "mlp.shared_expert.gate_proj.weight"],
            P[p + "mlp.shared_expert.up_proj.weight"],
            P[p + "mlp.shared_expert.down_proj.weight"],
        )
    counts = torch.bincount(top_i.reshape(-1), minlength=N).to(DTYPE)  # constant, no grad
    frac = counts / (B * T)
    P_e = scores.mean(0)
    lb = (N / K) * (frac * P_e).sum()
    z = torch.logsumexp(logits, dim=-1).pow(2).mean()
    info = {"logits": logits.detach(), "scores": scores.detach(), "top_i": top_i, "counts": counts}
    return out.view(B, T, D), lb, z, info


def forward(P: Dict[str, torch.Tensor], cfg: ModelConfig, tokens: torch.Tensor,
            targets: Optional[torch.Tensor] = None) -> dict:
    """tokens, targets: int64 [B, T]. Returns logits [B*T, V], losses and routing info."""
    B, T = tokens.shape
    eps = cfg.rms_norm_eps
    h = P["model.embed_tokens.weight"][tokens]  # [B, T, D]
    lbs: List[torch.Tensor] = []
    zs: List[torch.Tensor] = []
    routing = []
    for l in range(cfg.num_hidden_layers):
        p = f"model.layers.{l}."
        a = rms_norm(h, P[p + "input_layernorm.weight"], eps)
        h = h + attention(P, p, cfg, a)
        m = rms_norm(h, P[p + "post_attention_layernorm.weight"], eps)
        if cfg.is_dense_layer(l):
            h = h + swiglu(m, P[p + "mlp.gate_proj.weight"], P[p + "mlp.up_proj.weight"],
                           P[p + "mlp.down_proj.weight"])
        else:
            out, lb, z, info = moe_block(P, p, cfg, m)
            h = h + out
            lbs.append(lb)
            zs.append(z)
            info["layer"] = l
            routing.append(info)
    h = rms_norm(h, P["model.norm.weight"], eps)
    logits = (h @ P["lm_head.weight"].t()).reshape(B * T, cfg.vocab_size)
    zero = torch.zeros((), dtype=DTYPE)
    lb_loss = torch.stack(lbs).mean() if lbs else zero
    z_loss = torch.stack(zs).mean() if zs else zero
    res = {"logits": logits, "lb_loss": lb_loss, "z_loss": z_loss, "routing": routing}
    if targets is not None:
        lm_loss = F.cross_entropy(logits, targets.reshape(-1))
        res["lm_loss"] = lm_loss
        res["loss"] = lm_loss + cfg.router_aux_loss_coef * lb_loss + cfg.router_z_loss_coef * z_loss
    return res


def routing_margin(routing: list, K: int) -> float:
    """Smallest gap between consecutive sorted scores among the top K+1 of any token in any
    MoE layer (covers both the K-th vs (K+1)-th boundary and the order inside the top K)."""
    best = float("inf")
    for info in routing:
        s = info["scores"]
        kk = min(K + 1, s.shape[-1])
        if kk < 2:
            continue
        top = torch.topk(s, kk, dim=-1).values
        gap = (top[:, :-1] - top[:, 1:]).min().item()
        best = min(best, gap)
    return best
