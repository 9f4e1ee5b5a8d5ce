"""Error budget of the multiplicative update's backward (CPU emulation, no GPU).

Replays the CUDA backward's precision plan (src/trimul/kernels.h) in float64 with a 16-bit
rounding at every point where the kernels store or feed a tensor core a 16-bit value, and
compares dz and the weight gradients with exact float64 autograd. Then drops one rounding at a
time (or a group of them) to show what each costs, as a multiple of the bf16 floor (the exact
answer rounded once to bf16), the metric of bench/results/h200/trimul.md.

    python dev/precision/trimul_backward_budget.py [--n 48] [--c 64] [--seeds 3]

Validate the emulation against the H200 first: its "current plan" row should match the
measured dz / weight-gradient ratios of tpf trimul-table (2.2-2.5 at C = 128).
"""
import argparse
import math

import torch

F64 = torch.float64


def r_bf(t):
    return t.to(torch.bfloat16).to(F64)


def r_fp16(t):
    return t.to(torch.float16).to(F64)


def ident(t):
    return t


def r_hilo(t):  # a bf16 high part plus a bf16 low part (~16 significant bits)
    hi = r_bf(t)
    return hi + r_bf(t - hi)


def ln_hat(x, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    rstd = 1.0 / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)
    return (x - mu) * rstd, rstd


def ln_hat_backward(g, xhat, rstd):
    return rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))


def problem(N, C, seed):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=F64)
    Ch = C
    w = {
        "gi": r_bf(1 + 0.1 * rnd(C)), "bi": r_bf(0.1 * rnd(C)),
        "Wp": r_bf(rnd(2 * Ch, C) / math.sqrt(C)), "bp": r_bf(0.1 * rnd(2 * Ch)),
        "Wg": r_bf(rnd(2 * Ch, C) / math.sqrt(C)), "bg": r_bf(0.1 * rnd(2 * Ch)),
        "go": r_bf(1 + 0.1 * rnd(Ch)), "bo": r_bf(0.1 * rnd(Ch)),
        "Wz": r_bf(rnd(C, Ch) / math.sqrt(Ch)), "bz": r_bf(0.1 * rnd(C)),
        "Wgo": r_bf(rnd(C, C) / math.sqrt(C)), "bgo": r_bf(0.1 * rnd(C)),
    }
    z = r_bf(rnd(N, N, C))
    mask = (torch.rand(N, N, generator=g, dtype=F64) < 0.8).to(F64)
    dout = r_bf(rnd(N, N, C))
    return z, mask, w, dout


def exact(z, mask, w, dout):
    z = z.clone().requires_grad_(True)
    ws = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    Ch = ws["Wp"].shape[0] // 2
    xh, _ = ln_hat(z)
    zn = xh * ws["gi"] + ws["bi"]
    p = zn @ ws["Wp"].T + ws["bp"]
    gg = zn @ ws["Wg"].T + ws["bg"]
    ab = torch.sigmoid(gg) * p * mask[..., None]
    a, b = ab[..., :Ch], ab[..., Ch:]
    x = torch.einsum("ikc,jkc->ijc", a, b)
    xo, _ = ln_hat(x)
    y = (xo * ws["go"] + ws["bo"]) @ ws["Wz"].T + ws["bz"]
    out = torch.sigmoid(zn @ ws["Wgo"].T + ws["bgo"]) * y
    grads = torch.autograd.grad(out, [z] + list(ws.values()), dout)
    return grads[0], dict(zip(ws.keys(), grads[1:]))


def emulated(z, mask, w, dout, R):
    """The CUDA backward with rounding functions R[name] at each 16-bit point."""
    Ch = w["Wp"].shape[0] // 2
    W_in = torch.cat([w["Wp"], w["Wg"], w["Wgo"]])           # rows: p, g, output gate
    b_in = torch.cat([w["bp"], w["bg"], w["bgo"]])
    xh_in, rs_in = ln_hat(z)
    lin = R["xhat_in16"](xh_in) @ R["w_fold16"](W_in * w["gi"]).T + (b_in + W_in @ w["bi"])
    p, g, l_gate = lin[..., :2 * Ch], lin[..., 2 * Ch:4 * Ch], lin[..., 4 * Ch:]
    sg = torch.sigmoid(g)
    ab_f = sg * p * mask[..., None]
    ab = R["ab"](ab_f)                                        # the backward's bf16 operands
    a, b = ab[..., :Ch], ab[..., Ch:]
    ab_x = R["ab_x"](ab_f)                                    # the operands x was made from
    x = R["x"](torch.einsum("ikc,jkc->ijc", ab_x[..., :Ch], ab_x[..., Ch:]))
    xh_o, rs_o = ln_hat(x)
    y = R["xhat_out16"](xh_o) @ R["w_fold16"](w["Wz"] * w["go"]).T + (w["bz"] + w["Wz"] @ w["bo"])
    s = torch.sigmoid(R["gate_logit"](l_gate))
    dy_f = dout * s
    dgl_f = dout * y * s * (1 - s)
    dy = R["dy"](dy_f)
    dxh_o = R["dxhat_out"]((dy @ w["Wz"]) * w["go"])
    dX = R["dx"](ln_hat_backward(dxh_o, xh_o, rs_o))
    da = torch.einsum("ijc,jkc->ikc", dX, b)                  # outgoing, fp32 out
    db = torch.einsum("ijc,ikc->jkc", dX, a)
    up = torch.cat([da, db], -1) * mask[..., None]
    dp_f, dg_f = up * sg, up * p * sg * (1 - sg)
    dlin_f = torch.cat([dp_f, dg_f, dgl_f], -1)
    dlin = torch.cat([R["dlin_ab"](dlin_f[..., :4 * Ch]), R["dlin_gate"](dlin_f[..., 4 * Ch:])], -1)
    dxh_in = R["dxhat_in"]((dlin @ W_in) * w["gi"])
    dz = ln_hat_backward(dxh_in, xh_in, rs_in)
    # weight gradients from G = dlin^T xhat (bf16 operands) and fp32 column sums
    G_in = torch.einsum("ijo,ijc->oc", dlin, R["xhat_in_bf"](xh_in))
    S_in = dlin_f.sum((0, 1))
    dW_in = G_in * w["gi"] + S_in[:, None] * w["bi"]
    G_o = torch.einsum("ijo,ijc->oc", dy, R["xhat_out_bf"](xh_o))
    S_o = dy_f.sum((0, 1))
    grads = {"Wp": dW_in[:2 * Ch], "Wg": dW_in[2 * Ch:4 * Ch], "Wgo": dW_in[4 * Ch:],
             "Wz": G_o * w["go"] + S_o[:, None] * w["bo"], "gi": (W_in * G_in).sum(0),
             "go": (w["Wz"] * G_o).sum(0)}
    return dz, grads


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def ratios(dz, grads, dz_x, grads_x):
    out = {"dz": rel(r_bf(dz), dz_x) / rel(r_bf(dz_x), dz_x)}
    for k, v in grads.items():
        out[k] = rel(r_bf(v), grads_x[k]) / rel(r_bf(grads_x[k]), grads_x[k])
    return out


POINTS = {  # the t11 plan (backward recomputing the forward): where the kernels round, to what
    "xhat_in16": r_fp16, "w_fold16": r_fp16, "ab": r_bf, "ab_x": r_bf, "x": r_bf, "xhat_out16": r_fp16,
    "gate_logit": r_fp16, "dy": r_hilo, "dxhat_out": ident, "dx": r_bf, "dlin_ab": r_bf, "dlin_gate": r_bf,
    "dxhat_in": ident, "xhat_in_bf": r_bf, "xhat_out_bf": r_bf,
}
SAVED = {"ab_x": r_fp16}
VARIANTS = [  # (name, points made exact, points rounded as before t11[, points rounded otherwise])
    ("plan before t11 (bf16 d xhat and dy; H200 N=768: dz 2.24, weights <= 2.11)", [], ["dxhat_out", "dxhat_in", "dy"]),
    ("current plan, t11 (fp32 d xhat, dy hi/lo; H200 N=768: dz 1.88, weights <= 1.99)", [], []),
    ("  + dlin hi/lo", ["dlin_ab", "dlin_gate"], []),
    ("  + xhat_in hi/lo as the input-side weight-gradient operand", ["xhat_in_bf"], []),
    ("  + both", ["dlin_ab", "dlin_gate", "xhat_in_bf"], []),
    ("  + dx hi/lo (doubles the transposed products)", ["dx"], []),
    ("  + recomputed a, b exact (fp32 a, b)", ["ab", "ab_x"], []),
    ("  + recomputed forward exact (a, b, x, fp16 operands, gate)",
     ["ab", "ab_x", "x", "xhat_in16", "xhat_out16", "w_fold16", "gate_logit"], []),
    ("  + dlin, xhat_in, dx hi/lo and the forward exact",
     ["dlin_ab", "dlin_gate", "xhat_in_bf", "dx", "ab", "ab_x", "x", "xhat_in16", "xhat_out16", "w_fold16", "gate_logit"], []),
    ("every intermediate exact (only the final rounding: expect ~1)", list(POINTS), []),
    # t12 on: the backward reads the forward's saved set, so x was made from fp16 a, b
    ("saved forward, t12 (x from the forward's fp16 a, b)", [], [], SAVED),
    ("  saved + xhat_in hi/lo as the input-side weight-gradient operand", ["xhat_in_bf"], [], SAVED),
    ("  saved + dlin hi/lo", ["dlin_ab", "dlin_gate"], [], SAVED),
    ("  saved + dx hi/lo", ["dx"], [], SAVED),
    ("  saved + dlin and xhat_in hi/lo", ["dlin_ab", "dlin_gate", "xhat_in_bf"], [], SAVED),
    ("  t16 + dlin's a/b columns hi/lo (4Ch of 4Ch + C)", ["xhat_in_bf", "dlin_ab"], [], SAVED),
    ("  t16 + dlin's gate columns hi/lo (C of 4Ch + C)", ["xhat_in_bf", "dlin_gate"], [], SAVED),
]
WEIGHTS = ["Wp", "Wg", "Wgo", "Wz", "gi", "go"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--c", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    assert len({v[0] for v in VARIANTS}) == len(VARIANTS), "variant names key the table"
    acc = {v[0]: {k: 0.0 for k in ["dz"] + WEIGHTS} for v in VARIANTS}
    for seed in range(a.seeds):
        z, mask, w, dout = problem(a.n, a.c, seed)
        dz_x, g_x = exact(z, mask, w, dout)
        for name, exact_points, bf16_points, *other in VARIANTS:
            points = {**POINTS, **(other[0] if other else {})}
            R = {k: (ident if k in exact_points else r_bf if k in bf16_points else f) for k, f in points.items()}
            r = ratios(*emulated(z, mask, w, dout, R), dz_x, g_x)
            for k in r:
                acc[name][k] += r[k] / a.seeds
    print(f"N={a.n} C=Ch={a.c}, mean over {a.seeds} seeds; error / bf16 floor")
    names = {"Wp": "d p_in", "Wg": "d g_in", "Wgo": "d g_out", "Wz": "d p_out", "gi": "d γ_in", "go": "d γ_out"}
    print(f"{'variant':<88} {'dz':>5} " + " ".join(f"{names[k]:>8}" for k in WEIGHTS))
    for name, *_ in VARIANTS:
        print(f"{name:<88} {acc[name]['dz']:5.2f} " + " ".join(f"{acc[name][k]:8.2f}" for k in WEIGHTS))


if __name__ == "__main__":
    main()
