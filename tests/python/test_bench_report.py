"""The benchmark report writer (no GPU needed): Markdown, JSON and, with matplotlib, plots."""

import importlib.util
import json

import pytest

pytest.importorskip("torch", reason="PyTorch is not importable here")

# The Pairformer cases run their training step under CUDA autocast, which PyTorch turns off (with
# a warning) on a machine without CUDA, where these tests run it on the CPU.
pytestmark = pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")

from turbopairformer import bench


def rows():
    r = []
    for backend, scale in (("turbopairformer", 1.0), ("pytorch_eager", 5.0)):
        for N in (128, 256):
            r.append(
                {
                    "op": "triangle_attention",
                    "backend": backend,
                    "N": N,
                    "D": 32,
                    "fwd_ms": 0.1 * scale * N / 128,
                    "fwd_bwd_ms": 0.5 * scale * N / 128,
                    "peak_mib": 10.0 * scale,
                    "status": "ok",
                }
            )
    r.append(
        {
            "op": "triangle_attention",
            "backend": "trifast",
            "N": 128,
            "D": 32,
            "status": "not installed: pip install trifast",
        }
    )
    r.append({"op": "note", "backend": "-", "N": 0, "status": "stopped: --budget 1 s reached"})
    return r


def test_report_files(tmp_path):
    bench.write_report(rows(), tmp_path, "Fake GPU")
    md = (tmp_path / "report.md").read_text()
    assert "| turbopairformer | 256 | 32 | 0.200 | 1.000 |" in md
    assert "not installed: pip install trifast" in md and "--budget 1 s" in md
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["gpu"] == "Fake GPU" and len(data["rows"]) == 6
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "triangle_attention.png").stat().st_size > 1000


def test_rows_are_grouped_by_backend_whatever_the_run_order(tmp_path):
    r = rows()
    bench.write_report(list(reversed(r)), tmp_path, "Fake GPU", plots=False)
    md = (
        (tmp_path / "report.md").read_text().split("## triangle_attention")[1].splitlines()
    )  # detailed rows
    ours = [i for i, line in enumerate(md) if line.startswith("| turbopairformer | ")]
    assert len(ours) == 2 and ours[1] == ours[0] + 1  # adjacent, N ascending
    assert "| 128 |" in md[ours[0]] and "| 256 |" in md[ours[1]]


def test_schedule_is_size_major_across_ops():
    att = {"turbopairformer": object(), "trifast": "not installed"}
    tri = {"turbopairformer": object(), "torch_compile": object()}
    cases = bench.schedule(att, tri, [256, 128], [16, 32], [128], ["attention", "trimul"])
    Ns = [c[4] for c in cases]
    assert Ns == sorted(Ns)  # every case at N = 128 (both ops) before any at 256
    assert len(cases) == 2 * 2 * 2 + 2
    assert [c[1] for c in cases[:6]] == ["attention"] * 4 + ["trimul"] * 2
    only_trimul = bench.schedule(att, tri, [256, 128], [16], [128], ["trimul"])
    assert [(c[1], c[4]) for c in only_trimul] == [("trimul", 128)] * 2


def test_summary_table_and_run_metadata(tmp_path):
    r = rows() + [
        {
            "op": "triangle_attention",
            "backend": "pytorch_eager",
            "N": 512,
            "D": 32,
            "status": "out of memory",
        }
    ]
    bench.write_report(
        r,
        tmp_path,
        "Fake GPU",
        plots=False,
        meta={"command": "python -m turbopairformer.bench", "wall_s": 412.3},
    )
    md = (tmp_path / "report.md").read_text()
    assert "wall time of the whole run: 412 s" in md
    assert "| backend | N=128 | N=256 | N=512 |" in md
    assert "| turbopairformer | 0.500 | 1.00 | — |" in md  # fwd+bwd ms per N
    assert "| pytorch_eager | 2.50 | 5.00 | OOM |" in md
    assert "| trifast | skipped | — | — |" in md
    assert json.loads((tmp_path / "report.json").read_text())["wall_s"] == 412.3


def test_timed_iterations_shrink_for_slow_cases():
    assert bench.timed_iters(0.5) == 15
    assert bench.timed_iters(400.0) == 5
    assert 5 <= bench.timed_iters(150.0) <= 15


def test_bsnhd_layout_for_deepspeed_and_openfold3():
    import torch

    q = torch.randn(1, 5, 4, 5, 8)
    mask = torch.rand(1, 5, 1, 1, 5) < 0.5
    tq, tk, tv, bias, mb = bench.prep_layout_bsnhd(q, q, q, torch.zeros(1, 1, 4, 5, 5), mask)
    assert tq.shape == (1, 5, 5, 4, 8) and tq.is_contiguous() and torch.equal(tq.transpose(2, 3), q)
    assert (
        mb.shape == (1, 5, 1, 1, 5)
        and bool((mb[mask] == 0).all())
        and bool((mb[~mask] == -1e9).all())
    )


def test_trimul_floor_table_on_cpu(tmp_path):
    # CPU tensors run the FP64 reference and round once to bf16: every ratio is 1 by construction.
    rows = bench.trimul_floor_table([5], C=32, device="cpu")
    r = rows[0]
    assert r["status"] == "ok" and set(k for k in r if k.startswith("d_")) == {
        "d_" + k for k in bench.TRIMUL_WEIGHTS
    }
    assert 1e-4 < r["out"]["floor"] < 1e-2
    assert all(abs(v["ratio"] - 1) < 0.05 for k, v in r.items() if isinstance(v, dict))
    bench.write_floor_table(rows, tmp_path, "Fake GPU")
    md = (tmp_path / "trimul_accuracy.md").read_text()
    assert "| 5 |" in md and "| yes |" in md
    r["dz"]["ratio"] = 2.5  # a ratio over the target is named in the verdict
    bench.write_floor_table(rows, tmp_path, "Fake GPU")
    assert "no: dz 2.50" in (tmp_path / "trimul_accuracy.md").read_text()


def test_a_failing_case_is_recorded_and_the_run_goes_on():
    import torch

    saved = []

    def oom(row):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    def broken(row):
        row["fwd_ms"] = 1.0
        raise ValueError("bad layout\nsecond line")

    for body, status in (
        (oom, "out of memory"),
        (broken, "failed: ValueError: bad layout ... second line"),
        (lambda row: row.update(fwd_ms=2.0), "ok"),
    ):
        row = {}
        bench.run_case(row, body, lambda: saved.append(1))
        assert row["status"] == status and "case_s" in row
    assert len(saved) == 3


def test_a_failure_keeps_its_cause():
    """A wrapped error (inductor's SubprocException) says what failed on its last line: the
    table's status keeps the first and the last, the JSON row the message's end in full."""
    from turbopairformer._results import failure

    e = RuntimeError(
        "SubprocException: An exception occurred in a subprocess:\n\n"
        'Traceback (most recent call last):\n  File "x.py", line 3\n'
        "triton.CompilationError: out of resource: shared memory\n"
    )
    row = failure(e)
    assert row["status"] == (
        "failed: RuntimeError: SubprocException: An exception occurred in a subprocess: ... "
        "triton.CompilationError: out of resource: shared memory"
    )
    assert row["error"].startswith("SubprocException") and "x.py" in row["error"]
    assert failure(ValueError("one line")) == {"status": "failed: ValueError: one line"}
    assert failure(KeyError()) == {"status": "failed: KeyError: "}


def test_pairformer_report_files(tmp_path):
    from turbopairformer import bench_pairformer

    rows = [
        {
            "backend": "turbopairformer",
            "mode": "eager",
            "N": 384,
            "first_call_s": 1.0,
            "block_fwd_bwd_ms": 12.5,
            "pair_fwd_bwd_ms": 11.25,
            "pair_queued_ms": 11.0,
            "pair_dz_given_ms": 10.5,
            "block_peak_gib": 2.0,
            "stack4_step_ms": 60.0,
            "stack4_peak_gib": 3.0,
            "z_rel_err_vs_fp32": 1e-2,
            "s_rel_err_vs_fp32": 2e-2,
            "grads_bitwise_repeatable": True,
        },
        {"backend": "pytorch", "mode": "compile", "N": 1024, "status": "out of memory"},
    ]
    rows.insert(1, dict(rows[0], backend="pytorch", block_fwd_bwd_ms=30.0))
    bench_pairformer.write(
        rows, tmp_path, "Fake GPU", "python -m turbopairformer.bench --pairformer"
    )
    md = (tmp_path / "pairformer.md").read_text()
    assert (
        "| turbopairformer | eager | 384 | 12.50 | 11.25 | 11.00 | 10.50 | 2.00 | 60.0 | 3.00 | 1.00e-02 "
        "| 2.00e-02 "
        "| yes | 1.0 |" in md
    )
    assert "| pytorch | compile | 1024 | out of memory |" in md
    assert (
        json.loads((tmp_path / "pairformer.json").read_text())["rows"][2]["status"]
        == "out of memory"
    )
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "pairformer.png").stat().st_size > 10_000


def test_trifast_wiring_matches_the_plain_reference_block(monkeypatch):
    """The reference block wired to trifast, with trifast's documented layout (q, k, v
    [B, H, S, N, D], bias [B, H, N, N], mask [B, S, N] with True = masked, 1/sqrt(D) inside)
    played by plain PyTorch: same output as the unwired block, so the wiring's transposes are
    right."""
    import sys
    import types

    import torch

    from turbopairformer.reference import OpenFold3PairBlock, wire_trifast

    def fake(q, k, v, bias, mask):
        s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias[:, :, None]
        s = s.masked_fill(mask[:, None, :, None, :], -1e9)  # as the reference masks
        return torch.softmax(s, -1) @ v

    monkeypatch.setitem(sys.modules, "trifast", types.SimpleNamespace(triangle_attention=fake))
    torch.manual_seed(0)
    ref = OpenFold3PairBlock(16, 16, 8, 2, 2, pair_dropout=0.0).double().eval()
    wired = wire_trifast(OpenFold3PairBlock(16, 16, 8, 2, 2, pair_dropout=0.0).double().eval())
    wired.load_state_dict(ref.state_dict())
    z = torch.randn(1, 6, 6, 16, dtype=torch.float64)
    mask = torch.ones(1, 6, 6, dtype=torch.float64)
    mask[:, :, 4:] = 0
    mask[:, 4:] = 0
    # over valid pairs: padded rows differ by design (the reference's additive -1e9 mask gives a
    # fully masked row the unmasked softmax, the fake a uniform one), and never reach valid ones
    torch.testing.assert_close(wired(z, mask)[:, :4, :4], ref(z, mask)[:, :4, :4])


def test_pairformer_measurement_runs_end_to_end_on_the_cpu(monkeypatch):
    """bench_pairformer.measure with the CUDA calls stubbed: every step of a case (block step,
    repeatability, accuracy against the fp32 reference, the stack's AdamW step) runs and fills
    its row; the timings themselves are the GPU's business. The accuracy pass assigns its leaf
    gradients rather than adding to the timed steps' (which CUDA graphs overwrite)."""
    import torch

    from turbopairformer import bench_pairformer as bp
    from turbopairformer.reference import OpenFold3PairFormerBlock

    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, *a, **k: self)
    for name in ("synchronize", "reset_peak_memory_stats", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 0)
    leaves, finite = [], []  # the block case's s and z; whether its last gradients are finite
    block_step, block_case = bp.block_step, bp._block_case

    def spied_step(blk, fn, s, z, *masks):
        leaves.extend((s, z))
        return block_step(blk, fn, s, z, *masks)

    def checked_case(*args):
        row = block_case(*args)
        finite.append(all(torch.isfinite(t.grad).all() for t in leaves))
        return row

    monkeypatch.setattr(bp, "block_step", spied_step)
    monkeypatch.setattr(bp, "_block_case", checked_case)

    def median_ms(fn, iters):
        # a timed step's leaf gradients, as CUDA graphs leave them: overwritten by later replays
        fn()
        for t in leaves:
            t.grad = torch.full_like(t, float("nan"))
        return 1.0

    monkeypatch.setattr(bp, "_median_ms", median_ms)
    monkeypatch.setattr(bp, "_queued_ms", lambda fn, iters, warmups=2: (fn(), 0.75)[1])

    def cpu_inputs(N, seed=0, c_s=384, c_z=128):
        g = torch.Generator().manual_seed(seed)
        sm = torch.ones(1, N)
        sm[:, -1] = 0
        s, z = torch.randn(1, N, c_s, generator=g), torch.randn(1, N, N, c_z, generator=g)
        return s, z, sm, sm[:, :, None] * sm[:, None, :]

    monkeypatch.setattr(bp, "_inputs", cpu_inputs)
    torch.manual_seed(0)
    weights = {n: p.detach() for n, p in OpenFold3PairFormerBlock().state_dict().items()}
    row = bp.measure("turbopairformer", "eager", 3, weights, iters=1)
    assert row["grads_bitwise_repeatable"] and row["z_rel_err_vs_fp32"] < 1e-5
    # the accuracy pass assigned its leaf gradients rather than adding to the timed steps'
    assert finite == [True]
    assert {"block_fwd_bwd_ms", "stack4_step_ms", "pair_queued_ms", "pair_dz_given_ms"} <= set(row)


def test_breakdown_runs_each_mode_on_the_cpu(tmp_path, monkeypatch):
    """bench --pairformer --breakdown with the CUDA calls stubbed: every module of both backends
    runs forward + backward in each mode (compile through torch.compile), and the table has a row
    and a top-kernel list per backend and mode."""
    import torch

    from turbopairformer import bench_pairformer as bp

    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    monkeypatch.setattr(bp, "_median_ms", lambda fn, iters: (fn(), 1.0)[1])
    monkeypatch.setattr(bp, "_queued_ms", lambda fn, iters, warmups=2: (fn(), 0.75)[1])
    monkeypatch.setattr(bp, "_kernel_ms", lambda step: (0.5, 0.25, [["k", 0.5, 1]]))
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn: compiled.append(fn) or fn)
    monkeypatch.setattr(
        bp, "_inputs", lambda N: (None, torch.randn(1, N, N, 128), None, torch.ones(1, N, N))
    )
    bp.breakdown([3], tmp_path, "Fake GPU", "cmd", iters=1, modes=("eager", "compile"))
    rows = json.loads((tmp_path / "pairformer_breakdown.json").read_text())["rows"]
    assert len(rows) == 2 * 2 * 6 and len(compiled) == 2 * 6
    md = (tmp_path / "pairformer_breakdown.md").read_text()
    assert "| turbopairformer | compile | 3 | pair_stack | 1.00 | 0.75 | 0.50 | 0.25 |" in md
    assert "Top kernels of the pytorch pair block at N = 3, compile (ms per step):" in md


def test_peaked_accuracy_table_on_cpu(tmp_path):
    """bench --attention-accuracy's table on the CPU: every input kind and backend gets a row
    (missing peers with their reason), our CPU path (the FP64 reference, rounded once to bf16)
    sits at the bf16 floor, and the peaked inputs are peaked."""

    from turbopairformer import bench_accuracy as ba

    q, k, v, bias, mask, dout = ba.peaked_inputs(16, 16, 8.0, device="cpu")
    logits = q.double() @ k.double().transpose(-1, -2) / 4.0 + bias.double()
    assert 6.0 < logits.std().item() < 10.0
    _, _, _, dom, _, _ = ba.peaked_inputs(16, 16, "dominant", device="cpu")
    assert ((dom.double() > 5).sum(-1) >= 3).float().mean() > 0.9  # ~4 dominant keys a row
    rows = ba.table([7], [16], device="cpu")
    assert len(rows) == 5 * len(ba._backends())
    ours = [r for r in rows if r["backend"] == "turbopairformer" and r["status"] == "ok"]
    assert len(ours) == 5 and all(r["out"]["ratio"] <= 1.5 for r in ours)
    ba.write(rows, tmp_path, "Fake GPU", "python -m turbopairformer.bench --attention-accuracy 7")
    md = (tmp_path / "attention_accuracy_peaked.md").read_text()
    assert "| 7 | 16 | logit std 8 | turbopairformer, no compensation |" in md
    assert "dominant" in md and "pytorch_sdpa" in md
    if importlib.util.find_spec("matplotlib"):  # the plot is optional; with matplotlib it is made
        assert (tmp_path / "attention_accuracy_peaked.png").stat().st_size > 10_000
    # --replot rebuilds the table and the plot from the JSON alone
    again = tmp_path / "again"
    again.mkdir()
    (again / "attention_accuracy_peaked.json").write_text(
        (tmp_path / "attention_accuracy_peaked.json").read_text()
    )
    bench.main(["--replot", str(again / "attention_accuracy_peaked.json")])
    assert (again / "attention_accuracy_peaked.md").read_text() == md


def test_an_unknown_report_backend_is_named_before_anything_runs():
    with pytest.raises(SystemExit) as e:
        bench.main(["--backends", "turbopairformer,cuequivarience"])
    msg = str(e.value)
    assert "unknown backends ['cuequivarience']" in msg and "cuequivariance" in msg


def test_large_input_sets_are_not_rotated():
    # N = 768 attention (q, k, v, dout, bias in bf16): 0.3 GB a set, rotated; the N = 4096
    # multiplicative update's x and dout: 8.6 GB a set, one copy.
    assert bench.input_set_count(2 * (4 * 768 * 4 * 768 * 32 + 4 * 768 * 768)) == 3
    assert bench.input_set_count(2 * 2 * 4096 * 4096 * 128) == 1


def test_breakdown_files_and_replot(tmp_path):
    from turbopairformer import bench_pairformer as bp

    parts = ("tri_mul_out", "tri_att_start", "pair_transition", "pair_stack")
    rows = [
        {
            "backend": "turbopairformer",
            "N": 768,
            "part": p,
            "ms": 5.0 + i,
            "tpf_kernels_ms": 3.0,
            "other_kernels_ms": 1.5,
        }
        for i, p in enumerate(parts)
    ]
    kernels = [
        ["void tpf::attn::(anonymous namespace)::backward_kernel<bf16>", 2.0, 2],
        ["void tpf::trimul::gemm_wgmma_kernel<bf16>", 0.7, 7],
        ["nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNN", 0.5, 3],
        ["void at::native::elementwise_kernel<128, 2, MulFunctor<float>>", 0.2, 2],
    ]
    tops = [{"backend": "turbopairformer", "N": 768, "kernels": kernels}]
    bp.write_breakdown(rows, tops, tmp_path, "Fake GPU", "python -m turbopairformer.bench --x")
    md = (tmp_path / "pairformer_breakdown.md").read_text()
    # rows of tables made before the mode and queued columns read as eager, queued left empty
    assert "| turbopairformer | eager | 768 | pair_stack | 8.00 |  | 3.00 | 1.50 |" in md
    assert "| `nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNN` | 0.500 | 3 |" in md
    data = json.loads((tmp_path / "pairformer_breakdown.json").read_text())
    assert data["top_kernels"] == tops
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "pairformer_breakdown.png").stat().st_size > 10_000
    again = tmp_path / "again"
    again.mkdir()
    (again / "pairformer_breakdown.json").write_text(json.dumps(data))
    bench.main(["--replot", str(again / "pairformer_breakdown.json")])
    assert (again / "pairformer_breakdown.md").read_text() == md


def test_every_report_checks_accuracy_at_some_size():
    assert bench.accuracy_size(None, [128, 256, 384]) == 256
    assert bench.accuracy_size(None, [384, 640, 768]) == 384  # 256 not run: the smallest N
    assert bench.accuracy_size(512, [384, 640]) == 512  # as asked, even if no case has it
    assert bench.accuracy_size(None, []) is None


@pytest.mark.parametrize("direction", ["outgoing", "incoming"])
def test_trimul_report_runs_both_directions_against_their_reference(direction):
    """The report's plain-PyTorch multiplicative update is AF3's algorithm 12 / 13 for the
    direction asked (the FP64 reference of the accuracy columns), and our op on the CPU (the
    library's FP64 reference) agrees with it; incoming backends carry the name suffix."""
    import torch

    import turbopairformer as tpf

    x, mask, w, _ = bench.trimul_inputs(7, 16, 3, device="cpu")
    x, mask, w = x.double(), mask.double(), {k: v.double() for k, v in w.items()}
    ref = bench._eager_trimul(x, mask, w, direction=direction)
    ours = tpf.triangle_multiplicative_update(x, direction, mask, **w)
    assert torch.allclose(ours.double(), ref, rtol=1e-6, atol=1e-8)
    other = bench._eager_trimul(
        x, mask, w, direction="incoming" if direction == "outgoing" else "outgoing"
    )
    assert not torch.allclose(other, ref, rtol=1e-3)
    backends = bench.trimul_backends(("outgoing", "incoming"))
    suffix = "" if direction == "outgoing" else bench.INCOMING
    assert backends["turbopairformer" + suffix].direction == direction
    assert torch.allclose(backends["pytorch_eager" + suffix](x, mask, w), ref)


def test_trimul_report_takes_fp32_weights_with_the_same_values():
    import torch

    b = bench.trimul_backends(("outgoing", "incoming"), (torch.bfloat16, torch.float32))
    fp32 = b["turbopairformer (incoming) (fp32 weights)"]
    assert fp32.direction == "incoming" and fp32.weight_dtype == torch.float32
    assert b["cuequivariance (fp32 weights)"] is not None
    _, _, w16, _ = bench.trimul_inputs(5, 8, 1, device="cpu")
    _, _, w32, _ = bench.trimul_inputs(5, 8, 1, device="cpu", weight_dtype=torch.float32)
    assert all(w32[k].dtype == torch.float32 and torch.equal(w32[k], w16[k].float()) for k in w16)
    with pytest.raises(SystemExit, match="--trimul-weights takes bf16, fp32"):
        bench.main(["--trimul-weights", "fp8"])


def _fake_pairformer(monkeypatch, calls, oom=()):
    """bench_pairformer.run with the CUDA parts stubbed: each measured case is recorded in
    calls and returns a row; cases in oom raise CUDA's out-of-memory error."""
    import torch

    from turbopairformer import bench_pairformer as bp

    clock = [0.0]
    monkeypatch.setattr(bp, "_now", lambda: clock[0])

    def measure(b, m, N, weights):  # each case takes 10 s of the budget's clock
        clock[0] += 10
        calls.append((b, m, N))
        if (b, m, N) in oom:
            raise torch.cuda.OutOfMemoryError("fake")
        slower = 2.0 if b == "pytorch" else 1.0
        return {
            "backend": b,
            "mode": m,
            "N": N,
            "first_call_s": 0.1,
            "block_fwd_bwd_ms": slower * N,
            "pair_fwd_bwd_ms": float(N) / 2,
            "block_peak_gib": 1.0,
            "stack4_step_ms": slower * 4.0 * N,
            "stack4_peak_gib": 2.0,
            "z_rel_err_vs_fp32": 1e-3,
            "s_rel_err_vs_fp32": 1e-3,
            "grads_bitwise_repeatable": True,
        }

    monkeypatch.setattr(bp, "measure", measure)
    monkeypatch.setattr(
        bp,
        "_backends",
        lambda: {
            "turbopairformer": (None, None),
            "pytorch": (None, None),
            "trifast": "not installed",
        },
    )
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    return bp


def test_pairformer_sweep_resumes_where_the_last_call_stopped(tmp_path, monkeypatch):
    """A sweep longer than one call: the first call stops at its budget (the unstarted cases
    recorded as stopped), the second, the same command with --resume, runs only what is missing
    or failed, keeps the out-of-memory row, and the table lists both calls and orders rows by N,
    mode, ours first."""
    calls = []
    bp = _fake_pairformer(monkeypatch, calls, oom={("pytorch", "eager", 512)})
    rows = bp.run([256, 512], ["eager"], tmp_path, "GPU", "cmd 1", budget=15)
    assert calls == [("turbopairformer", "eager", 256), ("pytorch", "eager", 256)]
    assert [r.get("status", "") for r in rows if r["N"] == 512] == [
        "stopped: --budget 15 s reached"
    ] * 2
    assert (tmp_path / "pairformer.json").exists() and not (
        tmp_path / "pairformer.json.tmp"
    ).exists()

    calls.clear()
    rows = bp.run([256, 512], ["eager"], tmp_path, "GPU", "cmd 2", resume=True)
    assert calls == [("turbopairformer", "eager", 512), ("pytorch", "eager", 512)]
    assert [(r["backend"], r["N"], r.get("status"), r["call"]) for r in rows] == [
        ("trifast", "-", "not installed", 1),
        ("turbopairformer", 256, None, 0),
        ("pytorch", 256, None, 0),
        ("turbopairformer", 512, None, 1),
        ("pytorch", 512, "out of memory", 1),
    ]
    data = json.loads((tmp_path / "pairformer.json").read_text())
    assert data["commands"] == ["cmd 1", "cmd 2"] and len(data["rows"]) == 5
    md = (tmp_path / "pairformer.md").read_text()
    assert "0. `cmd 1`" in md and "1. `cmd 2`" in md and "| call |" in md
    assert "| turbopairformer | eager | 512 | 512.00 | 256.00 |" in md

    calls.clear()  # a third call: nothing left but the out-of-memory row, which is kept
    bp.run([256, 512], ["eager"], tmp_path, "GPU", "cmd 3", resume=True)
    assert calls == []
    assert json.loads((tmp_path / "pairformer.json").read_text())["commands"][-1] == "cmd 3"


def test_pairformer_narrowed_resume_keeps_the_cases_it_does_not_run(tmp_path, monkeypatch):
    """A --resume call narrowed by --n and --backends runs only its cases and leaves the other
    rows as they were, stopped ones included; the table's summary sets our best time against
    the fastest other backend's at each N where both were measured."""
    calls = []
    bp = _fake_pairformer(monkeypatch, calls)
    bp.run([256, 512], ["eager"], tmp_path, "GPU", "cmd 1", budget=15)
    calls.clear()
    rows = bp.run([512], ["eager"], tmp_path, "GPU", "cmd 2", only=["turbopairformer"], resume=True)
    assert calls == [("turbopairformer", "eager", 512)]
    assert [(r["backend"], r["N"], r.get("status"), r["call"]) for r in rows] == [
        ("turbopairformer", 256, None, 0),
        ("pytorch", 256, None, 0),
        ("turbopairformer", 512, None, 1),
        ("pytorch", 512, "stopped: --budget 15 s reached", 0),
    ]
    md = (tmp_path / "pairformer.md").read_text()
    assert (
        "| 256 | 4-block AdamW step | 1024.0 (eager) | 2048.0 (pytorch, eager) | 2.00x | 1 of 1 |"
        in md
    )
    assert "| 256 | block | 256.0 (eager) | 512.0 (pytorch, eager) | 2.00x | 1 of 1 |" in md
    assert "| 512 | block |" not in md  # no other backend measured there
    calls.clear()  # the full command again runs what the narrowed call left
    bp.run([256, 512], ["eager"], tmp_path, "GPU", "cmd 3", resume=True)
    assert calls == [("pytorch", "eager", 512)]


def test_pairformer_resume_refuses_another_gpu_or_a_broken_table(tmp_path, monkeypatch):
    bp = _fake_pairformer(monkeypatch, [])
    bp.run([256], ["eager"], tmp_path, "GPU A", "cmd 1")
    with pytest.raises(SystemExit, match="measured on 'GPU A'"):
        bp.run([256], ["eager"], tmp_path, "GPU B", "cmd 2", resume=True)
    (tmp_path / "pairformer.json").write_text('{"rows": [')
    with pytest.raises(SystemExit, match="cannot read"):
        bp.run([256], ["eager"], tmp_path, "GPU A", "cmd 2", resume=True)


def test_pairformer_tables_of_separate_calls_merge(tmp_path, monkeypatch):
    """--merge joins the tables of calls that did not resume from each other: the second's
    calls follow the first's, its measured rows replace the first's for the same case, and its
    stopped rows do not replace measured ones; tables of two GPUs are refused."""
    bp = _fake_pairformer(monkeypatch, [])
    a, b = tmp_path / "a", tmp_path / "b"
    bp.run([256, 512], ["eager"], a, "GPU", "cmd a", budget=15)  # 512 stopped
    bp.run([256, 512], ["eager"], b, "GPU", "cmd b", only=["pytorch"])
    data = json.loads((b / "pairformer.json").read_text())
    for r in data["rows"]:
        if (r["backend"], r["N"]) == ("pytorch", 256):
            r.clear()
            r.update(backend="pytorch", mode="eager", N=256, status="stopped", call=0)
    (b / "pairformer.json").write_text(json.dumps(data))
    out = tmp_path / "merged"
    bench.main(
        ["--merge", str(a / "pairformer.json"), str(b / "pairformer.json"), "--out", str(out)]
    )
    merged = json.loads((out / "pairformer.json").read_text())
    assert merged["commands"] == ["cmd a", "cmd b"]
    cases = {(r["backend"], r["N"]): (r.get("status"), r["call"]) for r in merged["rows"]}
    assert cases[("pytorch", 256)] == (None, 0)  # b's stopped row does not replace a's
    assert cases[("pytorch", 512)] == (None, 1)  # b's measured row replaces a's stopped one
    assert cases[("turbopairformer", 512)] == ("stopped: --budget 15 s reached", 0)
    assert "1. `cmd b`" in (out / "pairformer.md").read_text()
    other = dict(data, gpu="GPU B")
    (b / "pairformer.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="one GPU"):
        bench.main(
            ["--merge", str(a / "pairformer.json"), str(b / "pairformer.json"), "--out", str(out)]
        )


def test_resume_is_refused_outside_the_pairformer_table():
    with pytest.raises(SystemExit):
        bench.main(["--resume", "--n", "256"])


def test_pairformer_case_killed_mid_run_is_retried_once_then_given_up(tmp_path, monkeypatch):
    """A call killed while a case runs (a device's time limit) leaves that case's row saying so;
    --resume runs it again once, first among what is left, and after a second kill keeps the row
    as given up, so that later calls go on with the other cases."""
    calls = []
    bp = _fake_pairformer(monkeypatch, calls)
    inner = bp.measure

    def measure(b, m, N, weights):
        if (b, N) == ("pytorch", 512):
            calls.append((b, m, N))
            raise KeyboardInterrupt  # as a SIGTERM ends the process: nothing after it runs
        return inner(b, m, N, weights)

    monkeypatch.setattr(bp, "measure", measure)
    for attempt in (1, 2):
        calls.clear()
        with pytest.raises(KeyboardInterrupt):
            bp.run([256, 512, 768], ["eager"], tmp_path, "GPU", f"cmd {attempt}", resume=True)
        assert calls[-1] == ("pytorch", "eager", 512)
        rows = json.loads((tmp_path / "pairformer.json").read_text())["rows"]
        (killed,) = [r for r in rows if r.get("status") == bp.RUNNING]
        assert (killed["backend"], killed["N"], killed["kills"]) == ("pytorch", 512, attempt - 1)
        assert not any(r["N"] == 768 for r in rows)  # the call died before them
    calls.clear()
    rows = bp.run([256, 512, 768], ["eager"], tmp_path, "GPU", "cmd 3", resume=True)
    assert calls == [("turbopairformer", "eager", 768), ("pytorch", "eager", 768)]
    (gave_up,) = [r for r in rows if r["backend"] == "pytorch" and r["N"] == 512]
    assert gave_up["status"] == bp.GAVE_UP and gave_up["kills"] == 2
    assert sum("status" not in r for r in rows) == 5  # every other case measured once
    md = (tmp_path / "pairformer.md").read_text()
    assert f"| pytorch | eager | 512 | {bp.GAVE_UP} |" in md


def test_pairformer_table_replots_from_its_json(tmp_path, monkeypatch):
    """--replot pairformer.json rewrites the Markdown (and plot) of a resumed table from its
    JSON alone, every call's command kept."""
    bp = _fake_pairformer(monkeypatch, [])
    bp.run([256], ["eager"], tmp_path, "GPU", "cmd 1", budget=0)
    bp.run([256], ["eager"], tmp_path, "GPU", "cmd 2", resume=True)
    md = (tmp_path / "pairformer.md").read_text()
    (tmp_path / "pairformer.md").unlink()
    bench.main(["--replot", str(tmp_path / "pairformer.json")])
    assert (tmp_path / "pairformer.md").read_text() == md
    assert "0. `cmd 1`" in md and "1. `cmd 2`" in md


def test_modes_run_as_each_compile_mode_and_unknown_modes_are_refused(monkeypatch, capsys):
    """--modes: eager runs the module as it is, compile under torch.compile, compile-ro under
    torch.compile(mode="reduce-overhead"); a mode outside these stops the command with a clear
    error before anything runs."""
    import pytest
    import torch

    from turbopairformer import bench, bench_pairformer as bp

    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(kw) or ("compiled", fn))
    m = torch.nn.Linear(2, 2)
    assert bp.run_as(m, "eager") is m
    assert bp.run_as(m, "compile") == ("compiled", m) and calls[-1] == {}
    assert bp.run_as(m, "compile-ro") == ("compiled", m)
    assert calls[-1] == {"mode": "reduce-overhead"}
    with pytest.raises(ValueError, match="unknown mode 'graph'"):
        bp.run_as(m, "graph")
    with pytest.raises(SystemExit):
        bench.main(["--pairformer", "--modes", "eager,reduce", "--n", "4"])
    assert "--modes: unknown reduce (eager, compile, compile-ro)" in capsys.readouterr().err
