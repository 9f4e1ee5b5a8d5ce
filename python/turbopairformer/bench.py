"""Benchmark report: turbopairformer against the alternatives a user runs today.

    python -m turbopairformer.bench [--n 128,256,...] [--d 16,32] [--out DIR] [--quick]

Times forward and forward+backward (median of CUDA-event-timed calls after warm-up, inputs
rotated among three sets so that L2 does not serve them; one set where a set is over 1 GiB),
peak memory, relative RMSE against FP64 at one size and bitwise determinism of the gradients
over 5 calls, for triangle attention (B=1, H=4, S=N, bf16, 20% of keys masked) and the
multiplicative update (C=128). Each alternative runs in its own native layout, converted once
outside the timed region; one that fails or runs out of memory gets that written in its row and
the run goes on. Cases run size by size (every backend of both ops at one N before the next N),
so --budget SECONDS cuts the largest sizes rather than whole backends. Writes report.json, report.md and PNG plots into DIR (default
bench/results/<gpu>/).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import re
import signal
import statistics
import sys
import time
from pathlib import Path

import torch

from ._results import failure

H = 4
KEEP = 0.8


# ----------------------------------------------------------------------------- attention backends
def _eager_attention(q, k, v, bias, mask):  # [B,S,H,N,D]; scores in fp32 like OpenFold3's default
    s = torch.einsum("bshqd,bshkd->bshqk", q.float(), k.float()) / math.sqrt(q.shape[-1])
    s = s + bias.float() + (~mask).float() * -1e9
    return torch.einsum("bshqk,bshkd->bshqd", torch.softmax(s, -1).to(v.dtype), v)


def _sdpa_attention(q, k, v, bias, mask):
    attn = bias + (~mask).to(bias.dtype) * -1e9  # broadcast to [B,S,H,N,N]
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn)


def prep_layout_bsnhd(q, k, v, bias, mask):
    """DeepSpeed's and OpenFold3's layout: q, k, v [B,S,N,H,D], mask as an additive bias
    [B,S,1,1,N]."""
    t = lambda x: x.transpose(2, 3).contiguous()
    return t(q), t(k), t(v), bias, ((~mask).to(q.dtype) * -1e9).contiguous()


_SAME = (lambda x: x, lambda b: b)  # our layout already: [B,S,H,N,D] and bias [B,1,H,N,N]


def attention_backends():
    """name -> (prepare(q,k,v,bias,mask) -> args in the backend's native layout,
    fn(*args) -> out, (to_ours(q-like), to_ours(bias-like))), or a reason it is unavailable."""
    import turbopairformer as tpf

    b = {
        "turbopairformer": (
            lambda *a: a,
            lambda q, k, v, bias, mask: tpf.triangle_attention(q, k, v, bias, mask),
            _SAME,
        ),
        "pytorch_eager": (lambda *a: a, _eager_attention, _SAME),
        "pytorch_sdpa": (lambda *a: a, _sdpa_attention, _SAME),
    }
    try:
        import cuequivariance_torch as cueq

        b["cuequivariance"] = (
            lambda *a: a,
            lambda q, k, v, bias, mask: cueq.triangle_attention(q, k, v, bias, mask=mask),
            _SAME,
        )
    except Exception:
        b["cuequivariance"] = (
            "not installed: pip install cuequivariance-torch cuequivariance-ops-torch-cu13"
        )
    try:
        from trifast import triangle_attention as trifast_attention

        def prep(q, k, v, bias, mask):  # q, k, v [B,H,S,N,D]; bias [B,H,N,N]; mask True = masked
            t = lambda x: x.permute(0, 2, 1, 3, 4).contiguous()
            return t(q), t(k), t(v), bias[:, 0].contiguous(), (~mask[:, :, 0, 0]).contiguous()

        b["trifast"] = (
            prep,
            lambda q, k, v, bias, mask: trifast_attention(q, k, v, bias, mask),
            (lambda x: x.permute(0, 2, 1, 3, 4), lambda g: g.unsqueeze(1)),
        )
    except Exception:
        b["trifast"] = "not installed: pip install trifast"
    try:
        from deepspeed.ops.deepspeed4science import DS4Sci_EvoformerAttention

        b["deepspeed_evoformer"] = (
            prep_layout_bsnhd,
            lambda q, k, v, bias, mb: DS4Sci_EvoformerAttention(q, k, v, [mb, bias]),
            (lambda x: x.transpose(2, 3), lambda g: g),
        )
    except Exception:
        b["deepspeed_evoformer"] = (
            "not installed: pip install deepspeed (with the Evoformer op built)"
        )
    try:
        from openfold3.core.kernels.triton.evoformer import TritonEvoformer

        if TritonEvoformer is None:
            raise ImportError("TritonEvoformer is None (Triton missing)")
        # Same layout as DeepSpeed's: q, k, v [B,S,N,H,D], additive key mask [B,S,1,1,N],
        # bias [B,1,H,N,N]
        b["openfold3_triton"] = (
            prep_layout_bsnhd,
            lambda q, k, v, bias, mb: TritonEvoformer(q, k, v, mb, bias),
            (lambda x: x.transpose(2, 3), lambda g: g),
        )
    except Exception:
        b["openfold3_triton"] = "not installed: pip install openfold3 (its Triton kernels)"
    return b


def attention_inputs(N, D, seed, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v, dout = (
        torch.randn(1, N, H, N, D, device=device, generator=g).bfloat16() for _ in range(4)
    )
    bias = torch.randn(1, 1, H, N, N, device=device, generator=g).bfloat16()
    mask = torch.rand(1, N, 1, 1, N, device=device, generator=g) < KEEP
    return q, k, v, bias, mask, dout


# ------------------------------------------------------------------------------- trimul backends
TRIMUL_WEIGHTS = (
    "norm_in_weight",
    "norm_in_bias",
    "p_in_weight",
    "p_in_bias",
    "g_in_weight",
    "g_in_bias",
    "norm_out_weight",
    "norm_out_bias",
    "p_out_weight",
    "p_out_bias",
    "g_out_weight",
    "g_out_bias",
)


INCOMING = " (incoming)"  # the report's backend-name suffixes: the incoming direction,
FP32_WEIGHTS = " (fp32 weights)"  # and weights held in fp32 (what mixed-precision training holds)


def _eager_trimul(x, mask, w, eps=1e-5, direction="outgoing"):
    """AF3 Algorithms 12 (outgoing) and 13 (incoming) in plain PyTorch, cuEquivariance's weight
    packing."""
    C, Ch = x.shape[-1], w["p_in_weight"].shape[0] // 2
    xn = torch.nn.functional.layer_norm(x, (C,), w["norm_in_weight"], w["norm_in_bias"], eps)
    ab = (
        torch.sigmoid(torch.nn.functional.linear(xn, w["g_in_weight"], w["g_in_bias"]))
        * torch.nn.functional.linear(xn, w["p_in_weight"], w["p_in_bias"])
        * mask[..., None]
    )
    a, b = ab[..., :Ch], ab[..., Ch:]
    pattern = "bikc,bjkc->bijc" if direction == "outgoing" else "bkic,bkjc->bijc"
    y = torch.einsum(pattern, a, b)
    y = torch.nn.functional.layer_norm(y, (Ch,), w["norm_out_weight"], w["norm_out_bias"], eps)
    return torch.sigmoid(
        torch.nn.functional.linear(xn, w["g_out_weight"], w["g_out_bias"])
    ) * torch.nn.functional.linear(y, w["p_out_weight"], w["p_out_bias"])


def _cueq_trimul(cueq, wd):
    """cuEquivariance's op; with fp32 weights under bf16 autocast, as mixed-precision training
    calls it (it takes no fp32 weights beside bf16 activations otherwise)."""

    def call(x, d, mask, w):
        if wd != torch.float32:
            return cueq.triangle_multiplicative_update(x, d, mask, **w)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return cueq.triangle_multiplicative_update(x, d, mask, **w)

    return call


def trimul_backends(directions=("outgoing",), weight_dtypes=(torch.bfloat16,)):
    """name -> fn(x, mask, weights dict) -> out (with fn.direction and fn.weight_dtype), or a
    reason it is unavailable. Every backend takes cuEquivariance's argument names and packing, so
    one set of weights serves all. Incoming backends carry INCOMING in their name, fp32-weight
    ones FP32_WEIGHTS."""
    import turbopairformer as tpf

    try:
        import cuequivariance_torch as cueq
    except Exception:
        cueq = None
    compiled = torch.compile(_eager_trimul)

    def directed(fn, d, wd):
        def call(x, mask, w):
            return fn(x, d, mask, w)

        call.direction, call.weight_dtype = d, wd
        return call

    b = {}
    for wd in weight_dtypes:
        for d in directions:
            suffix = ("" if d == "outgoing" else INCOMING) + (
                FP32_WEIGHTS if wd == torch.float32 else ""
            )
            b["turbopairformer" + suffix] = directed(
                lambda x, d, mask, w: tpf.triangle_multiplicative_update(x, d, mask, **w), d, wd
            )
            b["pytorch_eager" + suffix] = directed(
                lambda x, d, mask, w: _eager_trimul(x, mask, w, direction=d), d, wd
            )
            b["torch_compile" + suffix] = directed(
                lambda x, d, mask, w: compiled(x, mask, w, direction=d), d, wd
            )
            b["cuequivariance" + suffix] = (
                directed(_cueq_trimul(cueq, wd), d, wd)
                if cueq is not None
                else "not installed: pip install cuequivariance-torch cuequivariance-ops-torch-cu13"
            )
    return b


def trimul_inputs(N, C, seed, device="cuda", weight_dtype=torch.bfloat16):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(1, N, N, C, device=device, generator=g).bfloat16()
    mask = (torch.rand(1, N, N, device=device, generator=g) < 0.9).bfloat16()
    dout = torch.randn(1, N, N, C, device=device, generator=g).bfloat16()
    w = {}
    for name in TRIMUL_WEIGHTS:
        shape = {
            "p_in_weight": (2 * C, C),
            "g_in_weight": (2 * C, C),
            "p_out_weight": (C, C),
            "g_out_weight": (C, C),
            "p_in_bias": (2 * C,),
            "g_in_bias": (2 * C,),
        }.get(name, (C,))
        t = torch.randn(*shape, device=device, generator=g)
        if name.endswith("weight") and len(shape) == 2:
            t = t / math.sqrt(shape[1])
        elif name.startswith("norm") and name.endswith("weight"):
            t = 1 + 0.1 * t
        else:
            t = 0.1 * t
        w[name] = t.bfloat16().to(weight_dtype)  # bf16 values in either dtype: same weights
    return x, mask, w, dout


# --------------------------------------------------------------------------------- measurement
# Inputs rotate among three sets so that L2 (50 MB on an H200) does not serve a call from the
# previous one's; a set over this size cannot stay in L2 anyway, and two more copies of it only
# take memory from the backend under test (three N = 4096 multiplicative-update sets: 26 GB).
ROTATED_SET_MAX_BYTES = 1 << 30


def input_set_count(set_bytes: int) -> int:
    """How many input sets a case rotates among: 3, or 1 for sets too large for L2 to matter."""
    return 3 if set_bytes <= ROTATED_SET_MAX_BYTES else 1


def accuracy_size(requested, Ns):
    """The N at which an op's cases also check accuracy and determinism: the one asked for, else
    256 where the op runs it, else the op's smallest N (so every report has the columns)."""
    if requested is not None:
        return requested
    return 256 if 256 in Ns else min(Ns, default=None)


def timed_iters(first_ms, target_ms=1500.0, lo=5, hi=15):
    """How many timed calls: up to `hi`, but no more than fit in `target_ms` (at least `lo`), so
    that a 400 ms case at N = 2048 does not cost as much wall time as the rest of its size."""
    return max(lo, min(hi, int(target_ms / max(first_ms, 1e-3))))


def median_ms(fn, sets, warmup=3, iters=None):
    for i in range(warmup):
        t0 = time.perf_counter()
        fn(*sets[i % len(sets)])
        torch.cuda.synchronize()
        last_ms = (time.perf_counter() - t0) * 1e3
    iters = iters or timed_iters(last_ms)
    times = []
    for i in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        args = sets[i % len(sets)]
        a.record()
        fn(*args)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def measure(fwd, grad_inputs_of, sets):
    """fwd(*args) -> out; grad_inputs_of(args) -> tensors to differentiate."""

    def fb(*args):
        out = fwd(*args)
        torch.autograd.grad(out, grad_inputs_of(args), sets_dout[id(args[0])], allow_unused=True)

    sets_dout = {}  # keyed by the first input tensor (fn(*args) repacks the tuple)
    for s in sets:
        with torch.no_grad():
            sets_dout[id(s[0])] = torch.randn_like(fwd(*s))
    with torch.no_grad():
        t_f = median_ms(lambda *a: fwd(*a), sets)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t_fb = median_ms(fb, sets)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return t_f, t_fb, peak


def rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item() if ref.norm() > 0 else float("nan")


# ------------------------------------------------------------------------------------- driver
class _OutOfTime(Exception):
    pass


def run_case(row, body, save):
    """Runs body(row), which fills in the measurements; records 'ok', 'out of memory' or the
    failure, and the case's wall time (first-call autotuning and compiling included); saves the
    partial report. One failing backend never stops the run."""
    t0 = time.monotonic()
    try:
        body(row)
        row["status"] = "ok"
    except torch.cuda.OutOfMemoryError:
        row["status"] = "out of memory"
    except Exception as e:  # noqa: BLE001 - the report records any failure
        row.update(failure(e))
    torch.cuda.empty_cache()  # after the handlers: the body's tensors are released by now
    row["case_s"] = round(time.monotonic() - t0, 1)
    save()


def attention_case(name, b, N, D, accuracy_n, rows, save):
    row = {"op": "triangle_attention", "backend": name, "N": N, "D": D}
    rows.append(row)
    if isinstance(b, str):
        row["status"] = b
        return
    prep, fn, to_ours = b

    def body(row):
        sets = []  # input sets in the backend's layout, leaves marked for autograd
        # q, k, v, dout [B,S,H,N,D] and the bias [B,1,H,N,N], 2 bytes each
        for seed in range(input_set_count(2 * (4 * N * H * N * D + H * N * N))):
            q, k, v, bias, mask, _ = attention_inputs(N, D, seed)
            args = list(prep(q, k, v, bias, mask))
            for i in range(4):
                args[i] = args[i].detach().requires_grad_(True)
            sets.append(tuple(args))
        row["fwd_ms"], row["fwd_bwd_ms"], row["peak_mib"] = measure(fn, lambda a: a[:4], sets)
        if N == accuracy_n:
            row.update(attention_accuracy(prep, fn, to_ours, N, D))

    run_case(row, body, save)


def attention_accuracy(prep, fn, to_ours, N, D):
    q, k, v, bias, mask, dout = attention_inputs(N, D, 99)
    ins = [t.double().requires_grad_(True) for t in (q, k, v, bias)]
    s = torch.einsum("bshqd,bshkd->bshqk", ins[0], ins[1]) / math.sqrt(D) + ins[3]
    s = s.masked_fill(~mask, float("-inf"))
    ref = torch.einsum("bshqk,bshkd->bshqd", torch.softmax(s, -1).nan_to_num(0.0), ins[2])
    ref_grads = torch.autograd.grad(ref, ins, dout.double())
    grads_runs = []
    for _ in range(5):
        args = list(prep(q, k, v, bias, mask))
        leaves = [args[i].detach().requires_grad_(True) for i in range(4)]
        out = fn(*leaves, *args[4:])
        grads_runs.append(
            torch.autograd.grad(
                out, leaves, _native_layout_like(dout, prep, q, k, v, bias, mask), allow_unused=True
            )
        )
    with torch.no_grad():
        out = to_ours[0](fn(*prep(q, k, v, bias, mask)))
    det = all(
        all(torch.equal(a, b) for a, b in zip(r, grads_runs[0]) if a is not None)
        for r in grads_runs[1:]
    )
    res = {"deterministic_5_calls": det, "rmse_out": rel(out, ref.detach())}
    for n, g, r, conv in zip(
        ("dq", "dk", "dv", "dbias"), grads_runs[0], ref_grads, (to_ours[0],) * 3 + (to_ours[1],)
    ):
        if g is not None:
            res[f"rmse_{n}"] = rel(conv(g), r)
    return res


def _native_layout_like(dout, prep, q, k, v, bias, mask):
    return prep(dout, k, v, bias, mask)[0]


def trimul_case(name, fn, N, accuracy_n, rows, save, C=128):
    row = {"op": "triangle_multiplicative_update", "backend": name, "N": N, "C": C}
    rows.append(row)
    if isinstance(fn, str):
        row["status"] = fn
        return

    def body(row):
        sets = []  # input sets: (x, mask, weights, autograd leaves)
        for seed in range(input_set_count(2 * 2 * N * N * C)):  # x and dout, bf16
            x, mask, w, _ = trimul_inputs(N, C, seed, weight_dtype=fn.weight_dtype)
            leaves = [x.requires_grad_(True)] + [w[k].requires_grad_(True) for k in TRIMUL_WEIGHTS]
            sets.append((x, mask, w, leaves))
        row["fwd_ms"], row["fwd_bwd_ms"], row["peak_mib"] = measure(
            lambda x, mask, w, leaves: fn(x, mask, w), lambda a: a[3], sets
        )
        if N == accuracy_n:
            row.update(trimul_accuracy(fn, N, C))

    run_case(row, body, save)


def schedule(att, tri, Ns, Ds, tri_Ns, ops):
    """(label, op, backend name, backend, N, D) in N-major order: every backend of both ops at
    one size before the next size, so a --budget stop drops the largest sizes, not whole
    backends or a whole op."""
    cases = []
    for N in sorted(set(Ns if "attention" in ops else []) | set(tri_Ns if "trimul" in ops else [])):
        if "attention" in ops and N in Ns:
            for D in Ds:
                for name, b in att.items():
                    cases.append((f"attention {name} N={N} D={D}", "attention", name, b, N, D))
        if "trimul" in ops and N in tri_Ns:
            for name, fn in tri.items():
                cases.append((f"trimul {name} N={N}", "trimul", name, fn, N, None))
    return cases


def trimul_fp64(x, mask, w, dout, direction="outgoing"):
    """[out, dz, d(each weight in TRIMUL_WEIGHTS order)] from FP64 autograd on x's device."""
    x64 = x.double().requires_grad_(True)
    w64 = {k: v.double().requires_grad_(True) for k, v in w.items()}
    ref = _eager_trimul(x64, mask.double(), w64, direction=direction)
    grads = torch.autograd.grad(ref, [x64] + [w64[k] for k in TRIMUL_WEIGHTS], dout.double())
    return [ref.detach()] + list(grads)


def trimul_accuracy(fn, N, C):
    x, mask, w, dout = trimul_inputs(N, C, 99, weight_dtype=fn.weight_dtype)
    ref, *ref_grads = trimul_fp64(x, mask, w, dout, fn.direction)
    runs = []
    for _ in range(5):
        xl = x.detach().requires_grad_(True)
        wl = {k: v.detach().requires_grad_(True) for k, v in w.items()}
        out = fn(xl, mask, wl)
        runs.append(
            torch.autograd.grad(
                out, [xl] + [wl[k] for k in TRIMUL_WEIGHTS], dout, allow_unused=True
            )
        )
    det = all(all(torch.equal(a, b) for a, b in zip(r, runs[0]) if a is not None) for r in runs[1:])
    res = {
        "deterministic_5_calls": det,
        "rmse_out": rel(out.detach(), ref),
        "rmse_dz": rel(runs[0][0], ref_grads[0]),
    }
    worst = max(
        (rel(g, r), k)
        for g, r, k in zip(runs[0][1:], ref_grads[1:], TRIMUL_WEIGHTS)
        if g is not None
    )
    res["rmse_worst_weight_grad"], res["worst_weight"] = worst
    return res


def trimul_floor_table(Ns, C=128, device="cuda", seed=99):
    """Relative RMSE of our multiplicative update (out, dz, every weight gradient) against an
    FP64 autograd reference computed on the same device (cuBLAS DGEMM: seconds where the C++ FP64
    CPU reference of `tpf trimul-table` takes minutes to hours), each with its ratio to the bf16
    floor (the exact answer rounded once to bf16): the accuracy half of issue 5's table at every
    N. Rows that run out of memory say so."""
    import turbopairformer as tpf

    rows = []
    for N in Ns:
        row = {"N": N, "C": C}
        rows.append(row)
        try:
            x, mask, w, dout = trimul_inputs(N, C, seed, device)
            xl = x.detach().requires_grad_(True)
            wl = {k: v.detach().requires_grad_(True) for k, v in w.items()}
            out = tpf.triangle_multiplicative_update(xl, "outgoing", mask, **wl)
            ours = [out.detach()] + list(
                torch.autograd.grad(out, [xl] + [wl[k] for k in TRIMUL_WEIGHTS], dout)
            )
            del out, xl, wl
            refs = trimul_fp64(x, mask, w, dout)
            for name, o, r in zip(["out", "dz"] + ["d_" + k for k in TRIMUL_WEIGHTS], ours, refs):
                err, floor = rel(o, r), rel(r.to(torch.bfloat16), r)
                row[name] = {
                    "rel_rmse": err,
                    "floor": floor,
                    "ratio": err / floor if floor > 0 else float("nan"),
                }
            row["status"] = "ok"
        except torch.cuda.OutOfMemoryError:
            row["status"] = "out of memory"
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def write_floor_table(rows, out_dir: Path, gpu: str):
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "trimul_accuracy.json").write_text(json.dumps({"gpu": gpu, "rows": rows}, indent=1))
    lines = [
        f"# Multiplicative update: accuracy against FP64 on {gpu}",
        "",
        "B=1, C = Ch = 128, outgoing, bf16 z ~ N(0, 1), bf16 weights at an initialisation "
        "scale (matrices N(0, 1/fan_in), LayerNorm gains 1 + N(0, 0.01), biases N(0, 0.01)), "
        "10% of pairs masked, training path (the forward saves, the backward reads). Relative "
        "RMSE against an FP64 autograd reference on the GPU; in parentheses its ratio to the "
        "bf16 floor (the exact answer rounded once to bf16). Target: every ratio <= 2. Made by "
        "`python -m turbopairformer.bench --trimul-accuracy N,...`.",
        "",
        "| N | out | dz | worst weight gradient | every ratio <= 2 |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"| {r['N']} | — | — | — | {r.get('status', '')} |")
            continue
        f = lambda k: f"{r[k]['rel_rmse']:.2e} ({r[k]['ratio']:.2f})"
        worst = max((v["ratio"], k) for k, v in r.items() if k.startswith("d_"))
        over = [
            f"{k} {v['ratio']:.2f}" for k, v in r.items() if isinstance(v, dict) and v["ratio"] > 2
        ]
        verdict = "yes" if not over else "no: " + ", ".join(over)
        lines.append(
            f"| {r['N']} | {f('out')} | {f('dz')} | {worst[0]:.2f} ({worst[1]}) | {verdict} |"
        )
    (out_dir / "trimul_accuracy.md").write_text("\n".join(lines) + "\n")


def _cell(r, key):
    if r is None:
        return "—"
    if key in r:
        return f"{r[key]:.2f}" if r[key] >= 1 else f"{r[key]:.3f}"
    st = r.get("status", "")
    return {"out of memory": "OOM"}.get(
        st,
        "skipped"
        if st.startswith(("not installed", "installed"))
        else "failed"
        if st.startswith("failed")
        else "—",
    )


def summary_tables(rows):
    """Backend x N tables of forward and forward+backward ms, one per op (and head dim): the
    table a reader compares at a glance (the README quotes it)."""
    lines = []
    for op, key in (("triangle_attention", "D"), ("triangle_multiplicative_update", "C")):
        sub = [r for r in rows if r["op"] == op]
        for kv in sorted({r.get(key) for r in sub}, key=lambda x: x or 0):
            part = [r for r in sub if r.get(key) == kv]
            Ns = sorted({r["N"] for r in part})
            backends = list(dict.fromkeys(r["backend"] for r in part))
            by = {(r["backend"], r["N"]): r for r in part}
            for metric, title in (("fwd_bwd_ms", "forward + backward"), ("fwd_ms", "forward")):
                lines += [
                    f"**{op}, {key} = {kv}: {title}, ms**",
                    "",
                    "| backend | " + " | ".join(f"N={n}" for n in Ns) + " |",
                    "|---|" + "---|" * len(Ns),
                ]
                for b in backends:
                    lines.append(
                        f"| {b} | " + " | ".join(_cell(by.get((b, n)), metric) for n in Ns) + " |"
                    )
                lines.append("")
    return lines


def write_report(
    rows, out_dir: Path, gpu: str, plots: bool = True, torch_version: str = None, meta: dict = None
):
    out_dir.mkdir(parents=True, exist_ok=True)
    torch_version = torch_version or torch.__version__
    meta = meta or {}
    (out_dir / "report.json").write_text(
        json.dumps({"gpu": gpu, "torch": torch_version, **meta, "rows": rows}, indent=1)
    )
    lines = [
        f"# Pairformer kernels on {gpu}",
        "",
        "![triangle attention](triangle_attention.png)",
        "",
        "![triangle multiplicative update](triangle_multiplicative_update.png)",
        "",
        f"PyTorch {torch_version}. Attention: B=1, H={H}, S=N, bf16, 20% of keys masked. "
        "Multiplicative update: B=1, C=Ch=128, outgoing, bf16 (x, weights), 10% of pairs "
        "masked. Median ms of CUDA-event-timed calls; peak memory of forward+backward above the "
        "inputs; 'case s' is the wall time of the whole case (inputs, first-call autotuning or "
        "compiling, timing, accuracy). Made by `python -m turbopairformer.bench`.",
        "",
    ]
    if "command" in meta:
        lines += [
            f"Command: `{meta['command']}`; "
            f"wall time of the whole run: {meta.get('wall_s', 0):.0f} s.",
            "",
        ]
    lines += [f"**Note:** {r['status']}" for r in rows if r["op"] == "note"]
    lines += [""] + summary_tables(rows)
    for op in ("triangle_attention", "triangle_multiplicative_update"):
        sub = [r for r in rows if r["op"] == op]
        if not sub:
            continue
        first = {}  # backends in order of first appearance; rows grouped by backend, D, N
        for r in sub:
            first.setdefault(r["backend"], len(first))
        sub.sort(key=lambda r: (first[r["backend"]], r.get("D") or 0, r["N"]))
        grad = "dq" if op == "triangle_attention" else "dz"
        lines += [
            f"## {op}",
            "",
            f"| backend | N | D | fwd ms | fwd+bwd ms | peak MiB | rel RMSE (out, {grad}) "
            "| deterministic | case s | status |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in sub:
            f = lambda k, fmt="{:.3f}": fmt.format(r[k]) if k in r else "—"
            acc = (
                f"{f('rmse_out', '{:.2e}')}, {f('rmse_' + grad, '{:.2e}')}"
                if "rmse_out" in r
                else "—"
            )
            det = {True: "yes", False: "NO"}.get(r.get("deterministic_5_calls"), "—")
            lines.append(
                f"| {r['backend']} | {r['N']} | {r.get('D', '—')} | {f('fwd_ms')} "
                f"| {f('fwd_bwd_ms')} | {f('peak_mib', '{:.0f}')} | {acc} | {det} "
                f"| {f('case_s', '{:.1f}')} | {r['status']} |"
            )
        lines.append("")
    (out_dir / "report.md").write_text("\n".join(lines))
    if not plots:
        return
    try:
        plot(rows, out_dir)
    except Exception as e:  # noqa: BLE001 - plots are optional (matplotlib)
        print(f"plots skipped: {e}", file=sys.stderr)


def plot(rows, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    for op, key in (("triangle_attention", "D"), ("triangle_multiplicative_update", "C")):
        sub = [r for r in ok if r["op"] == op]
        if not sub:
            continue
        fig, axes = plt.subplots(2, 2, figsize=(13, 9.5))
        axes = axes.ravel()
        backends = list(dict.fromkeys(r["backend"] for r in sub))  # one colour per backend
        values = sorted({r.get(key) for r in sub})  # one line style per head dim
        for backend, kv in sorted({(r["backend"], r.get(key)) for r in sub}):
            pts = sorted((r["N"], r) for r in sub if r["backend"] == backend and r.get(key) == kv)
            Ns = [n for n, _ in pts]
            label = f"{backend} {key}={kv}"
            style = dict(
                color=f"C{backends.index(backend)}",
                marker="o" if backend == "turbopairformer" else "s",
                linestyle=("-", "--", ":")[values.index(kv) % 3],
                lw=2.2 if backend == "turbopairformer" else 1.2,
            )
            axes[0].plot(Ns, [r["fwd_ms"] for _, r in pts], label=label, **style)
            axes[1].plot(Ns, [r["fwd_bwd_ms"] for _, r in pts], label=label, **style)
            ours = {
                r["N"]: r for r in sub if r["backend"] == "turbopairformer" and r.get(key) == kv
            }
            sp = [(n, r["fwd_bwd_ms"] / ours[n]["fwd_bwd_ms"]) for n, r in pts if n in ours]
            if sp and backend != "turbopairformer":
                axes[2].plot([n for n, _ in sp], [s for _, s in sp], label=label, **style)
            axes[3].plot(Ns, [r["peak_mib"] for _, r in pts], label=label, **style)
        axes[2].axhline(1.0, color="k", lw=0.8)
        titles = (
            "forward time (ms)",
            "forward+backward time (ms)",
            "our speedup, forward+backward\n(their time / ours; above 1: we are faster)",
            "peak memory, forward+backward (MiB)",
        )
        for ax, title in zip(axes, titles):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("N")
            ax.set_title(title, fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7)
        fig.suptitle(op)
        fig.tight_layout()
        fig.savefig(out_dir / f"{op}.png", dpi=100)
        plt.close(fig)


def head_dim_table(Ns, Ds):
    """Our attention at every head dim D of Ds (B=1, H=4, S=N): the padded ones (D off 16, 32, 64,
    128) next to the native dim they run on, so the cost of padding reads off as a ratio."""
    import turbopairformer as tpf
    from .attention import NATIVE_HEAD_DIMS, _padded_head_dim

    rows = []
    for N in Ns:
        for D in Ds:
            sets = [attention_inputs(N, D, seed) for seed in range(3)]
            fwd = lambda q, k, v, bias, mask, dout: tpf.triangle_attention(q, k, v, bias, mask)
            for st in sets:
                for t in st[:4]:
                    t.requires_grad_(True)
            t_f, t_fb, peak = measure(fwd, lambda a: a[:4], sets)
            rows.append(
                {
                    "N": N,
                    "D": D,
                    "runs_on": _padded_head_dim(D),
                    "native": D in NATIVE_HEAD_DIMS,
                    "fwd_ms": t_f,
                    "fwd_bwd_ms": t_fb,
                    "peak_mib": peak,
                }
            )
            del sets
            torch.cuda.empty_cache()
    by = {(r["N"], r["D"]): r for r in rows}
    for r in rows:
        base = by.get((r["N"], r["runs_on"]))
        if base and not r["native"]:
            r["fwd_vs_native"] = r["fwd_ms"] / base["fwd_ms"]
            r["fwd_bwd_vs_native"] = r["fwd_bwd_ms"] / base["fwd_bwd_ms"]
    return rows


def write_head_dim_table(rows, out_dir: Path, gpu: str, command: str):
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "head_dims.json").write_text(
        json.dumps({"gpu": gpu, "command": command, "rows": rows}, indent=1)
    )
    lines = [
        f"# Triangle attention at every head dim ({gpu})",
        "",
        f"`{command}`: B = 1, H = 4, S = N, bf16, 20% of keys masked; median of CUDA-event-timed "
        "calls, three rotated input sets. A head dim off 16/32/64/128 runs zero-padded on the next "
        "of those (`runs on`); the ratios compare it with that native dim at the same N (the pad "
        "copies q, k, v and slices the gradients).",
        "",
        "| N | D | runs on | fwd ms | fwd+bwd ms | peak MiB | fwd / native | fwd+bwd / native |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = lambda k: f"{r[k]:.2f}" if k in r else "—"
        lines.append(
            f"| {r['N']} | {r['D']} | {r['runs_on']} | {r['fwd_ms']:.3f} | {r['fwd_bwd_ms']:.3f} | "
            f"{r['peak_mib']:.0f} | {ratio('fwd_vs_native')} | {ratio('fwd_bwd_vs_native')} |"
        )
    (out_dir / "head_dims.md").write_text("\n".join(lines) + "\n")


def _out_dir(out, gpu: str) -> Path:
    """--out, or bench/results/<gpu> (e.g. 'h200' for 'NVIDIA H200')."""
    slug = re.sub(r"^nvidia-", "", re.sub(r"[^a-z0-9]+", "-", gpu.lower())).strip("-")
    return Path(out) if out else Path("bench/results") / slug


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--n",
        default=None,
        help="N list (default: 128,...,2048; with --pairformer 256,384,512,640,768,1024; with "
        "--breakdown 768)",
    )
    ap.add_argument("--d", default="16,32")
    ap.add_argument(
        "--trimul-n", default=None, help="N list for the multiplicative update (default: --n)"
    )
    ap.add_argument(
        "--accuracy-n",
        type=int,
        default=None,
        help="N of the FP64 accuracy and determinism check (default: 256 where the run has it, "
        "else each op's smallest N)",
    )
    ap.add_argument("--out", default=None)
    ap.add_argument("--ops", default="attention,trimul")
    ap.add_argument(
        "--trimul-weights",
        default="bf16",
        help="multiplicative-update weight dtypes: bf16 (cuEquivariance's best form), fp32 or "
        "both (bf16,fp32); fp32 rows carry ' (fp32 weights)' in the backend name",
    )
    ap.add_argument(
        "--trimul-directions",
        default="outgoing",
        help="multiplicative-update directions: outgoing, incoming or both (outgoing,incoming); "
        "incoming rows carry ' (incoming)' in the backend name",
    )
    ap.add_argument("--quick", action="store_true", help="N up to 768 only")
    ap.add_argument(
        "--trimul-accuracy",
        metavar="N_LIST",
        default=None,
        help="only the multiplicative update's accuracy against FP64 (on the GPU) at these N",
    )
    ap.add_argument(
        "--attention-accuracy",
        metavar="N_LIST",
        default=None,
        help="only triangle attention's accuracy on peaked softmax rows (logit std 1-8, dominant "
        "keys), ours with and without compensation and the peers, at these N and --d",
    )
    ap.add_argument(
        "--pairformer",
        action="store_true",
        help="only the Pairformer training step (one block, and a 4-block stack with AdamW), "
        "at --n",
    )
    ap.add_argument(
        "--modes",
        default="eager,compile",
        help="with --pairformer (and --breakdown): any of eager, compile and compile-ro "
        '(torch.compile(mode="reduce-overhead"): CUDA graphs, for the host-bound small N)',
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="with --pairformer: keep the cases already in --out's pairformer.json (measured, or "
        "out of memory) and run only the others, adding this call's command to the table's; "
        "a sweep longer than one session's call is the same command run again",
    )
    ap.add_argument(
        "--backends",
        default=None,
        help="a comma list of backends to run (default: every one available); with --pairformer "
        "(and --breakdown) the Pairformer backends, otherwise the attention and multiplicative-"
        "update ones (e.g. turbopairformer,cuequivariance,trifast)",
    )
    ap.add_argument(
        "--transition",
        action="store_true",
        help="only the pair transition's node, fused kernels against the unfused path, at --n "
        "(default 384,768,1024)",
    )
    ap.add_argument(
        "--gated-linear",
        action="store_true",
        help="only the attention layers' gated output projection, the fused forward kernel "
        "against the unfused path, at --n (default 384,768,1024)",
    )
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="with --pairformer: each pair-track module alone, ours and plain PyTorch, with our "
        "kernels' share of the time and the top kernels",
    )
    ap.add_argument(
        "--head-dims",
        metavar="D_LIST",
        default=None,
        help="only our attention at these head dims (padded ones beside their native dim), at --n",
    )
    ap.add_argument(
        "--replot",
        metavar="REPORT_JSON",
        default=None,
        help="rewrite the Markdown and the plots from an earlier report.json, "
        "attention_accuracy_peaked.json, pairformer.json or pairformer_breakdown.json, then stop",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        metavar="PAIRFORMER_JSON",
        default=None,
        help="join pairformer.json tables of separate calls on one GPU into one (later calls' "
        "measured cases replace earlier rows of the same case), written to --out, then stop",
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds; cases not started by then are recorded as skipped",
    )
    args = ap.parse_args(argv)
    if args.resume and (not args.pairformer or args.breakdown):
        ap.error("--resume continues a --pairformer table (not --breakdown)")
    from .bench_pairformer import MODES

    unknown_modes = set(args.modes.split(",")) - set(MODES)
    if unknown_modes:
        ap.error(f"--modes: unknown {', '.join(sorted(unknown_modes))} ({', '.join(MODES)})")
    if args.merge:
        from . import bench_pairformer

        if not args.out:
            ap.error("--merge writes to --out (a folder; its pairformer.* are replaced)")
        tables = [json.loads(Path(p).read_text()) for p in args.merge]
        gpu, rows, commands = bench_pairformer.merged(tables)
        bench_pairformer.write(rows, Path(args.out), gpu, commands)
        return
    if args.replot and Path(args.replot).stem in (
        "attention_accuracy_peaked",
        "pairformer",
        "pairformer_breakdown",
    ):
        from . import bench_accuracy, bench_pairformer

        data = json.loads(Path(args.replot).read_text())
        out = Path(args.out or Path(args.replot).parent)
        if Path(args.replot).stem == "attention_accuracy_peaked":
            bench_accuracy.write(data["rows"], out, data["gpu"], data["command"])
        elif Path(args.replot).stem == "pairformer":
            commands = bench_pairformer.commands_of(data)
            bench_pairformer.write(data["rows"], out, data["gpu"], commands)
        else:
            tops = data.get("top_kernels", [])
            bench_pairformer.write_breakdown(data["rows"], tops, out, data["gpu"], data["command"])
        return
    if args.replot:
        data = json.loads(Path(args.replot).read_text())
        write_report(
            data["rows"],
            Path(args.out or Path(args.replot).parent),
            data["gpu"],
            torch_version=data.get("torch"),
            meta={k: data[k] for k in ("command", "wall_s") if k in data},
        )
        return
    report_run = not (
        args.trimul_accuracy
        or args.attention_accuracy
        or args.pairformer
        or args.head_dims
        or args.transition
        or args.gated_linear
    )
    directions = args.trimul_directions.split(",")
    if report_run and not set(directions) <= {"outgoing", "incoming"}:
        sys.exit(
            f"turbopairformer.bench: --trimul-directions takes outgoing, incoming: {directions}"
        )
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    if report_run and not set(args.trimul_weights.split(",")) <= set(dtypes):
        sys.exit(f"turbopairformer.bench: --trimul-weights takes bf16, fp32: {args.trimul_weights}")
    weight_dtypes = [dtypes[k] for k in args.trimul_weights.split(",") if k in dtypes]
    if report_run and args.backends:  # before the GPU check: a typo fails on any machine
        known = {*attention_backends(), *trimul_backends()}
        unknown = sorted(set(args.backends.split(",")) - known)
        if unknown:
            sys.exit(f"turbopairformer.bench: unknown backends {unknown}; known: {sorted(known)}")
    if not torch.cuda.is_available():
        sys.exit("turbopairformer.bench: no CUDA GPU; the report times GPU kernels")
    gpu = torch.cuda.get_device_name()
    command = "python -m turbopairformer.bench " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.trimul_accuracy:
        out = _out_dir(args.out, gpu)
        rows = trimul_floor_table([int(n) for n in args.trimul_accuracy.split(",")])
        write_floor_table(rows, out, gpu)
        print(f"written {out}/trimul_accuracy.md")
        return
    for flag in ("transition", "gated_linear"):  # one fused node against its unfused path
        if getattr(args, flag):
            node = importlib.import_module(f".bench_{flag}", __package__)
            out = _out_dir(args.out, gpu)
            rows = node.table([int(n) for n in (args.n or "384,768,1024").split(",")])
            node.write(rows, out, gpu, command)
            print(f"written {out}/{flag}.md")
            return
    if args.attention_accuracy:
        from . import bench_accuracy

        out = _out_dir(args.out, gpu)
        Ns = [int(n) for n in args.attention_accuracy.split(",")]
        rows = bench_accuracy.table(Ns, [int(d) for d in args.d.split(",")])
        bench_accuracy.write(rows, out, gpu, command)
        print(f"written {out}/attention_accuracy_peaked.md")
        return
    default_n = "128,256,384,512,640,768,1024,1536,2048"
    if args.pairformer:
        default_n = "768" if args.breakdown else "256,384,512,640,768,1024"
    Ns = [int(x) for x in (args.n or default_n).split(",")]
    if args.pairformer:
        from . import bench_pairformer

        out = _out_dir(args.out, gpu)
        backends = args.backends.split(",") if args.backends else None
        if args.breakdown:
            modes = args.modes.split(",")
            bench_pairformer.breakdown(Ns, out, gpu, command, only=backends, modes=modes)
            print(f"written {out}/pairformer_breakdown.md")
            return
        bench_pairformer.run(
            Ns, args.modes.split(","), out, gpu, command, backends, args.resume, args.budget
        )
        print(f"written {out}/pairformer.md")
        return
    if args.head_dims:
        out = _out_dir(args.out, gpu)
        write_head_dim_table(
            head_dim_table(Ns, [int(d) for d in args.head_dims.split(",")]), out, gpu, command
        )
        print(f"written {out}/head_dims.md")
        return
    if args.quick:
        Ns = [n for n in Ns if n <= 768]
    Ds = [int(x) for x in args.d.split(",")]
    tri_Ns = [int(x) for x in args.trimul_n.split(",")] if args.trimul_n else Ns
    out = _out_dir(args.out, gpu)
    att, tri = attention_backends(), trimul_backends(directions, weight_dtypes)
    if args.backends:
        wanted = args.backends.split(",")
        att = {k: v for k, v in att.items() if k in wanted}
        tri = {k: v for k, v in tri.items() if k.split(" (")[0] in wanted}
    for name, b in list(att.items()) + list(tri.items()):
        if isinstance(b, str):
            print(f"skipping {name}: {b}", file=sys.stderr)
    ops = args.ops.split(",")
    cases = schedule(att, tri, Ns, Ds, tri_Ns, ops)
    total = len(cases)
    try:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="case")
        progress = lambda msg: (bar.set_description(msg), bar.update(1))
    except ImportError:
        count = [0]

        def progress(msg):
            count[0] += 1
            print(f"[{count[0]}/{total}] {msg}", file=sys.stderr)

    rows = []
    started = time.monotonic()
    meta = lambda: {
        "command": command,
        "wall_s": round(time.monotonic() - started, 1),
    }
    save = lambda: write_report(
        rows, out, gpu, plots=False, meta=meta()
    )  # partial results survive a kill

    def on_term(signum, frame):  # e.g. `timeout`: finish the report, plots included, then stop
        for r in rows:  # the case that was running
            r.setdefault("status", f"stopped by signal {signum} while running")
        rows.append({"op": "note", "backend": "-", "N": 0, "status": f"stopped by signal {signum}"})
        write_report(rows, out, gpu, meta=meta())
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    deadline = time.monotonic() + args.budget if args.budget else None
    inner = progress

    def progress(msg):
        inner(msg)
        if deadline is not None and time.monotonic() > deadline:
            raise _OutOfTime()

    try:
        for label, op, name, b, N, D in cases:
            progress(label)
            if op == "attention":
                attention_case(name, b, N, D, accuracy_size(args.accuracy_n, Ns), rows, save)
            else:
                trimul_case(name, b, N, accuracy_size(args.accuracy_n, tri_Ns), rows, save)
    except _OutOfTime:
        rows.append(
            {
                "op": "note",
                "backend": "-",
                "N": 0,
                "status": f"stopped: --budget {args.budget} s reached",
            }
        )
    write_report(rows, out, gpu, meta=meta())
    print(f"report written to {out}/report.md in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
