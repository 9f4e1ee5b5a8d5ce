"""The Pairformer (AF3 Algorithm 17) with OpenFold3's module structure and parameter names, so
that an OpenFold3 `PairFormerStack` state_dict loads unchanged:

    blocks.{i}.pair_stack.{tri_mul_out, tri_mul_in, tri_att_start, tri_att_end, pair_transition}
    blocks.{i}.attn_pair_bias.{layer_norm_a, layer_norm_z, linear_z, mha.linear_{q,k,v,o,g}}
    blocks.{i}.single_transition.{layer_norm, swiglu.linear_{a,b}, linear_out}

The triangle ops run on our kernels; the single track's attention runs on our attention kernel
with one slice. Pair dropout follows OpenFold3: one mask shared along the rows (dim -3) for the
multiplicative updates and the starting node, along the columns for the ending node; off in eval.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from . import layers
from .attention import triangle_attention
from .layers import _compute_dtype, gated_linear, norm_linear, swiglu_transition
from .modules import (
    TriangleAttention,
    TriangleMultiplicativeUpdate,
    _GatedAttentionProjections,
)


def _shared_dropout(x: torch.Tensor, p: float, training: bool, dim: int) -> torch.Tensor:
    """Dropout whose mask is shared along `dim` (OpenFold3's Dropout(batch_dim=dim))."""
    if not training or p == 0.0:
        return x
    shape = list(x.shape)
    shape[dim] = 1
    return x * F.dropout(x.new_ones(shape), p, True)


def _dropout_scale(z: torch.Tensor, p: float, training: bool, dim: int):
    """The mask of a dropout shared along `dim` (OpenFold3's Dropout(batch_dim=dim)) for an
    update of z's shape, in the update's dtype (autocast's, else z's); None when off."""
    if not training or p == 0.0:
        return None
    shape = list(z.shape)
    shape[dim] = 1
    return F.dropout(z.new_ones(shape, dtype=_compute_dtype(z)), p, True)


def _check_block_inputs(block: nn.Module, s, z, single_mask, pair_mask, c_s: int, c_z: int) -> None:
    """A clear error where the block's inputs disagree with its widths or with each other:
    s [B, N, c_s], z [B, N, N, c_z], single_mask [B, N], pair_mask [B, N, N]."""
    B, N = (s.shape[0], s.shape[1]) if s.dim() == 3 else (None, None)
    want = {
        "s": (s, [B, N, c_s]),
        "z": (z, [B, N, N, c_z]),
        "single_mask": (single_mask, [B, N]),
        "pair_mask": (pair_mask, [B, N, N]),
    }
    for name, (t, shape) in want.items():
        if B is None or list(t.shape) != shape:
            wanted = "[B, N, c_s]" if B is None else str(shape)
            raise ValueError(
                f"turbopairformer.{type(block).__name__}: argument '{name}': expected {wanted} "
                f"(c_s = {c_s}, c_z = {c_z}), got {list(t.shape)}"
            )


class SwiGLUTransition(nn.Module):
    """OpenFold3's SwiGLUTransition (AF3 Algorithm 11): LayerNorm, silu(x Wa) * (x Wb), then the
    down projection, times the mask."""

    def __init__(self, c_in: int, n: int = 4):
        super().__init__()
        self.c_in, self.n = c_in, n
        self.layer_norm = nn.LayerNorm(c_in)
        self.swiglu = nn.Module()
        self.swiglu.linear_a = nn.Linear(c_in, n * c_in, bias=False)
        self.swiglu.linear_b = nn.Linear(c_in, n * c_in, bias=False)
        self.linear_out = nn.Linear(n * c_in, c_in, bias=False)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        sw = self.swiglu
        x = swiglu_transition(x, self.layer_norm, sw.linear_a, sw.linear_b, self.linear_out)
        return x if mask is None else x * mask.unsqueeze(-1).to(x.dtype)

    def residual_update(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None):
        """x + self(x, mask) from one node (the mask scales the update in the residual add),
        whose backward adds x's pass-through gradient in the LayerNorm backward's pass."""
        scale = None if mask is None else mask.unsqueeze(-1).to(_compute_dtype(x))
        sw = self.swiglu
        return swiglu_transition(
            x, self.layer_norm, sw.linear_a, sw.linear_b, self.linear_out, True, scale
        )


class AttentionPairBias(nn.Module):
    """OpenFold3's AttentionPairBias as the Pairformer uses it (no AdaLN, gated): the single
    representation attends over tokens with a bias from the pair tensor. It runs on the triangle
    attention kernel with one slice; masked tokens are masked keys."""

    def __init__(self, c_s: int, c_z: int, c_hidden: int, no_heads: int):
        super().__init__()
        self.c_hidden, self.no_heads = c_hidden, no_heads
        self.layer_norm_a = nn.LayerNorm(c_s)
        self.layer_norm_z = nn.LayerNorm(c_z)
        self.linear_z = nn.Linear(c_z, no_heads, bias=False)
        self.mha = _GatedAttentionProjections(c_s, c_hidden, no_heads, bias=False, q_bias=True)

    def forward(
        self, a: torch.Tensor, z: torch.Tensor, mask: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        B, N, _ = a.shape
        H, c = self.no_heads, self.c_hidden
        m = self.mha
        layers = (m.linear_q, m.linear_k, m.linear_v, m.linear_g)
        q, k, v, g = norm_linear(a, self.layer_norm_a, layers, 8, [(H, c)] * 4)  # [B, N, H, c]
        q, k, v = (t.transpose(1, 2).unsqueeze(1) for t in (q, k, v))  # [B, 1, H, N, c]
        (zb,) = norm_linear(z, self.layer_norm_z, (self.linear_z,))  # [B, N, N, H]
        bias = zb.permute(0, 3, 1, 2).unsqueeze(1).contiguous()
        key_mask = None if mask is None else mask.reshape(B, 1, 1, 1, N).to(torch.bool)
        o = triangle_attention(q, k, v, bias.to(q.dtype), key_mask, scale=1.0 / math.sqrt(c))
        return gated_linear(g, o[:, 0].transpose(1, 2), m.linear_o)  # [B, N, c_s]


class PairBlock(nn.Module):
    """OpenFold3's PairBlock: both multiplicative updates, both triangle attentions, the pair
    transition, each added to z with pair dropout as OpenFold3 applies it."""

    def __init__(
        self,
        c_z: int = 128,
        c_hidden_mul: int = 128,
        c_hidden_pair_att: int = 32,
        no_heads_pair: int = 4,
        transition_n: int = 4,
        pair_dropout: float = 0.25,
    ):
        super().__init__()
        self.pair_dropout = pair_dropout
        self.tri_mul_out = TriangleMultiplicativeUpdate(
            c_z, c_hidden_mul, outgoing=True, bias=False
        )
        self.tri_mul_in = TriangleMultiplicativeUpdate(
            c_z, c_hidden_mul, outgoing=False, bias=False
        )
        self.tri_att_start = TriangleAttention(
            c_z, c_hidden_pair_att, no_heads_pair, starting=True, bias=False
        )
        self.tri_att_end = TriangleAttention(
            c_z, c_hidden_pair_att, no_heads_pair, starting=False, bias=False
        )
        self.pair_transition = SwiGLUTransition(c_z, transition_n)

    def forward(self, z: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        def drop(dim):
            return _dropout_scale(z, self.pair_dropout, self.training, dim)

        # every module owns its residual add (one node each way, docs/perf-notes.md)
        z = self.tri_mul_out.residual_update(z, pair_mask, drop(-3))
        z = self.tri_mul_in.residual_update(z, pair_mask, drop(-3))
        z = self.tri_att_start.residual_update(z, pair_mask, drop(-3))
        z = self.tri_att_end.residual_update(z, pair_mask, drop(-2))  # column-wise
        return self.pair_transition.residual_update(z, pair_mask)


class PairformerBlock(nn.Module):
    """One block of AF3 Algorithm 17 (OpenFold3's PairFormerBlock): the pair stack, then the
    single track's attention with pair bias and its transition. s: [B, N, c_s], z: [B, N, N, c_z],
    single_mask: [B, N], pair_mask: [B, N, N] (1 = valid)."""

    def __init__(
        self,
        c_s: int = 384,
        c_z: int = 128,
        c_hidden_pair_bias: int = 24,
        no_heads_pair_bias: int = 16,
        c_hidden_mul: int = 128,
        c_hidden_pair_att: int = 32,
        no_heads_pair: int = 4,
        transition_n: int = 4,
        pair_dropout: float = 0.25,
    ):
        super().__init__()
        self.pair_stack = PairBlock(
            c_z, c_hidden_mul, c_hidden_pair_att, no_heads_pair, transition_n, pair_dropout
        )
        self.attn_pair_bias = AttentionPairBias(c_s, c_z, c_hidden_pair_bias, no_heads_pair_bias)
        self.single_transition = SwiGLUTransition(c_s, transition_n)
        self.c_s, self.c_z = c_s, c_z

    def forward(
        self, s: torch.Tensor, z: torch.Tensor, single_mask: torch.Tensor, pair_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_block_inputs(self, s, z, single_mask, pair_mask, self.c_s, self.c_z)
        z = self.pair_stack(z, pair_mask)
        s = s + self.attn_pair_bias(s, z, single_mask)
        return s + self.single_transition(s, single_mask), z


class PairformerStack(nn.Module):
    """OpenFold3's PairFormerStack: no_blocks PairformerBlocks; with gradients enabled, every
    blocks_per_ckpt blocks form one activation checkpoint (None: no checkpointing)."""

    def __init__(self, no_blocks: int = 48, blocks_per_ckpt: Optional[int] = 1, **block_kwargs):
        super().__init__()
        if blocks_per_ckpt is not None and blocks_per_ckpt < 1:
            raise ValueError(
                "turbopairformer: argument 'blocks_per_ckpt': expected None or >= 1, "
                f"got {blocks_per_ckpt}"
            )
        self.blocks_per_ckpt = blocks_per_ckpt
        self.blocks = nn.ModuleList(PairformerBlock(**block_kwargs) for _ in range(no_blocks))

    def forward(
        self, s: torch.Tensor, z: torch.Tensor, single_mask: torch.Tensor, pair_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        def run(first: int, last: int, s, z):
            for block in self.blocks[first:last]:
                s, z = block(s, z, single_mask, pair_mask)
            return s, z

        step = self.blocks_per_ckpt
        if step is None or not torch.is_grad_enabled():
            return run(0, len(self.blocks), s, z)
        # the composed ops inside compiled checkpoints (layers.compiled_nodes)
        layers._IN_COMPILED_CHECKPOINT = torch.compiler.is_compiling()
        for first in range(0, len(self.blocks), step):
            s, z = checkpoint(run, first, first + step, s, z, use_reentrant=False)
        layers._IN_COMPILED_CHECKPOINT = False
        return s, z
