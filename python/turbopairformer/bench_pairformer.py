"""The Pairformer training step: one block's forward + backward, and a 4-block stack's full
optimizer step (forward, backward, AdamW), for each backend, eager and under torch.compile.

    python -m turbopairformer.bench --pairformer [--n 256,384,512,640,768,1024]
        [--modes eager,compile[,compile-ro]]

OpenFold3's training configuration: c_s = 384, c_z = 128, multiplicative-update hidden 128,
triangle attention 4 heads x 32, AttentionPairBias 16 heads x 24, SwiGLU transitions n = 4,
pair dropout 0.25 (training mode), B = 1, 5% padded tokens, bf16 autocast with fp32 weights, one
block per activation checkpoint in the stack. Backends: ours (turbopairformer.PairformerBlock),
OpenFold3's block in plain PyTorch (turbopairformer.reference) and, when importable, that block
wired to cuEquivariance's kernels as OpenFold3 wires them (fp32 weights), and with bf16 weights
(its Hopper multiplicative-update kernels), and with trifast's attention kernel; all load the
same weights. Each step sets the parameters' gradients to None as an optimizer's zero_grad does
(over a list, not nn.Module.zero_grad's walk of the module tree). Measures: median CUDA-event
time, peak extra memory, the relative error over valid pairs against an fp32 run of the
plain-PyTorch block (same weights, no autocast), and whether two backward passes give
bitwise-identical parameter gradients (dropout off for that check). The pair track column times
the block's pair stack alone (both multiplicative updates, both triangle attentions, the pair
transition: the Pairformer issue's "pair-track block") with the z part of the loss, in the same
mode, each step started on an idle GPU (the host's work before the first kernel counts); the
queued column times the same steps queued back to back (that host work hidden under the
previous step's kernels, as in a training loop that does not wait on the GPU); the column after
it times the forward + backward against a fixed gradient of the pair stack's output (masked,
fp32, as the next block would pass it), without the loss's passes over the N^2 x c_z output.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from ._results import failure, write_tables

PAD = 0.05
_now = time.monotonic  # the --budget clock


def _backends():
    """name -> (block factory, stack factory), or the reason the backend is unavailable. Every
    factory takes OpenFold3's configuration by default; weights are loaded afterwards."""
    from .pairformer import PairformerBlock, PairformerStack
    from .reference import (
        OpenFold3PairFormerBlock,
        OpenFold3PairFormerStack,
        wire_cuequivariance,
        wire_trifast,
    )

    b = {
        "turbopairformer": (PairformerBlock, PairformerStack),
        "pytorch": (OpenFold3PairFormerBlock, OpenFold3PairFormerStack),
    }
    try:
        import cuequivariance_torch  # noqa: F401

        def cueq(cls, bf16):
            def make(**kw):
                m = wire_cuequivariance(cls(**kw))
                return m.bfloat16() if bf16 else m

            return make

        # as OpenFold3 wires it (fp32 weights), and with bf16 weights, which its shape-specific
        # Hopper multiplicative-update kernels need
        b["cuequivariance"] = (
            cueq(OpenFold3PairFormerBlock, False),
            cueq(OpenFold3PairFormerStack, False),
        )
        b["cuequivariance_bf16w"] = (
            cueq(OpenFold3PairFormerBlock, True),
            cueq(OpenFold3PairFormerStack, True),
        )
    except ImportError:
        b["cuequivariance"] = (
            "not installed: pip install cuequivariance-torch cuequivariance-ops-torch-cu13"
        )
    try:
        import trifast  # noqa: F401

        def tri(cls):
            return lambda **kw: wire_trifast(cls(**kw))

        # its attention kernel inside the plain-PyTorch block (run it with --modes compile)
        b["trifast"] = (tri(OpenFold3PairFormerBlock), tri(OpenFold3PairFormerStack))
    except ImportError:
        b["trifast"] = "not installed: pip install trifast"
    return b


def _inputs(N, seed=0, c_s=384, c_z=128):
    g = torch.Generator(device="cuda").manual_seed(seed)
    s = torch.randn(1, N, c_s, device="cuda", generator=g)
    z = torch.randn(1, N, N, c_z, device="cuda", generator=g)
    sm = torch.ones(1, N, device="cuda")
    sm[:, N - int(PAD * N) :] = 0
    return s, z, sm, sm[:, :, None] * sm[:, None, :]


def _loss(so, zo, sm, pm):
    return (so.float() * sm[..., None]).square().mean() + (
        zo.float() * pm[..., None]
    ).square().mean()


# How each --modes mode runs a module: as it is, under torch.compile, or under torch.compile with
# inductor's CUDA graphs (mode="reduce-overhead": one replay a step, for the host-bound small N).
MODES = ("eager", "compile", "compile-ro")


def run_as(module, mode):
    """The module (or function) as the mode runs it (MODES)."""
    if mode == "eager":
        return module
    if mode == "compile":
        return torch.compile(module)
    if mode == "compile-ro":
        return torch.compile(module, mode="reduce-overhead")
    raise ValueError(f"unknown mode {mode!r}; the modes are {', '.join(MODES)}")


def _warm(fn, calls=2):
    """calls calls of fn (compiles, captures, allocator pools), then an idle GPU."""
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()


def _median_ms(fn, iters):
    _warm(fn)
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _queued_ms(fn, iters, warmups=2):
    """ms a call of fn with iters calls queued back to back between one pair of events: the
    host's work before a call's first kernel hides under the previous call's kernels, where
    _median_ms (an idle GPU at each call's start) counts it. warmups=0 right after _median_ms
    of the same fn, which warmed it."""
    _warm(fn, warmups)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters


def measure(name, mode, N, weights, iters=10):
    """One backend and mode at one N: the block's step, accuracy and repeatability, then the
    4-block stack's optimizer step (each part's tensors freed before the next)."""
    block_cls, stack_cls = _backends()[name]
    inputs = _inputs(N)
    row = {
        "backend": name,
        "mode": mode,
        "N": N,
        **_block_case(block_cls, mode, weights, inputs, iters),
    }
    torch.cuda.empty_cache()
    row.update(_stack_case(stack_cls, mode, weights, inputs, iters))
    torch.cuda.empty_cache()
    return row


def _grad_clearer(module):
    """A function that sets module's parameter gradients to None (nothing for a plain function),
    as an optimizer's zero_grad(set_to_none=True) does, over a list made once: nn.Module.zero_grad
    walks the module tree on every call, host time that a step timed from an idle GPU would count
    before its first kernel (~0.1 ms for a pair block on a 2-core CPU, ~0.02 for the list)."""
    params = list(module.parameters()) if isinstance(module, torch.nn.Module) else []

    def clear():
        for p in params:
            p.grad = None

    return clear


def block_step(block, fn, s, z, sm, pm):
    """One training step of `block` (run as fn: itself or compiled) on leaves s and z: forward
    under bf16 autocast, the bench's loss, backward. As a training step sees it: gradients
    assigned, not added to the last step's (in a model z and s are not leaves, and the optimizer
    sets parameter gradients to None; under CUDA graphs the last step's live in memory that a
    later replay overwrites, and adding to them is an error). Returns the block's outputs."""

    clear = _grad_clearer(block)

    def step():
        clear()
        s.grad = z.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            so, zo = fn(s, z, sm, pm)
        _loss(so, zo, sm, pm).backward()
        return so, zo

    return step


def _block_case(block_cls, mode, weights, inputs, iters):
    block = block_cls().cuda()
    block.load_state_dict(weights)
    block.train()
    fn = run_as(block, mode)
    s, z, sm, pm = inputs
    s, z = s.detach().requires_grad_(True), z.detach().requires_grad_(True)
    step = block_step(block, fn, s, z, sm, pm)
    row = {}
    torch.cuda.synchronize()
    t0 = time.monotonic()
    step()  # compile (and first-call) time, reported apart
    torch.cuda.synchronize()
    row["first_call_s"] = round(time.monotonic() - t0, 1)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    row["block_fwd_bwd_ms"] = _median_ms(step, iters)
    row["block_peak_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
    pair = _pair_track_ms(block, mode, z, pm, iters)
    row["pair_fwd_bwd_ms"], row["pair_queued_ms"], row["pair_dz_given_ms"] = pair

    # accuracy and repeatability, dropout off
    block.eval()
    grads = []
    for _ in range(2):
        so, zo = step()
        grads.append([p.grad.clone() for p in block.parameters()])
    row["grads_bitwise_repeatable"] = all(torch.equal(a, b) for a, b in zip(*grads))
    ref = _backends()["pytorch"][0]().cuda().eval()
    ref.load_state_dict(weights)
    with torch.no_grad():
        rs, rz = ref(s, z, sm, pm)
    v = sm[0].bool()
    rel = lambda a, b: ((a.float() - b).norm() / b.norm()).item()
    row["z_rel_err_vs_fp32"] = rel(zo.detach()[:, v][:, :, v], rz[:, v][:, :, v])
    row["s_rel_err_vs_fp32"] = rel(so.detach()[:, v], rs[:, v])
    return row


def _pair_track_ms(block, mode, z, pm, iters):
    """The block's pair stack alone, forward + backward (training mode, run as the block ran):
    ms with the bench's loss from an idle GPU, the same queued back to back, and ms against a
    fixed output gradient."""
    pair = block.pair_stack
    pair = run_as(pair, mode)
    dz = torch.randn_like(z) * pm[..., None]  # [B, N, N, c_z] fp32
    step, given = _pair_step(pair, z, pm), _pair_step(pair, z, pm, dz)
    # _median_ms's warm-up calls compile (the first step only: the second reuses the graphs)
    idle = _median_ms(step, iters)
    return idle, _queued_ms(step, iters, warmups=0), _median_ms(given, iters)


def _stack_case(stack_cls, mode, weights, inputs, iters):
    s2, z2, sm, pm = inputs
    stack = stack_cls(no_blocks=4, blocks_per_ckpt=1).cuda()
    for blk in stack.blocks:
        blk.load_state_dict(weights)
    sfn = run_as(stack, mode)
    opt = torch.optim.AdamW(stack.parameters(), lr=1e-4)

    def opt_step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            so, zo = sfn(s2, z2, sm, pm)
        _loss(so, zo, sm, pm).backward()
        opt.step()

    opt_step()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step_ms = _median_ms(opt_step, max(3, iters // 2))
    return {
        "stack4_step_ms": step_ms,
        "stack4_peak_gib": (torch.cuda.max_memory_allocated() - base) / 2**30,
    }


# A case's row while it runs: what the table says if the call is killed before the case ends.
RUNNING = "not finished: the call stopped while it ran"
# A case killed in two calls is not tried again (it needs more than a call has left).
GAVE_UP = "not finished in two calls (longer than a call's time left)"


def commands_of(data) -> list:
    """The commands of the calls that made a pairformer.json (one, or several after --resume)."""
    return data.get("commands") or [data["command"]]


def _kept_rows(out_dir: Path, gpu: str):
    """--resume: the rows and commands of the pairformer.json already in out_dir, and the cases
    to run again that a killed call left unfinished once ({case: kills}). Kept: measured cases,
    those that ran out of memory (a property of the size, not of the call) and those killed in two
    calls; dropped, so that this call runs them again: failures, budget stops, cases killed once
    and the unavailable-backend rows (this call says again which backends it lacks). Also
    returned, as read: the dropped case rows (a call narrowed by --n or --backends keeps those it
    does not run)."""
    path = out_dir / "pairformer.json"
    if not path.exists():
        return [], [], {}, []
    try:
        data = json.loads(path.read_text())
        rows, commands = data["rows"], commands_of(data)
    except (ValueError, KeyError, TypeError) as e:
        raise SystemExit(
            f"turbopairformer.bench: --resume cannot read {path} ({type(e).__name__}: {e}); "
            "move it away to start a fresh run"
        ) from None
    if data.get("gpu") != gpu:
        raise SystemExit(
            f"turbopairformer.bench: --resume: {path} was measured on {data.get('gpu')!r}, this "
            f"is {gpu!r}; one table holds one GPU's runs (use another --out)"
        )
    kept, retry, dropped = [], {}, []
    for r in rows:
        if r.get("N") == "-":
            continue
        row = dict(r, call=r.get("call", 0))
        if row.get("status") == RUNNING:
            kills = row.get("kills", 0) + 1
            if kills < 2:
                retry[(row["backend"], row["mode"], row["N"])] = kills
                dropped.append(r)
                continue
            row.update(status=GAVE_UP, kills=kills)
        if row.get("status", "out of memory") in ("out of memory", GAVE_UP):
            kept.append(row)
        else:
            dropped.append(r)
    return kept, commands, retry, dropped


def merged(tables):
    """One table from the pairformer.json data of separate calls (a call that did not --resume
    from the others, say), in order: the calls' commands in sequence, each row's call renumbered
    to match, and per case the latest measured (or out-of-memory) row; a later stopped, failed
    or unfinished row replaces only another such row. Returns (gpu, rows, commands)."""
    gpus = {t.get("gpu") for t in tables}
    if len(gpus) != 1:
        raise SystemExit(
            f"turbopairformer.bench: --merge: the tables were measured on {sorted(map(str, gpus))}; "
            "one table holds one GPU's runs"
        )
    cases, commands = {}, []
    for t in tables:
        for r in t["rows"]:
            row = dict(r, call=r.get("call", 0) + len(commands))
            key = (row["backend"], row["mode"], row["N"])
            old = cases.get(key)
            measured = row.get("status", "out of memory") == "out of memory"
            if old is None or measured or "status" in old and old["status"] != "out of memory":
                cases[key] = row
        commands += commands_of(t)
    return gpus.pop(), _ordered(list(cases.values())), commands


def run(Ns, modes, out_dir: Path, gpu: str, command: str, only=None, resume=False, budget=None):
    """Every (N, mode, backend) case, smallest N first, the table rewritten before and after
    each, so that a killed call loses only the case it was in, which its row then says (RUNNING).
    resume: keep the cases out_dir's table already holds (_kept_rows) and run the others, this
    call's command appended to the table's; budget: seconds after which no case starts (the rest
    are recorded as stopped, for a later --resume)."""
    from .reference import OpenFold3PairFormerBlock

    backends = _backends()
    if only is not None:
        unknown = sorted(set(only) - set(backends))
        if unknown:
            raise SystemExit(
                f"turbopairformer.bench: unknown backend(s) {', '.join(unknown)}; "
                f"choose from {', '.join(backends)}"
            )
        backends = {b: f for b, f in backends.items() if b in only}
    kept, commands, retry, dropped = _kept_rows(out_dir, gpu) if resume else ([], [], {}, [])
    call = len(commands)
    commands = commands + [command]
    selected = {(b, m, N) for N in Ns for m in modes for b in backends}
    # a row of a case this call does not select stays as it was (its call's)
    kept += [r for r in dropped if (r["backend"], r["mode"], r["N"]) not in selected]
    done = {(r["backend"], r["mode"], r["N"]) for r in kept}
    torch.manual_seed(0)
    weights = {n: p.detach().cuda() for n, p in OpenFold3PairFormerBlock().state_dict().items()}
    rows = kept + [
        {"backend": b, "mode": "-", "N": "-", "status": why, "call": call}
        for b, why in backends.items()
        if isinstance(why, str) and not any(r["backend"] == b for r in kept)
    ]
    cases = [
        (b, m, N)
        for N in Ns
        for m in modes
        for b, f in backends.items()
        if not isinstance(f, str) and (b, m, N) not in done
    ]
    if done:
        print(
            f"--resume: {len(done)} case(s) kept from {out_dir / 'pairformer.json'}",
            file=sys.stderr,
        )
    deadline = None if budget is None else _now() + budget
    for i, (b, m, N) in enumerate(cases):
        if deadline is not None and _now() > deadline:
            rows += [
                {
                    "backend": b2,
                    "mode": m2,
                    "N": N2,
                    "status": f"stopped: --budget {budget:g} s reached",
                    "call": call,
                }
                for b2, m2, N2 in cases[i:]
            ]
            break
        print(f"[{i + 1}/{len(cases)}] {b} {m} N={N}", file=sys.stderr, flush=True)
        marker = {"backend": b, "mode": m, "N": N, "status": RUNNING, "call": call}
        case_rows = rows + [dict(marker, kills=retry.get((b, m, N), 0))]
        write(case_rows, out_dir, gpu, commands, plot_too=False)
        try:
            row = measure(b, m, N, weights)
        except torch.cuda.OutOfMemoryError:
            row = {"backend": b, "mode": m, "N": N, "status": "out of memory"}
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 - one failing backend never stops the run
            row = {"backend": b, "mode": m, "N": N, **failure(e)}
            torch.cuda.empty_cache()
        rows.append(dict(row, call=call))
        write(rows, out_dir, gpu, commands, plot_too=False)  # survives a kill
    rows = _ordered(rows)
    write(rows, out_dir, gpu, commands)
    return rows


def _ordered(rows):
    """The table's order whatever the calls' order: unavailable backends first, then by N, mode
    (eager first) and backend (ours first)."""

    def key(r):
        if r["N"] == "-":
            return (0, 0, 0, r["backend"])
        return (1, r["N"], r["mode"] != "eager", r["backend"] != "turbopairformer", r["backend"])

    return sorted(rows, key=key)


COLUMNS = (
    "backend",
    "mode",
    "N",
    "block fwd+bwd ms",
    "pair track fwd+bwd ms",
    "pair track, queued ms",
    "pair track, dz given ms",
    "block peak GiB",
    "4-block AdamW step ms",
    "stack peak GiB",
    "z err vs fp32",
    "s err vs fp32",
    "grads bitwise repeatable",
    "first call s",
)


def write(rows, out_dir: Path, gpu: str, commands, plot_too=True):
    """pairformer.{json,md,png} (the plot only with plot_too: the run's last write makes it, and
    --replot remakes it from the JSON). commands: the command of each call that made rows (a
    row's "call" indexes it; rows without one are the first call's), or one command."""
    commands = [commands] if isinstance(commands, str) else list(commands)
    rows = _ordered(rows)
    calls = []
    if len(commands) > 1:
        calls = ["Calls, in order (a row's call is its index):", ""]
        calls += [f"{i}. `{c}`" for i, c in enumerate(commands)] + [""]
    columns = COLUMNS + (("call",) if calls else ())
    lines = [
        __doc__.split("\n\n", 2)[2].strip(),
        "",
        *calls,
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for r in rows:
        if "status" in r:
            cells = [r["backend"], r["mode"], r["N"], r["status"]] + [""] * (len(COLUMNS) - 4)
        else:
            cells = [
                r["backend"],
                r["mode"],
                r["N"],
                f"{r['block_fwd_bwd_ms']:.2f}",
                f"{r['pair_fwd_bwd_ms']:.2f}" if "pair_fwd_bwd_ms" in r else "",
                f"{r['pair_queued_ms']:.2f}" if "pair_queued_ms" in r else "",
                f"{r['pair_dz_given_ms']:.2f}" if "pair_dz_given_ms" in r else "",
                f"{r['block_peak_gib']:.2f}",
                f"{r['stack4_step_ms']:.1f}",
                f"{r['stack4_peak_gib']:.2f}",
                f"{r['z_rel_err_vs_fp32']:.2e}",
                f"{r['s_rel_err_vs_fp32']:.2e}",
                "yes" if r["grads_bitwise_repeatable"] else "NO",
                r["first_call_s"],
            ]
        if calls:
            cells.append(r.get("call", 0))
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += _summary(rows)
    head = commands[0] if not calls else f"{len(commands)} calls (--resume), listed below"
    extra = {"commands": commands} if calls else None
    write_tables(out_dir, "pairformer", gpu, head, rows, "Pairformer training step", lines, extra)
    if not plot_too:
        return
    try:
        plot(rows, out_dir)
    except Exception as e:  # noqa: BLE001 - the plot is optional (matplotlib)
        print(f"plot skipped: {e}", file=sys.stderr)


OURS = "turbopairformer"


def _summary(rows) -> list:
    """The table's headline lines: at each N, our best time (either mode) against the fastest
    other backend's (any mode), for the 4-block step and the block, and how many of the other
    backends' cases at that N were measured (a partial N may lack the fastest one)."""
    ok = [r for r in rows if "status" not in r]
    # every other backend and mode the table holds at any N, measured or not
    cases = {(r["backend"], r["mode"]) for r in rows if r["backend"] != OURS and r["mode"] != "-"}
    out = []
    for N in sorted({r["N"] for r in ok}):
        ours = [r for r in ok if r["N"] == N and r["backend"] == OURS]
        others = [r for r in ok if r["N"] == N and r["backend"] != OURS]
        if not ours or not others:
            continue
        for key, what in (("stack4_step_ms", "4-block AdamW step"), ("block_fwd_bwd_ms", "block")):
            o, p = min(ours, key=lambda r: r[key]), min(others, key=lambda r: r[key])
            out.append(
                f"| {N} | {what} | {o[key]:.1f} ({o['mode']}) | {p[key]:.1f} ({p['backend']}, "
                f"{p['mode']}) | {p[key] / o[key]:.2f}x | {len(others)} of {len(cases)} |"
            )
    if not out:
        return []
    return [
        "",
        (
            "Ours against the fastest other backend at each N, each in its faster mode (ms; above "
            "1x we are faster; the last column: the other backends' cases measured at that N, of "
            "all the table holds):"
        ),
        "",
        "| N | measure | ours | fastest other | speedup | others measured |",
        "|---|---|---|---|---|---|",
        *out,
    ]


def plot(rows, out_dir: Path):
    """pairformer.png: block time, 4-block step time, block memory and our speedup over each
    other backend, per backend and mode: against N (lines) when the run has three or more N,
    else grouped bars at each N (a line through two sizes would suggest what was not measured)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if "status" not in r]
    if not ok:
        return
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5))
    axes = axes.ravel()
    series = sorted(
        {(r["backend"], r["mode"]) for r in ok}, key=lambda s: (s[0] != "turbopairformer", s)
    )
    backends = list(dict.fromkeys(b for b, _ in series))
    ours = {(r["mode"], r["N"]): r for r in ok if r["backend"] == "turbopairformer"}
    Ns = sorted({r["N"] for r in ok})
    metrics = [
        ("one block, forward + backward (ms)", lambda r: r["block_fwd_bwd_ms"]),
        ("4-block stack, AdamW step (ms)", lambda r: r["stack4_step_ms"]),
        ("one block, peak memory (GiB)", lambda r: r["block_peak_gib"]),
        (
            "our speedup, one block, same mode\n(their time / ours; above 1: we are faster)",
            lambda r: (
                r["block_fwd_bwd_ms"] / ours[(r["mode"], r["N"])]["block_fwd_bwd_ms"]
                if (r["mode"], r["N"]) in ours
                else float("nan")
            ),
        ),
    ]
    lines = len(Ns) >= 3
    width = 0.8 / len(series)
    for ax, (title, value) in zip(axes, metrics):
        for i, (backend, mode) in enumerate(series):
            if title.startswith("our speedup") and backend == "turbopairformer":
                continue
            pts = {r["N"]: value(r) for r in ok if r["backend"] == backend and r["mode"] == mode}
            color = f"C{backends.index(backend)}"
            label = f"{backend} {mode}"
            if lines:
                xs = sorted(pts)
                ax.plot(
                    xs,
                    [pts[n] for n in xs],
                    color=color,
                    label=label,
                    marker="o" if backend == "turbopairformer" else "s",
                    linestyle={"eager": "-", "compile": "--"}.get(mode, ":"),
                    lw=2.2 if backend == "turbopairformer" else 1.2,
                )
            else:
                xs = [Ns.index(n) + (i - (len(series) - 1) / 2) * width for n in pts]
                ax.bar(
                    xs,
                    list(pts.values()),
                    width,
                    color=color,
                    label=label,
                    hatch={"eager": None, "compile": "//"}.get(mode, "xx"),
                    edgecolor="white",
                )
        if title.startswith("our speedup"):
            ax.axhline(1.0, color="k", lw=0.8)
        ax.set_title(title, fontsize=9)
        ax.grid(True, alpha=0.3, axis="y" if not lines else "both")
        if lines:
            ax.set_xlabel("N")
        else:
            ax.set_xticks(range(len(Ns)), [f"N = {n}" for n in Ns])
            ax.set_xlim(-0.5, len(Ns) - 0.5)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:  # the speedup panel of a table with ours alone so far
            ax.text(0.5, 0.5, "no other backend measured yet", ha="center", transform=ax.transAxes)
    fig.suptitle(
        "Pairformer training step (compile: hatched)" if not lines else "Pairformer training step"
    )
    fig.tight_layout()
    fig.savefig(out_dir / "pairformer.png", dpi=100)
    plt.close(fig)


PAIR_PARTS = ("tri_mul_out", "tri_mul_in", "tri_att_start", "tri_att_end", "pair_transition")


def _pair_step(module, z, pm, dz=None):
    """One forward + backward of a pair-track module under bf16 autocast: the backward of the
    bench's loss over valid pairs, or, with dz (the output's shape), out.backward(dz)."""

    clear = _grad_clearer(module)

    def step():
        z.grad = None  # assigned, not accumulated (see _block_case)
        clear()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = module(z, pm)
        if dz is not None:
            out.backward(dz)
        else:
            (out.float() * pm[..., None]).square().mean().backward()

    return step


def _part(blk, part, transposed_end):
    """One module of a pair block as a function of (z, pair_mask). OpenFold3 runs the ending node
    as a starting-node module on the transposed pair tensor; our module takes z as it is."""
    if part == "pair_stack":
        return blk
    mod = getattr(blk, part)
    if part == "tri_att_end" and transposed_end:
        return lambda z, pm: mod(z.transpose(-2, -3), pm.transpose(-1, -2)).transpose(-2, -3)
    return mod


def profiled(step, steps, warmups=1, cpu=False):
    """torch.profiler's record (CUDA activity, or the host's with cpu=True) of `steps` calls of
    step after `warmups` more."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmups):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU if cpu else ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return prof


def _kernel_ms(step, steps=3):
    """CUDA kernel time per step from torch.profiler: (ours, everything else, the top kernels as
    (name, ms per step, calls per step))."""
    prof = profiled(step, steps)
    rows = [
        (e.key, e.device_time_total / 1e3 / steps, e.count / steps)
        for e in prof.key_averages()
        if e.device_time_total > 0 and e.device_type.name == "CUDA"
    ]
    ours = sum(ms for k, ms, _ in rows if "tpf::" in k)
    rest = sum(ms for k, ms, _ in rows if "tpf::" not in k)
    return ours, rest, sorted(rows, key=lambda r: -r[1])[:30]


def breakdown(Ns, out_dir: Path, gpu: str, command: str, iters=10, only=None, modes=("eager",)):
    """Each pair-track module alone (forward + backward against a fixed output gradient, in each
    of modes: eager, compile), ours against the plain-PyTorch reference, with the CUDA time of our
    kernels apart from everything around them. only: the backends to run (default both)."""
    from .pairformer import PairBlock
    from .reference import OpenFold3PairBlock

    config = {
        "c_z": 128,
        "c_hidden_mul": 128,
        "c_hidden_pair_att": 32,
        "no_heads_pair": 4,
        "transition_n": 4,
    }
    torch.manual_seed(0)
    weights = {n: p.detach().cuda() for n, p in OpenFold3PairBlock(**config).state_dict().items()}
    rows, tops = [], []
    for N in Ns:
        _, z, _, pm = _inputs(N)
        z = z.requires_grad_(True)
        dz = torch.randn_like(z) * pm[..., None]  # [B, N, N, c_z] fp32
        pairs = (("turbopairformer", PairBlock), ("pytorch", OpenFold3PairBlock))
        for name, cls in pairs:
            if only is not None and name not in only:
                continue
            blk = cls(**config).cuda().train()
            blk.load_state_dict(weights)
            for mode, part in ((m, p) for m in modes for p in (*PAIR_PARTS, "pair_stack")):
                fn = _part(blk, part, name == "pytorch")
                step = _pair_step(run_as(fn, mode), z, pm, dz)
                ms = _median_ms(step, iters)
                queued = _queued_ms(step, iters, warmups=0)
                ours, rest, top = _kernel_ms(step)
                rows.append(
                    {
                        "backend": name,
                        "mode": mode,
                        "N": N,
                        "part": part,
                        "ms": ms,
                        "queued_ms": queued,
                        "tpf_kernels_ms": ours,
                        "other_kernels_ms": rest,
                    }
                )
                if part == "pair_stack":
                    tops.append({"backend": name, "mode": mode, "N": N, "kernels": top})
                print(f"{name} {mode} N={N} {part}: {ms:.2f} ms", file=sys.stderr, flush=True)
            del blk
            torch.cuda.empty_cache()
    write_breakdown(rows, tops, out_dir, gpu, command)


def write_breakdown(rows, tops, out_dir: Path, gpu: str, command: str):
    """pairformer_breakdown.{md,json,png} from the module rows and, per backend and N, the top
    kernels of the pair stack ([name, ms per step, calls per step])."""
    lines = [
        "Each module of one pair block alone, forward + backward against a fixed gradient of its "
        "output (no loss), bf16 autocast with fp32 weights, training mode, B = 1, 5% padded "
        "tokens, eager or under torch.compile (mode). ms: median CUDA-event time of a step, "
        "each started on an idle GPU; queued ms: the mean of steps queued back to back (the "
        "host's work before a step's first kernel hidden under the previous step); the "
        "kernel columns split the profiler's CUDA time into our kernels (tpf::) and every other "
        "kernel. (Tables made before the mode column timed eager steps with the bench's loss.)",
        "",
        "![where the pair stack's time goes](pairformer_breakdown.png)",
        "",
        "| backend | mode | N | module | fwd+bwd ms | queued ms | our kernels ms | other kernels ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        queued = f"{r['queued_ms']:.2f}" if "queued_ms" in r else ""
        lines.append(
            f"| {r['backend']} | {r.get('mode', 'eager')} | {r['N']} | {r['part']} | "
            f"{r['ms']:.2f} | {queued} | {r['tpf_kernels_ms']:.2f} | "
            f"{r['other_kernels_ms']:.2f} |"
        )
    for t in tops:
        lines += [
            "",
            f"Top kernels of the {t['backend']} pair block at N = {t['N']}, "
            f"{t.get('mode', 'eager')} (ms per step):",
            "",
        ]
        lines += ["| kernel | ms | calls |", "|---|---|---|"]
        lines += [f"| `{k[:160]}` | {ms:.3f} | {n:g} |" for k, ms, n in t["kernels"]]
    write_tables(
        out_dir,
        "pairformer_breakdown",
        gpu,
        command,
        rows,
        "Pair-track modules, forward + backward",
        lines,
        extra={"top_kernels": tops},
    )
    try:
        plot_breakdown(rows, tops, out_dir)
    except Exception as e:  # noqa: BLE001 - the plot is optional (matplotlib)
        print(f"plot skipped: {e}", file=sys.stderr)


# Kernel groups of the breakdown plot: (label, pattern on the kernel name), first match wins.
KERNEL_GROUPS = (
    ("attention backward", r"tpf::attn::.*(backward|delta|dq_finalize|dbias)"),
    ("attention forward", r"tpf::attn::"),
    ("multiplicative update", r"tpf::trimul::"),
    ("SwiGLU transition", r"tpf::transition::"),
    ("LayerNorm", r"tpf::norm::"),
    ("SwiGLU, sigmoid gate", r"tpf::act::"),
    ("residual adds", r"tpf::residual::"),
    ("cuBLAS GEMMs", r"nvjet|cutlass|gemm|sm90_xmma"),
    ("PyTorch elementwise", r"at::native"),
    ("inductor (Triton) kernels", r"^triton_"),
)


def plot_breakdown(rows, tops, out_dir: Path):
    """pairformer_breakdown.png: the pair stack's CUDA time by kernel group (the top kernels;
    the rest as one bar), and each module's time split into our kernels and the others, for the
    first backend and mode of the table (ours, eager, when they ran)."""
    import re

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for t in tops[:1]:  # the first backend's stack (ours when both ran)
        same = [
            r
            for r in rows
            if r["backend"] == t["backend"] and r.get("mode", "eager") == t.get("mode", "eager")
        ]
        stack = next(r for r in same if r["part"] == "pair_stack")
        groups = {label: 0.0 for label, _ in KERNEL_GROUPS}
        for name, ms, _ in t["kernels"]:
            label = next((lb for lb, pat in KERNEL_GROUPS if re.search(pat, name)), "other")
            groups[label] = groups.get(label, 0.0) + ms
        listed = sum(ms for _, ms, _ in t["kernels"])
        groups["kernels outside the top list"] = (
            stack["tpf_kernels_ms"] + stack["other_kernels_ms"] - listed
        )
        groups["gaps (no kernel running)"] = max(
            0.0, stack["ms"] - stack["tpf_kernels_ms"] - stack["other_kernels_ms"]
        )
        fig, (a, b) = plt.subplots(1, 2, figsize=(14, 5))
        items = [(k, v) for k, v in groups.items() if v > 0]
        a.barh([k for k, _ in items][::-1], [v for _, v in items][::-1], color="C0")
        for y, (_, v) in enumerate(items[::-1]):
            a.text(v, y, f" {v:.2f}", va="center", fontsize=8)
        a.set_xlabel("ms per step")
        a.set_title(
            f"{t['backend']} pair stack ({t.get('mode', 'eager')}), N = {t['N']}: "
            f"{stack['ms']:.2f} ms by kernel group"
        )
        mods = [r for r in same if r["part"] != "pair_stack"]
        names = [r["part"] for r in mods][::-1]
        ours = [r["tpf_kernels_ms"] for r in mods][::-1]
        other = [r["other_kernels_ms"] for r in mods][::-1]
        rest = [max(0.0, r["ms"] - r["tpf_kernels_ms"] - r["other_kernels_ms"]) for r in mods][::-1]
        b.barh(names, ours, color="C0", label="our kernels")
        b.barh(names, other, left=ours, color="C1", label="other kernels")
        b.barh(names, rest, left=[x + y for x, y in zip(ours, other)], color="C7", label="gaps")
        b.set_xlabel("ms, forward + backward of the module alone")
        b.set_title("each module alone")
        b.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "pairformer_breakdown.png", dpi=110)
        plt.close(fig)
