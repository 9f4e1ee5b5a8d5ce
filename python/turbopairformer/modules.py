"""nn.Modules that drop into OpenFold3-style models. Parameter names follow OpenFold3's
TriangleAttention (layer_norm, linear_z, mha.linear_{q,k,v,o,g}) and TriangleMultiplication
(linear_{a,b}_{p,g}, linear_g, linear_z, layer_norm_{in,out}), so its checkpoints load unchanged
with load_state_dict. `bias=False` gives OpenFold3's AF3 configuration (no biases on the gate,
output and multiplicative-update projections), which the Pairformer modules use; the default
keeps biases, as in OpenFold's AF2 layers."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from ._attention_layer import STACK_PAD, _bias_order, _slice_order, triangle_attention_layer
from .attention import NATIVE_HEAD_DIMS, triangle_attention
from .layers import compiled_nodes, gated_linear, norm_linear, residual_add
from .trimul import kernel_input, triangle_multiplicative_update
from .trimul import residual_update as trimul_residual_update


def _check_pair(module: nn.Module, name: str, x: torch.Tensor, channels: int, square: bool) -> None:
    """A clear error for an input the module's weights cannot take: [*, N, N, channels] (or
    [*, I, J, channels] where square is False), before any weight is reshaped or cast."""
    square_ok = not square or (x.dim() >= 3 and x.shape[-3] == x.shape[-2])
    if x.dim() < 3 or x.shape[-1] != channels or not square_ok:
        want = f"[*, N, N, {channels}]" if square else f"[*, I, J, {channels}]"
        raise ValueError(
            f"turbopairformer.{type(module).__name__}: argument '{name}': expected {want} "
            f"(the module's channels: {channels}), got {list(x.shape)}"
        )


class _GatedAttentionProjections(nn.Module):
    """The projections of OpenFold3's gated multi-head Attention (no biases on q, k, v)."""

    def __init__(self, c_in: int, c_hidden: int, no_heads: int, bias: bool, q_bias: bool = False):
        super().__init__()
        self.linear_q = nn.Linear(c_in, c_hidden * no_heads, bias=q_bias)
        self.linear_k = nn.Linear(c_in, c_hidden * no_heads, bias=False)
        self.linear_v = nn.Linear(c_in, c_hidden * no_heads, bias=False)
        self.linear_o = nn.Linear(c_hidden * no_heads, c_in, bias=bias)
        self.linear_g = nn.Linear(c_in, c_hidden * no_heads, bias=bias)


class TriangleAttention(nn.Module):
    """Triangle self-attention around the starting node (AF3 Algorithm 14) or, with
    starting=False, the ending node (Algorithm 15), on a pair tensor x: [*, I, J, c_in].

    The LayerNorm feeds one GEMM for q, k, v, the gate and the pair bias; the kernel reads q, k,
    v straight from its output through strides and writes its output in x's row order (the
    ending node too: no transposed copy of x or of the output). The whole layer is one node
    (_attention_layer.triangle_attention_layer) whose backward writes every projection gradient
    in place. c_hidden is the per-head width (OpenFold3's convention): a multiple of 8 up
    to 128 (16, 32, 64 and 128 run natively, the others zero-padded). mask: [*, I, J], 1 = valid.
    """

    def __init__(
        self,
        c_in: int,
        c_hidden: int,
        no_heads: int,
        starting: bool = True,
        compensate: bool = True,
        bias: bool = True,
    ):
        super().__init__()
        self.c_in, self.c_hidden, self.no_heads = c_in, c_hidden, no_heads
        self.starting, self.compensate = starting, compensate
        self.layer_norm = nn.LayerNorm(c_in)
        self.linear_z = nn.Linear(c_in, no_heads, bias=False)
        self.mha = _GatedAttentionProjections(c_in, c_hidden, no_heads, bias)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.attend(x, mask, self.starting)

    def _fused(self, x: torch.Tensor) -> bool:
        """Whether the layer runs as one node (_attention_layer.triangle_attention_layer): at a
        head dim the kernels run natively (or on the CPU's reference); under torch.compile where
        layers.compiled_nodes(x), else the composed ops below, which inductor fuses."""
        if x.numel() == 0 or (torch.compiler.is_compiling() and not compiled_nodes(x)):
            return False
        return not x.is_cuda or self.c_hidden in NATIVE_HEAD_DIMS

    def residual_update(self, x, mask=None, scale=None) -> torch.Tensor:
        """x + scale * self(x, mask) (scale: None or broadcastable to x, e.g. a shared dropout
        mask), in eager mode from the layer's one node, whose backward adds x's pass-through
        gradient in the LayerNorm backward's pass instead of a separate sum."""
        return self.attend(x, mask, self.starting, residual=True, scale=scale)

    def attend(
        self, x, mask, starting: bool, gather_rows=None, residual=False, scale=None
    ) -> torch.Tensor:
        """The layer around one node: forward() with starting=self.starting. gather_rows, for a
        row shard of the pair tensor (turbopairformer.distributed), turns this shard's rows of
        the bias projection into all N rows; it is only valid with starting=True. residual:
        return x + scale * the layer's output (residual_update)."""
        _check_pair(self, "x", x, self.c_in, square=False)
        lead = x.shape[:-3]
        x = x.reshape(-1, *x.shape[-3:])  # [B, I, J, C]
        B, I, J, _ = x.shape
        H, c = self.no_heads, self.c_hidden
        m = self.mha
        layers = (m.linear_q, m.linear_k, m.linear_v, m.linear_g, self.linear_z)
        attn_mask = None
        if mask is not None:
            mask = mask.reshape(B, I, J).to(torch.bool)
            attn_mask = (mask if starting else mask.transpose(-1, -2))[:, :, None, None, :]
        if gather_rows is None and self._fused(x):
            out = triangle_attention_layer(
                x,
                self.layer_norm,
                layers,
                m.linear_o,
                (H, c),
                attn_mask,
                starting,
                self.compensate,
                residual,
                scale,
            )
            return out.reshape(*lead, I, J, self.c_in)
        # q, k, v, g: [B, I, J, H, c], zb: [B, I, J, H], views of one [B, I, J, P]
        splits = [(H, c)] * 4 + [None]
        q, k, v, g, zb = norm_linear(x, self.layer_norm, layers, STACK_PAD, splits)
        # Slice s, key n of the attention: (s, n) = (i, j) at the starting node, (j, i) at the
        # ending node. [B, I, J, H, c] -> [B, S, H, N, c] views.
        order, back = _slice_order(starting)
        q, k, v = (t.permute(order) for t in (q, k, v))
        # bias[b, h, q, k] = z[q, k, h] (starting) or z[k, q, h] (ending): [B, 1, H, N, N],
        # contiguous so that the kernel streams it with vector loads (H N^2 values)
        if gather_rows is not None:
            zb = gather_rows(zb)  # [B, N, J, H]: every row of the bias
        bias = zb.permute(_bias_order(starting)).unsqueeze(1).contiguous()
        o = triangle_attention(
            q, k, v, bias, attn_mask, scale=1.0 / math.sqrt(c), compensate=self.compensate
        )  # [B, S, H, N, c]
        out = gated_linear(g, o.permute(back), m.linear_o)  # [B, I, J, C]
        if residual:
            out = residual_add(x, out, scale)
        return out.reshape(*lead, I, J, self.c_in)


TriangleAttentionStartingNode = TriangleAttention


class TriangleAttentionEndingNode(TriangleAttention):
    def __init__(
        self, c_in: int, c_hidden: int, no_heads: int, compensate: bool = True, bias: bool = True
    ):
        super().__init__(c_in, c_hidden, no_heads, starting=False, compensate=compensate, bias=bias)


def packed_weights(m) -> dict:
    """The op's weights (cuEquivariance's packing) from a module with OpenFold3's names:
    p_in = [a_p; b_p], g_in = [a_g; b_g], p_out = linear_z, g_out = linear_g."""

    def cat(a, b):
        return None if a is None else torch.cat([a, b])

    return dict(
        norm_in_weight=m.layer_norm_in.weight,
        norm_in_bias=m.layer_norm_in.bias,
        p_in_weight=cat(m.linear_a_p.weight, m.linear_b_p.weight),
        p_in_bias=cat(m.linear_a_p.bias, m.linear_b_p.bias),
        g_in_weight=cat(m.linear_a_g.weight, m.linear_b_g.weight),
        g_in_bias=cat(m.linear_a_g.bias, m.linear_b_g.bias),
        norm_out_weight=m.layer_norm_out.weight,
        norm_out_bias=m.layer_norm_out.bias,
        p_out_weight=m.linear_z.weight,
        p_out_bias=m.linear_z.bias,
        g_out_weight=m.linear_g.weight,
        g_out_bias=m.linear_g.bias,
    )


class TriangleMultiplicativeUpdate(nn.Module):
    """AF3 Algorithms 12 (outgoing) and 13 (incoming) on a pair tensor z: [*, N, N, c_z], with
    OpenFold3's parameter names (linear_a_p, linear_a_g, linear_b_p, linear_b_g, linear_g,
    linear_z, layer_norm_in, layer_norm_out), so its checkpoints load unchanged.
    mask: [*, N, N], applied to the projections a and b. low_memory: keep no saved set for the
    backward, which then recomputes the forward (see triangle_multiplicative_update)."""

    def __init__(
        self,
        c_z: int,
        c_hidden: int,
        outgoing: bool = True,
        eps: float = 1e-5,
        bias: bool = True,
        low_memory: bool = False,
    ):
        super().__init__()
        self.c_z, self.c_hidden, self.outgoing, self.eps = c_z, c_hidden, outgoing, eps
        self.low_memory = low_memory
        self.linear_a_p = nn.Linear(c_z, c_hidden, bias=bias)
        self.linear_a_g = nn.Linear(c_z, c_hidden, bias=bias)
        self.linear_b_p = nn.Linear(c_z, c_hidden, bias=bias)
        self.linear_b_g = nn.Linear(c_z, c_hidden, bias=bias)
        self.linear_g = nn.Linear(c_z, c_z, bias=bias)
        self.linear_z = nn.Linear(c_hidden, c_z, bias=bias)
        self.layer_norm_in = nn.LayerNorm(c_z, eps=eps)
        self.layer_norm_out = nn.LayerNorm(c_hidden, eps=eps)

    def forward(self, z: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        _check_pair(self, "z", z, self.c_z, square=True)
        lead = z.shape[:-3]
        z = z.reshape(-1, *z.shape[-3:])
        z = kernel_input(z)  # the CUDA kernels take bf16 pair tensors
        if mask is not None:
            mask = mask.reshape(-1, *mask.shape[-2:])
        direction = "outgoing" if self.outgoing else "incoming"
        out = triangle_multiplicative_update(
            z, direction, mask, eps=self.eps, low_memory=self.low_memory, **packed_weights(self)
        )
        return out.reshape(*lead, *out.shape[-3:])

    def residual_update(self, z, mask=None, scale=None) -> torch.Tensor:
        """z + scale * self(z, mask) for z [B, N, N, c_z] (scale: None or broadcastable to z,
        e.g. a shared dropout mask) as one autograd node in eager mode, whose backward takes two
        passes around the kernels where the composed ops take four."""
        _check_pair(self, "z", z, self.c_z, square=True)
        direction = "outgoing" if self.outgoing else "incoming"
        return trimul_residual_update(
            z,
            scale,
            direction,
            mask,
            self.eps,
            self.low_memory,
            **packed_weights(self),
        )


class TriangleMultiplicativeUpdateIncoming(TriangleMultiplicativeUpdate):
    def __init__(
        self,
        c_z: int,
        c_hidden: int,
        eps: float = 1e-5,
        bias: bool = True,
        low_memory: bool = False,
    ):
        super().__init__(c_z, c_hidden, outgoing=False, eps=eps, bias=bias, low_memory=low_memory)
