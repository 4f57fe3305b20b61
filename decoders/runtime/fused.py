"""Fewer, bigger kernels for a GPU: the stand-ins `kernels.pack` swaps in on CUDA (float32).

Why: on a GPU a small model's step is bound by how many kernels it launches, not by its matmuls. SmolLM2-135M on an
H200 replayed one token as a CUDA graph in 4.4 ms, ~1100 kernels at ~4 µs each, where reading its weights takes
0.1 ms (bench/results/gpu-h200.md). Per decoder layer transformers launches six kernels per RMSNorm, three matmuls for
q, k and v, five kernels to rotate q and five more for k, and two matmuls for gate and up. The stand-ins:

  FusedRMSNorm    one call of PyTorch's fused `F.rms_norm` kernel (aten._fused_rms_norm on CUDA)   6 -> 1, twice
  FusedAttention  q, k, v as one matmul over their concatenated weights; the rotary embedding of q and k in one
                  pass over the (q | k) heads, which that matmul leaves side by side                    13 -> 6
  FusedMLP        gate and up as one matmul                                                              2 -> 1

Each computes what the module it stands for computes, on the same weights: the rotary products and the norm's
float32 math are the stock ones; a concatenated matmul sums each output in its own order, so logits move by float32
rounding (like oneDNN packing on the CPU; greedy outputs are compared with the baseline on the same kernels). The
stand-ins keep the stock state dict: q/k/v (gate/up) become views into one concatenated weight, so loading saved
drafter weights into a fused model writes through to what the fused matmul reads, and no weight is held twice. The
stock module is kept unregistered, for `unfuse` and for dtypes the fused path does not cover.

Only the Llama and Qwen2 families (SmolLM2, Qwen2.5-Coder): their attention and MLP are the code reproduced here.
Gemma's norm computes x * (1 + w) and is left as it is.
"""
from __future__ import annotations

import sys

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm")  # weight * x / rms(x) in float32: what F.rms_norm computes
ATTENTIONS = ("LlamaAttention", "Qwen2Attention")
MLPS = ("LlamaMLP", "Qwen2MLP")


class Fused(nn.Module):
    """A stand-in for a stock module: the stock one is kept (unregistered), its children stay registered under their
    own names, so the state dict is the stock one's."""

    def __init__(self, stock: nn.Module):
        super().__init__()
        self.__dict__["stock"] = stock


class FusedRMSNorm(Fused):
    """y = w * x / sqrt(mean(x²) + eps) as one fused kernel, on the same weight."""

    def __init__(self, norm: nn.Module):
        super().__init__(norm)
        self.weight = norm.weight  # (H,) the same Parameter
        self.eps = norm.variance_epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            return self.stock(x)  # bfloat16: transformers rounds twice (x normed, then times w); keep that
        return nn.functional.rms_norm(x, self.weight.shape, self.weight, self.eps)  # (..., H)


class Joined:
    """One weight (and bias) holding several linears' rows, each linear's weight a view of it: one matmul for all.

    If the linears' tensors were replaced (a module moved to another device or dtype gets new tensors) the views
    no longer share the joined storage: `tensors` joins them again, so the fused matmul never reads stale weights."""

    def __init__(self, linears: list[nn.Linear]):
        self.linears = linears
        self.join()

    def join(self) -> None:
        with torch.no_grad():
            self.weight = torch.cat([m.weight for m in self.linears])  # (O1 + O2 + ..., in)
            has_bias = self.linears[0].bias is not None
            self.bias = torch.cat([m.bias for m in self.linears]) if has_bias else None  # (O,) or None
            start = 0
            for m in self.linears:
                rows = m.out_features
                m.weight = nn.Parameter(self.weight[start:start + rows], requires_grad=False)  # (rows, in) view
                if has_bias:
                    m.bias = nn.Parameter(self.bias[start:start + rows], requires_grad=False)  # (rows,) view
                start += rows

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        storage = self.weight.untyped_storage().data_ptr()
        if any(m.weight.untyped_storage().data_ptr() != storage for m in self.linears):
            self.join()
        return self.weight, self.bias


def joined(stock: nn.Module, linears: list[nn.Linear]) -> Joined:
    """The stock module's Joined, made once and kept on it: fusing again after `unfuse` (bench switches kernels
    between runs) reads the very same joined tensors, so CUDA graphs captured before still read live weights."""
    kept = stock.__dict__.get("_speclab_joined")
    if kept is None or len(kept.linears) != len(linears) or any(a is not b for a, b in zip(kept.linears, linears)):
        kept = stock.__dict__["_speclab_joined"] = Joined(linears)
    return kept


class FusedAttention(Fused):
    """Llama/Qwen2 attention with q, k, v from one matmul and q, k rotated together; then transformers' own
    attention function over the stock module (sdpa, eager, ...), exactly as the stock forward calls it."""

    def __init__(self, attention: nn.Module):
        super().__init__(attention)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (attention.q_proj, attention.k_proj, attention.v_proj,
                                                              attention.o_proj)
        # unregistered: the linears' weights, views of the joined one, are what the state dict holds
        self.__dict__["qkv"] = joined(attention, [self.q_proj, self.k_proj, self.v_proj])
        self.head_dim = attention.head_dim
        self.query_heads = self.q_proj.out_features // self.head_dim
        self.key_heads = self.k_proj.out_features // self.head_dim
        extra = {"sliding_window": attention.sliding_window} if hasattr(attention, "sliding_window") else {}
        self.__dict__["extra"] = extra  # Qwen2 passes its window to the attention function
        self.__dict__["eager"] = sys.modules[type(attention).__module__].eager_attention_forward

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | None = None, past_key_values=None, **kwargs):
        if hidden_states.dtype != torch.float32:
            return self.stock(hidden_states, position_embeddings, attention_mask, past_key_values, **kwargs)
        stock = self.stock
        batch, width, _ = hidden_states.shape
        qkv = nn.functional.linear(hidden_states, *self.qkv.tensors())  # (B, w, (Hq + 2 Hkv) * hd)
        heads = qkv.view(batch, width, -1, self.head_dim).transpose(1, 2)  # (B, Hq + 2 Hkv, w, hd)
        rotating = self.query_heads + self.key_heads
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)  # (B, 1, w, hd)
        qk = heads[:, :rotating]  # (B, Hq + Hkv, w, hd): q and k side by side, a view
        qk = qk * cos + rotate_half(qk) * sin  # (B, Hq + Hkv, w, hd): the stock products, q and k in one pass
        query, key = qk[:, :self.query_heads], qk[:, self.query_heads:]  # (B, Hq, w, hd), (B, Hkv, w, hd)
        value = heads[:, rotating:]  # (B, Hkv, w, hd)
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, stock.layer_idx)
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(stock.config._attn_implementation, self.eager)
        out, weights = attend(stock, query, key, value, attention_mask,
                              dropout=0.0 if not self.training else stock.attention_dropout, scaling=stock.scaling,
                              **self.extra, **kwargs)  # (B, w, Hq, hd)
        return self.o_proj(out.reshape(batch, width, -1).contiguous()), weights  # (B, w, d)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(..., hd) -> (-x2, x1): the rotary embedding's half swap, as transformers' Llama writes it."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FusedMLP(Fused):
    """down(act(gate(x)) * up(x)) with gate and up as one matmul."""

    def __init__(self, mlp: nn.Module):
        super().__init__(mlp)
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.__dict__["gate_up"] = joined(mlp, [self.gate_proj, self.up_proj])
        self.act_fn = mlp.act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            return self.stock(x)
        gate, up = nn.functional.linear(x, *self.gate_up.tensors()).chunk(2, dim=-1)  # (..., I) each, views
        return self.down_proj(self.act_fn(gate) * up)  # (..., d)


STAND_INS = {**dict.fromkeys(NORMS, FusedRMSNorm), **dict.fromkeys(ATTENTIONS, FusedAttention),
             **dict.fromkeys(MLPS, FusedMLP)}


def fuse(model: nn.Module) -> int:
    """Swap every module with a stand-in for it (any device: tests run it on the CPU). Returns how many."""
    swapped = 0
    for parent in list(model.modules()):  # a stand-in's stock module is no child of it: never fused twice
        for name, child in list(parent.named_children()):
            make = STAND_INS.get(type(child).__name__)
            linears = [m for m in child.children() if hasattr(m, "in_features")]
            if make is not None and all(type(m) is nn.Linear for m in linears):  # not packed or int8 ones
                setattr(parent, name, make(child))
                swapped += 1
    return swapped


def unfuse(model: nn.Module) -> int:
    """The stock modules back (their weights stay views of the concatenations: the same values). Returns how many."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Fused):
                setattr(parent, name, child.stock)
                swapped += 1
    return swapped


def is_fused(model: nn.Module) -> bool:
    return any(isinstance(m, Fused) for m in model.modules())
