"""OpenFold3's Pairformer layers written out in plain PyTorch (AF3 Algorithms 11-17, 24), with
OpenFold3's parameter names and semantics: the oracle of the module tests and the "plain
PyTorch" backend of the Pairformer benchmark. Masks are OpenFold3's additive -inf (1e9) biases;
dropout is OpenFold3's shared-mask pair dropout."""

import math

import torch

from .modules import packed_weights
from .pairformer import _shared_dropout


class OpenFold3TriangleAttention(torch.nn.Module):
    """OpenFold3's TriangleAttention written out in plain PyTorch (same parameter names)."""

    def __init__(self, c_in, c_hidden, no_heads, starting=True, inf=1e9, bias=True):
        super().__init__()
        self.c_hidden, self.no_heads, self.starting, self.inf = c_hidden, no_heads, starting, inf
        self.layer_norm = torch.nn.LayerNorm(c_in)
        self.linear_z = torch.nn.Linear(c_in, no_heads, bias=False)
        self.mha = torch.nn.Module()
        self.mha.linear_q = torch.nn.Linear(c_in, c_hidden * no_heads, bias=False)
        self.mha.linear_k = torch.nn.Linear(c_in, c_hidden * no_heads, bias=False)
        self.mha.linear_v = torch.nn.Linear(c_in, c_hidden * no_heads, bias=False)
        self.mha.linear_o = torch.nn.Linear(c_hidden * no_heads, c_in, bias=bias)
        self.mha.linear_g = torch.nn.Linear(c_in, c_hidden * no_heads, bias=bias)

    def forward(self, x, mask=None):
        if mask is None:
            mask = x.new_ones(x.shape[:-1])
        if not self.starting:
            x, mask = x.transpose(-2, -3), mask.transpose(-1, -2)
        x = self.layer_norm(x)
        mask_bias = (self.inf * (mask - 1))[..., :, None, None, :]
        tri_bias = self.linear_z(x).permute(*range(x.dim() - 3), -1, -3, -2).unsqueeze(-4)

        def heads(t):
            return t.view(*t.shape[:-1], self.no_heads, self.c_hidden).transpose(-2, -3)

        q, k, v = (
            heads(lin(x)) for lin in (self.mha.linear_q, self.mha.linear_k, self.mha.linear_v)
        )
        if getattr(self, "kernels", None) == "cuequivariance":  # as OpenFold3 calls it
            import cuequivariance_torch as cueq

            o = cueq.triangle_attention(
                q,
                k,
                v,
                tri_bias,
                mask=mask.bool()[..., :, None, None, :],
                scale=1.0 / math.sqrt(self.c_hidden),
            ).transpose(-2, -3)
        elif getattr(self, "kernels", None) == "trifast":  # [B, H, S, N, c]; mask True = masked
            from trifast import triangle_attention as trifast_attention

            def t(x):
                return x.transpose(-3, -4).contiguous()

            o = trifast_attention(t(q), t(k), t(v), tri_bias[:, 0], ~mask.bool())
            o = o.transpose(-3, -4).transpose(-2, -3)
        else:
            q = q / math.sqrt(self.c_hidden)
            a = torch.softmax(q @ k.transpose(-1, -2) + mask_bias + tri_bias, dim=-1)
            o = (a @ v).transpose(-2, -3)
        o = o * torch.sigmoid(self.mha.linear_g(x)).view(o.shape)
        o = self.mha.linear_o(o.reshape(*o.shape[:-2], -1))
        return o.transpose(-2, -3) if not self.starting else o


class OpenFold3TriangleMultiplicativeUpdate(torch.nn.Module):
    """OpenFold3's TriangleMultiplicativeUpdate written out in plain PyTorch (same names)."""

    def __init__(self, c_z, c_hidden, outgoing=True, bias=True):
        super().__init__()
        self.outgoing = outgoing
        for name in ("linear_a_p", "linear_a_g", "linear_b_p", "linear_b_g"):
            setattr(self, name, torch.nn.Linear(c_z, c_hidden, bias=bias))
        self.linear_g = torch.nn.Linear(c_z, c_z, bias=bias)
        self.linear_z = torch.nn.Linear(c_hidden, c_z, bias=bias)
        self.layer_norm_in = torch.nn.LayerNorm(c_z)
        self.layer_norm_out = torch.nn.LayerNorm(c_hidden)

    def forward(self, z, mask=None):
        if mask is None:
            mask = z.new_ones(z.shape[:-1])
        if getattr(self, "kernels", None) == "cuequivariance":
            return self._cuequivariance(z, mask)
        mask = mask.unsqueeze(-1)
        z = self.layer_norm_in(z)
        a = mask * torch.sigmoid(self.linear_a_g(z)) * self.linear_a_p(z)
        b = mask * torch.sigmoid(self.linear_b_g(z)) * self.linear_b_p(z)
        if self.outgoing:
            x = torch.einsum("...ikc,...jkc->...ijc", a, b)
        else:
            x = torch.einsum("...kic,...kjc->...ijc", a, b)
        x = self.linear_z(self.layer_norm_out(x))
        return x * torch.sigmoid(self.linear_g(z))

    def _cuequivariance(self, z, mask):
        """cuEquivariance's fused op with this module's weights, as OpenFold3 wires it."""
        import cuequivariance_torch as cueq

        direction = "outgoing" if self.outgoing else "incoming"
        return cueq.triangle_multiplicative_update(z, direction, mask, **packed_weights(self))


class OpenFold3SwiGLUTransition(torch.nn.Module):
    """OpenFold3's SwiGLUTransition (AF3 Algorithm 11): no biases."""

    def __init__(self, c_in, n):
        super().__init__()
        self.layer_norm = torch.nn.LayerNorm(c_in)
        self.swiglu = torch.nn.Module()
        self.swiglu.linear_a = torch.nn.Linear(c_in, n * c_in, bias=False)
        self.swiglu.linear_b = torch.nn.Linear(c_in, n * c_in, bias=False)
        self.linear_out = torch.nn.Linear(n * c_in, c_in, bias=False)

    def forward(self, x, mask=None):
        x = self.layer_norm(x)
        x = self.linear_out(
            torch.nn.functional.silu(self.swiglu.linear_a(x)) * self.swiglu.linear_b(x)
        )
        return x if mask is None else x * mask.unsqueeze(-1)


class OpenFold3AttentionPairBias(torch.nn.Module):
    """OpenFold3's AttentionPairBias without AdaLN (AF3 Algorithm 24, as the Pairformer uses it)."""

    def __init__(self, c_s, c_z, c_hidden, no_heads, inf=1e9):
        super().__init__()
        self.c_hidden, self.no_heads, self.inf = c_hidden, no_heads, inf
        self.layer_norm_a = torch.nn.LayerNorm(c_s)
        self.layer_norm_z = torch.nn.LayerNorm(c_z)
        self.linear_z = torch.nn.Linear(c_z, no_heads, bias=False)
        self.mha = torch.nn.Module()
        self.mha.linear_q = torch.nn.Linear(c_s, c_hidden * no_heads)
        self.mha.linear_k = torch.nn.Linear(c_s, c_hidden * no_heads, bias=False)
        self.mha.linear_v = torch.nn.Linear(c_s, c_hidden * no_heads, bias=False)
        self.mha.linear_o = torch.nn.Linear(c_hidden * no_heads, c_s, bias=False)
        self.mha.linear_g = torch.nn.Linear(c_s, c_hidden * no_heads, bias=False)

    def forward(self, a, z, mask):
        a = self.layer_norm_a(a)
        bias = self.linear_z(self.layer_norm_z(z)).permute(0, 3, 1, 2)  # [B, H, N, N]
        bias = bias + (self.inf * (mask - 1))[:, None, None, :]

        def heads(t):
            return t.view(*t.shape[:-1], self.no_heads, self.c_hidden).transpose(-2, -3)

        q = heads(self.mha.linear_q(a)) / math.sqrt(self.c_hidden)
        k, v = heads(self.mha.linear_k(a)), heads(self.mha.linear_v(a))
        o = (torch.softmax(q @ k.transpose(-1, -2) + bias, dim=-1) @ v).transpose(-2, -3)
        o = o * torch.sigmoid(self.mha.linear_g(a)).view(o.shape)
        return self.mha.linear_o(o.reshape(*o.shape[:-2], -1))


class OpenFold3PairBlock(torch.nn.Module):
    def __init__(
        self, c_z, c_hidden_mul, c_hidden_pair_att, no_heads_pair, transition_n, pair_dropout=0.25
    ):
        super().__init__()
        self.pair_dropout = pair_dropout
        self.tri_mul_out = OpenFold3TriangleMultiplicativeUpdate(
            c_z, c_hidden_mul, True, bias=False
        )
        self.tri_mul_in = OpenFold3TriangleMultiplicativeUpdate(
            c_z, c_hidden_mul, False, bias=False
        )
        self.tri_att_start = OpenFold3TriangleAttention(
            c_z, c_hidden_pair_att, no_heads_pair, bias=False
        )
        # OpenFold3 runs the ending node as a starting-node module on the transposed pair tensor
        self.tri_att_end = OpenFold3TriangleAttention(
            c_z, c_hidden_pair_att, no_heads_pair, bias=False
        )
        self.pair_transition = OpenFold3SwiGLUTransition(c_z, transition_n)

    def forward(self, z, pair_mask):
        drop = lambda x: _shared_dropout(x, self.pair_dropout, self.training, -3)  # noqa: E731
        z = z + drop(self.tri_mul_out(z, pair_mask))
        z = z + drop(self.tri_mul_in(z, pair_mask))
        z = z + drop(self.tri_att_start(z, pair_mask))
        zt = z.transpose(-2, -3)
        zt = zt + drop(self.tri_att_end(zt, pair_mask.transpose(-1, -2)))
        z = zt.transpose(-2, -3)
        return z + self.pair_transition(z, pair_mask)


class OpenFold3PairFormerBlock(torch.nn.Module):
    """OpenFold3's PairFormerBlock, plain PyTorch (its training config by default)."""

    def __init__(
        self,
        c_s=384,
        c_z=128,
        c_hidden_pair_bias=24,
        no_heads_pair_bias=16,
        c_hidden_mul=128,
        c_hidden_pair_att=32,
        no_heads_pair=4,
        transition_n=4,
        pair_dropout=0.25,
    ):
        super().__init__()
        self.pair_stack = OpenFold3PairBlock(
            c_z, c_hidden_mul, c_hidden_pair_att, no_heads_pair, transition_n, pair_dropout
        )
        self.attn_pair_bias = OpenFold3AttentionPairBias(
            c_s, c_z, c_hidden_pair_bias, no_heads_pair_bias
        )
        self.single_transition = OpenFold3SwiGLUTransition(c_s, transition_n)

    def forward(self, s, z, single_mask, pair_mask):
        z = self.pair_stack(z, pair_mask)
        s = s + self.attn_pair_bias(s, z, single_mask)
        return s + self.single_transition(s, single_mask), z


class OpenFold3PairFormerStack(torch.nn.Module):
    """OpenFold3's PairFormerStack, plain PyTorch: blocks_per_ckpt blocks per activation
    checkpoint while gradients are enabled."""

    def __init__(self, no_blocks=48, blocks_per_ckpt=1, **block_kwargs):
        super().__init__()
        self.blocks_per_ckpt = blocks_per_ckpt
        self.blocks = torch.nn.ModuleList(
            OpenFold3PairFormerBlock(**block_kwargs) for _ in range(no_blocks)
        )

    def forward(self, s, z, single_mask, pair_mask):
        from torch.utils.checkpoint import checkpoint

        for block in self.blocks:
            if self.blocks_per_ckpt and torch.is_grad_enabled():
                s, z = checkpoint(block, s, z, single_mask, pair_mask, use_reentrant=False)
            else:
                s, z = block(s, z, single_mask, pair_mask)
        return s, z


def wire_cuequivariance(module: torch.nn.Module) -> torch.nn.Module:
    """Routes every triangle attention and multiplicative update of an OpenFold3 reference module
    to cuEquivariance's kernels (OpenFold3's `use_cueq_triangle_kernels`); returns the module."""
    for m in module.modules():
        if isinstance(m, (OpenFold3TriangleAttention, OpenFold3TriangleMultiplicativeUpdate)):
            m.kernels = "cuequivariance"
    return module


def wire_trifast(module: torch.nn.Module) -> torch.nn.Module:
    """Routes every triangle attention of an OpenFold3 reference module to trifast's Triton
    kernel (the multiplicative updates stay plain PyTorch); returns the module."""
    for m in module.modules():
        if isinstance(m, OpenFold3TriangleAttention):
            m.kernels = "trifast"
    return module
