"""Triangle attention's gradients where softmax rows are peaked, which is when dP - Dlt cancels
and the output-residual compensation matters: logit standard deviations 1, 2, 4 and 8, and a
bias with a few dominant keys per row. Ours with compensation on and off, PyTorch SDPA, trifast
and cuEquivariance on the same inputs, each as relative RMSE against an FP64 autograd reference
over its ratio to the bf16 floor (the exact answer rounded once to bf16).

    python -m turbopairformer.bench --attention-accuracy 256[,384] [--d 32] [--out DIR]

Inputs: B = 1, S = N, H = 4, bf16, 20% of keys masked. Logit std s: q and the bias scaled by
s / sqrt(2), so that scale q.k + bias has variance s^2 (k, v, dout unit normal). Dominant keys:
unit inputs plus 8 on 4 random keys of every bias row.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

from ._results import failure, write_tables

LOGIT_STDS = (1.0, 2.0, 4.0, 8.0)
DOMINANT_KEYS, DOMINANT_BOOST = 4, 8.0
GRADS = ("out", "dq", "dk", "dv", "dbias")


def peaked_inputs(N, D, kind, seed=5, device="cuda", H=4, keep=0.8):
    """(q, k, v, bias, mask, dout) in bf16 for one input kind: a logit std (float) or
    'dominant'."""
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=g)

    q, k, v, dout = (randn(1, N, H, N, D) for _ in range(4))
    bias = randn(1, 1, H, N, N)
    if kind == "dominant":
        idx = torch.rand(1, 1, H, N, N, device=device, generator=g).topk(DOMINANT_KEYS, -1).indices
        bias = bias.scatter_add(-1, idx, torch.full(idx.shape, DOMINANT_BOOST, device=device))
    else:
        q, bias = q * (kind / math.sqrt(2.0)), bias * (kind / math.sqrt(2.0))
    mask = torch.rand(1, N, 1, 1, N, device=device, generator=g) < keep
    return (*(t.bfloat16() for t in (q, k, v, bias)), mask, dout.bfloat16())


def _fp64_reference(q, k, v, bias, mask, dout):
    ins = [t.double().requires_grad_(True) for t in (q, k, v, bias)]
    s = torch.einsum("bshqd,bshkd->bshqk", ins[0], ins[1]) / math.sqrt(q.shape[-1]) + ins[3]
    s = s.masked_fill(~mask, float("-inf"))
    out = torch.einsum("bshqk,bshkd->bshqd", torch.softmax(s, -1).nan_to_num(0.0), ins[2])
    return [out.detach(), *torch.autograd.grad(out, ins, dout.double())]


def _rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item() if ref.norm() > 0 else float("nan")


def _backends():
    """name -> (prep, fn, to_ours) as bench.attention_backends(), ours with compensation on and
    off; unavailable peers as their reason."""
    from . import bench
    from .attention import triangle_attention

    peers = bench.attention_backends()
    b = {
        "turbopairformer": peers["turbopairformer"],
        "turbopairformer, no compensation": (
            lambda *a: a,
            lambda q, k, v, bias, mask: triangle_attention(q, k, v, bias, mask, compensate=False),
            bench._SAME,
        ),
    }
    for name in ("pytorch_sdpa", "trifast", "cuequivariance"):
        b[name] = peers[name]
    return b


def table(Ns, Ds, device="cuda"):
    rows = []
    backends = _backends()
    for N in Ns:
        for D in Ds:
            for kind in (*LOGIT_STDS, "dominant"):
                q, k, v, bias, mask, dout = peaked_inputs(N, D, kind, device=device)
                refs = _fp64_reference(q, k, v, bias, mask, dout)
                floors = [_rel(r.to(torch.bfloat16), r) for r in refs]
                for name, b in backends.items():
                    row = {"N": N, "D": D, "input": kind, "backend": name}
                    rows.append(row)
                    if isinstance(b, str):
                        row["status"] = b
                        continue
                    try:
                        row.update(_measure(b, (q, k, v, bias, mask, dout), refs, floors))
                        row["status"] = "ok"
                    except Exception as e:  # noqa: BLE001 - one failing peer never stops the table
                        row.update(failure(e, 100))
                del refs
                if device == "cuda":
                    torch.cuda.empty_cache()
    return rows


def _measure(backend, inputs, refs, floors):
    prep, fn, (to_q, to_bias) = backend
    q, k, v, bias, mask, dout = inputs
    args = list(prep(q, k, v, bias, mask))
    leaves = [args[i].detach().requires_grad_(True) for i in range(4)]
    out = fn(*leaves, *args[4:])
    grads = torch.autograd.grad(out, leaves, prep(dout, k, v, bias, mask)[0], allow_unused=True)
    got = [to_q(out.detach()), *(to_q(g) for g in grads[:3]), grads[3]]
    got[4] = None if got[4] is None else to_bias(got[4])
    res = {}
    for name, x, r, f in zip(GRADS, got, refs, floors):
        if x is not None:
            err = _rel(x, r)
            res[name] = {"rel_rmse": err, "ratio": err / f if f > 0 else float("nan")}
    return res


def write(rows, out_dir: Path, gpu: str, command: str):
    lines = [
        __doc__.split("\n\n", 2)[2].strip(),
        "",
        "Each cell: the ratio of the relative RMSE to the bf16 floor (1 = the floor); the best of "
        "the backends that ran is in bold.",
        "",
        "| N | D | input | backend | " + " | ".join(GRADS) + " | status |",
        "|---|---|---|---|" + "---|" * len(GRADS) + "---|",
    ]
    best = {}
    for r in rows:
        for g in GRADS:
            if g in r:
                key = (r["N"], r["D"], r["input"], g)
                best[key] = min(best.get(key, math.inf), r[g]["ratio"])
    for r in rows:
        label = r["input"] if r["input"] == "dominant" else f"logit std {r['input']:g}"
        cells = []
        for g in GRADS:
            if g not in r:
                cells.append("—")
                continue
            x = r[g]["ratio"]
            cells.append(
                f"**{x:.2f}**" if x == best[(r["N"], r["D"], r["input"], g)] else f"{x:.2f}"
            )
        lines.append(
            f"| {r['N']} | {r['D']} | {label} | {r['backend']} | "
            + " | ".join(cells)
            + f" | {r['status']} |"
        )
    lines[2:2] = ["![gradient error over the bf16 floor](attention_accuracy_peaked.png)", ""]
    write_tables(
        out_dir,
        "attention_accuracy_peaked",
        gpu,
        command,
        rows,
        "Triangle attention accuracy on peaked softmax rows",
        lines,
    )
    try:
        plot(rows, out_dir)
    except Exception as e:  # noqa: BLE001 - the plot is optional (matplotlib)
        print(f"plot skipped: {e}", file=sys.stderr)


PLOT_GRADS = ("dq", "dk", "dv", "dbias")


def plot(rows, out_dir: Path):
    """attention_accuracy_peaked.png: each gradient's error over the bf16 floor against the input
    (logit std, dominant keys), one line per backend, at the largest N of the table, one row of
    panels per head dim; the dashed line is the attention issue's 1.5x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("status") == "ok"]
    if not ok:
        return
    N = max(r["N"] for r in ok)
    Ds = sorted({r["D"] for r in ok if r["N"] == N})
    kinds = [*LOGIT_STDS, "dominant"]
    labels = [f"std {k:g}" if k != "dominant" else "dominant\nkeys" for k in kinds]
    backends = list(dict.fromkeys(r["backend"] for r in ok))
    fig, axes = plt.subplots(
        len(Ds),
        len(PLOT_GRADS),
        figsize=(4 * len(PLOT_GRADS), 3.4 * len(Ds)),
        squeeze=False,
        sharey=True,
    )
    for i, D in enumerate(Ds):
        for j, g in enumerate(PLOT_GRADS):
            ax = axes[i][j]
            for b in backends:
                by_kind = {
                    r["input"]: r for r in ok if r["N"] == N and r["D"] == D and r["backend"] == b
                }
                ys = [
                    by_kind[k][g]["ratio"] if k in by_kind and g in by_kind[k] else float("nan")
                    for k in kinds
                ]
                ours = b.startswith("turbopairformer")
                plain = "no compensation" in b  # drawn on top: it coincides with cuEquivariance
                ax.plot(
                    range(len(kinds)),
                    ys,
                    marker="x" if plain else "o" if ours else "s",
                    markersize=8 if plain else 6,
                    lw=2.2 if b == "turbopairformer" else 1.2,
                    linestyle="--" if plain else "-",
                    color=f"C{backends.index(b)}",
                    zorder=4 if ours else 2,
                    label=b,
                )
            ax.axhline(1.5, color="k", lw=0.8, linestyle=":")
            ax.set_yscale("log")
            ax.set_xticks(range(len(kinds)), labels)
            ax.set_title(f"{g}, D = {D}, N = {N}")
            ax.grid(alpha=0.3, which="both")
            if j == 0:
                ax.set_ylabel("relative RMSE / bf16 floor")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(
        "Triangle attention gradients on peaked softmax rows (1 = the bf16 floor; dotted: 1.5x)"
    )
    fig.tight_layout()
    fig.savefig(out_dir / "attention_accuracy_peaked.png", dpi=110)
    plt.close(fig)
