"""Plain-PyTorch references used by the tests (float64, straight from DESIGN.md)."""
import math

import torch


def attention_reference(q, k, v, bias, mask=None, scale=None):
    """DESIGN.md section 1 in float64: masked keys get -inf; rows whose keys are all masked give
    zeros. A masked (query, key) pair takes no part, in the output or in any gradient: every
    masked entry is selected away (torch.where), never multiplied by 0, so that a NaN elsewhere
    in its row or column does not reach it as 0 * NaN. Any other NaN propagates, as in PyTorch."""
    q, k, v, bias = (t.double() for t in (q, k, v, bias))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if mask is None:
        return torch.softmax(scale * q @ k.transpose(-1, -2) + bias, dim=-1) @ v
    mask = mask.bool()
    key_ok = mask.transpose(-1, -2)  # [B, S, 1, N, 1]
    k, v = torch.where(key_ok, k, 0.0), torch.where(key_ok, v, 0.0)
    s = torch.where(mask, scale * q @ k.transpose(-1, -2) + bias, float("-inf"))
    p = torch.where(mask & mask.any(-1, keepdim=True), torch.softmax(s, dim=-1), 0.0)
    return p @ v


class OpenFold3TriangleAttention(torch.nn.Module):
    """OpenFold3's TriangleAttention written out in plain PyTorch (same parameter names)."""

    def __init__(self, c_in, c_hidden, no_heads, starting=True, inf=1e9):
        super().__init__()
        self.c_hidden, self.no_heads, self.starting, self.inf = c_hidden, no_heads, starting, inf
        self.layer_norm = torch.nn.LayerNorm(c_in)
        self.linear_z = torch.nn.Linear(c_in, no_heads, bias=False)
        self.mha = torch.nn.Module()
        self.mha.linear_q = torch.nn.Linear(c_in, c_hidden * no_heads, bias=False)
        self.mha.linear_k = torch.nn.Linear(c_in, c_hidden * no_heads, bias=False)
        self.mha.linear_v = torch.nn.Linear(c_in, c_hidden * no_heads, bias=False)
        self.mha.linear_o = torch.nn.Linear(c_hidden * no_heads, c_in)
        self.mha.linear_g = torch.nn.Linear(c_in, c_hidden * no_heads)

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

        q = heads(self.mha.linear_q(x)) / math.sqrt(self.c_hidden)
        k, v = heads(self.mha.linear_k(x)), heads(self.mha.linear_v(x))
        a = torch.softmax(q @ k.transpose(-1, -2) + mask_bias + tri_bias, dim=-1)
        o = (a @ v).transpose(-2, -3)
        o = o * torch.sigmoid(self.mha.linear_g(x)).view(o.shape)
        o = self.mha.linear_o(o.reshape(*o.shape[:-2], -1))
        return o.transpose(-2, -3) if not self.starting else o


class OpenFold3TriangleMultiplicativeUpdate(torch.nn.Module):
    """OpenFold3's TriangleMultiplicativeUpdate written out in plain PyTorch (same names)."""

    def __init__(self, c_z, c_hidden, outgoing=True):
        super().__init__()
        self.outgoing = outgoing
        for name in ("linear_a_p", "linear_a_g", "linear_b_p", "linear_b_g"):
            setattr(self, name, torch.nn.Linear(c_z, c_hidden))
        self.linear_g = torch.nn.Linear(c_z, c_z)
        self.linear_z = torch.nn.Linear(c_hidden, c_z)
        self.layer_norm_in = torch.nn.LayerNorm(c_z)
        self.layer_norm_out = torch.nn.LayerNorm(c_hidden)

    def forward(self, z, mask=None):
        if mask is None:
            mask = z.new_ones(z.shape[:-1])
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


def assert_module_matches(ref, ours, x, mask, atol=1e-9):
    """Randomises ref's parameters, loads them into ours, and compares output, input gradient and
    every parameter gradient (matched by name)."""
    for p in ref.parameters():  # non-trivial LayerNorm gains and biases
        torch.nn.init.normal_(p, std=0.5)
    ours.load_state_dict(ref.state_dict())
    xr, xo = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    yr, yo = ref(xr, mask), ours(xo, mask)
    assert torch.allclose(yr, yo, atol=atol / 10)
    g = torch.randn_like(yr)
    yr.backward(g)
    yo.backward(g)
    assert torch.allclose(xr.grad, xo.grad, atol=atol)
    ref_grads = dict(ref.named_parameters())
    for n, p in ours.named_parameters():
        assert torch.allclose(p.grad, ref_grads[n].grad, atol=atol), n
