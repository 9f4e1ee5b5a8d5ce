"""nn.Modules that drop into OpenFold3-style models. Parameter names follow OpenFold3's
TriangleAttention (layer_norm, linear_z, mha.linear_{q,k,v,o,g}), so its checkpoints load
unchanged with load_state_dict."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from .attention import triangle_attention
from .trimul import triangle_multiplicative_update


class _GatedAttentionProjections(nn.Module):
    """The projections of OpenFold3's gated multi-head Attention (no biases on q, k, v)."""

    def __init__(self, c_in: int, c_hidden: int, no_heads: int):
        super().__init__()
        self.linear_q = nn.Linear(c_in, c_hidden * no_heads, bias=False)
        self.linear_k = nn.Linear(c_in, c_hidden * no_heads, bias=False)
        self.linear_v = nn.Linear(c_in, c_hidden * no_heads, bias=False)
        self.linear_o = nn.Linear(c_hidden * no_heads, c_in)
        self.linear_g = nn.Linear(c_in, c_hidden * no_heads)


class TriangleAttention(nn.Module):
    """Triangle self-attention around the starting node (AF3 Algorithm 14) or, with
    starting=False, the ending node (Algorithm 15), on a pair tensor x: [*, I, J, c_in].

    c_hidden is the per-head width (OpenFold3's convention); the fused kernel runs on CUDA for
    c_hidden in {16, 32, 64, 128}. mask: [*, I, J], 1/True = valid.
    """

    def __init__(self, c_in: int, c_hidden: int, no_heads: int, starting: bool = True,
                 inf: float = 1e9, compensate: bool = True):
        super().__init__()
        self.c_in, self.c_hidden, self.no_heads = c_in, c_hidden, no_heads
        self.starting, self.inf, self.compensate = starting, inf, compensate
        self.layer_norm = nn.LayerNorm(c_in)
        self.linear_z = nn.Linear(c_in, no_heads, bias=False)
        self.mha = _GatedAttentionProjections(c_in, c_hidden, no_heads)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if not self.starting:
            x = x.transpose(-2, -3)
            mask = mask.transpose(-1, -2) if mask is not None else None
        lead = x.shape[:-3]
        x = self.layer_norm(x).reshape(-1, *x.shape[-3:])            # [B, I, J, C]
        B, I, J, _ = x.shape
        H, c = self.no_heads, self.c_hidden
        # [B, 1, H, I, J], contiguous so that the kernel streams it with vector loads
        bias = self.linear_z(x).permute(0, 3, 1, 2).unsqueeze(1).contiguous()

        def heads(t):  # [B, I, J, H*c] -> [B, I, H, J, c], a view of OpenFold3's layout
            return t.view(B, I, J, H, c).transpose(-2, -3)

        q, k, v = heads(self.mha.linear_q(x)), heads(self.mha.linear_k(x)), heads(self.mha.linear_v(x))
        attn_mask = None
        if mask is not None:
            attn_mask = mask.reshape(B, I, 1, 1, J).to(torch.bool)
        o = triangle_attention(q, k, v, bias, attn_mask, scale=1.0 / math.sqrt(c),
                               compensate=self.compensate)              # [B, I, H, J, c]
        o = o.transpose(-2, -3) * torch.sigmoid(self.mha.linear_g(x)).view(B, I, J, H, c)
        o = self.mha.linear_o(o.reshape(B, I, J, H * c)).reshape(*lead, I, J, self.c_in)
        if not self.starting:
            o = o.transpose(-2, -3)
        return o


TriangleAttentionStartingNode = TriangleAttention


class TriangleAttentionEndingNode(TriangleAttention):
    def __init__(self, c_in: int, c_hidden: int, no_heads: int, inf: float = 1e9,
                 compensate: bool = True):
        super().__init__(c_in, c_hidden, no_heads, starting=False, inf=inf, compensate=compensate)


class TriangleMultiplicativeUpdate(nn.Module):
    """AF3 Algorithms 12 (outgoing) and 13 (incoming) on a pair tensor z: [*, N, N, c_z], with
    OpenFold3's parameter names (linear_a_p, linear_a_g, linear_b_p, linear_b_g, linear_g,
    linear_z, layer_norm_in, layer_norm_out), so its checkpoints load unchanged.
    mask: [*, N, N], applied to the projections a and b."""

    def __init__(self, c_z: int, c_hidden: int, outgoing: bool = True, eps: float = 1e-5):
        super().__init__()
        self.c_z, self.c_hidden, self.outgoing, self.eps = c_z, c_hidden, outgoing, eps
        self.linear_a_p = nn.Linear(c_z, c_hidden)
        self.linear_a_g = nn.Linear(c_z, c_hidden)
        self.linear_b_p = nn.Linear(c_z, c_hidden)
        self.linear_b_g = nn.Linear(c_z, c_hidden)
        self.linear_g = nn.Linear(c_z, c_z)
        self.linear_z = nn.Linear(c_hidden, c_z)
        self.layer_norm_in = nn.LayerNorm(c_z, eps=eps)
        self.layer_norm_out = nn.LayerNorm(c_hidden, eps=eps)

    def forward(self, z: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        lead = z.shape[:-3]
        z = z.reshape(-1, *z.shape[-3:])
        if z.is_cuda and z.dtype != torch.bfloat16 and torch.is_autocast_enabled("cuda"):
            z = z.to(torch.bfloat16)  # the CUDA kernels take bf16 pair tensors
        if mask is not None:
            mask = mask.reshape(-1, *mask.shape[-2:])
        out = triangle_multiplicative_update(
            z, "outgoing" if self.outgoing else "incoming", mask,
            norm_in_weight=self.layer_norm_in.weight, norm_in_bias=self.layer_norm_in.bias,
            p_in_weight=torch.cat([self.linear_a_p.weight, self.linear_b_p.weight]),
            p_in_bias=torch.cat([self.linear_a_p.bias, self.linear_b_p.bias]),
            g_in_weight=torch.cat([self.linear_a_g.weight, self.linear_b_g.weight]),
            g_in_bias=torch.cat([self.linear_a_g.bias, self.linear_b_g.bias]),
            norm_out_weight=self.layer_norm_out.weight, norm_out_bias=self.layer_norm_out.bias,
            p_out_weight=self.linear_z.weight, p_out_bias=self.linear_z.bias,
            g_out_weight=self.linear_g.weight, g_out_bias=self.linear_g.bias, eps=self.eps)
        return out.reshape(*lead, *out.shape[-3:])


class TriangleMultiplicativeUpdateIncoming(TriangleMultiplicativeUpdate):
    def __init__(self, c_z: int, c_hidden: int, eps: float = 1e-5):
        super().__init__(c_z, c_hidden, outgoing=False, eps=eps)
