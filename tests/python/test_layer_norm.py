"""The library's LayerNorm (turbopairformer._norm): the CPU path is the FP64 reference, checked
against PyTorch in double; the CUDA kernels are checked against the FP64 reference on the same
inputs, at odd row counts, every built width and dtype pair, with NaN rows, poisoned outputs,
and bitwise-repeatable weight gradients."""

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not importable here")
from torch.nn import functional as F  # noqa: E402

from conftest import requires_gpu  # noqa: E402
from turbopairformer import _calls, _native, _norm  # noqa: E402


def _inputs(shape, dtype, device, seed, affine=True):
    g = torch.Generator().manual_seed(seed)
    W = shape[-1]
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3 + 1).to(dtype)
    w = (1 + 0.3 * torch.randn(W, generator=g, dtype=torch.float64)).to(dtype) if affine else None
    b = (0.3 * torch.randn(W, generator=g, dtype=torch.float64)).to(dtype) if affine else None
    dy = torch.randn(shape, generator=g, dtype=torch.float64)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(x), to(w), to(b), to(dy)


def _torch_double(x, w, b, dy, eps):
    xd = x.double().requires_grad_(True)
    wd = None if w is None else w.double().requires_grad_(True)
    bd = None if b is None else b.double().requires_grad_(True)
    y = F.layer_norm(xd, [x.shape[-1]], wd, bd, eps)
    y.backward(dy.double())
    return y.detach(), xd.grad, None if wd is None else wd.grad, None if bd is None else bd.grad


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_reference_matches_pytorch_in_double(dtype, affine):
    x, w, b, dy = _inputs((3, 5, 24), dtype, "cpu", seed=1, affine=affine)
    y, mean, rstd = _norm.forward(x, w, b, 1e-5, dtype)
    dx, dw, db = _norm.backward(dy.to(dtype), x, w, b, 1e-5, mean, rstd, True, True)
    ry, rdx, rdw, rdb = _torch_double(x, w, b, dy.to(dtype), 1e-5)
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    for got, want in ((y, ry), (dx, rdx), (dw, rdw), (db, rdb)):
        if want is None:
            assert got is None
            continue
        assert (got.double() - want).norm() <= tol * want.norm()
    assert torch.allclose(mean.double(), x.double().mean(-1).flatten(), atol=1e-6)


def test_bad_arguments_name_the_argument():
    x, w, b, dy = _inputs((4, 32), torch.float32, "cpu", seed=2)
    with pytest.raises(ValueError, match="'weight'"):
        _norm.forward(x, w[:16], b, 1e-5, torch.float32)
    with pytest.raises(ValueError, match="'eps'"):
        _norm.forward(x, w, b, 0.0, torch.float32)
    y, mean, rstd = _norm.forward(x, w, b, 1e-5, torch.float32)
    with pytest.raises(ValueError, match="'mean'"):
        _norm.backward(dy.float(), x, w, b, 1e-5, mean[:2], rstd, True, True)
    with pytest.raises(ValueError, match="'dy'"):
        _norm.backward(dy.float()[:2], x, w, b, 1e-5, mean, rstd, True, True)


def test_gpu_support_is_decided_before_the_call():
    x = torch.zeros(4, 128)
    assert not _norm.gpu_supported(x, None, torch.bfloat16)  # a CPU tensor
    meta = torch.empty(4, 96, device="meta")
    assert not _norm.gpu_supported(meta, None, torch.bfloat16)


# --- CUDA kernels against the FP64 reference -------------------------------------------------

U = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}
PAIRS = [
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float32),
    (torch.float32, torch.float16),
    (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float16),
]


def _poisoned(shape, dtype):
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def _run_gpu(x, w, b, dy, eps, out_dtype):
    """Forward and backward through the C ABI with NaN-poisoned outputs (every element the
    kernels must write)."""
    rows = x.numel() // x.shape[-1]
    y, mean, rstd = (
        _poisoned(x.shape, out_dtype),
        _poisoned(rows, torch.float32),
        _poisoned(rows, torch.float32),
    )
    a = _norm._args(eps, x=x, weight=w, bias=b, y=y, mean=mean, rstd=rstd)
    _calls.check_call(_native.LIB.tpf_layer_norm_forward, a, 1, _calls.stream(x))
    dx = _poisoned(x.shape, x.dtype)
    dw = None if w is None else _poisoned(w.shape, w.dtype)
    db = None if b is None else _poisoned(b.shape, b.dtype)
    dx_, dw_, db_ = _norm.backward(dy, x, w, b, eps, mean, rstd, True, True)
    a = _norm._args(
        eps, x=x, weight=w, bias=b, mean=mean, rstd=rstd, dy=dy, dx=dx, dweight=dw, dbias=db
    )
    err = _native.error_buffer()
    _ws, ptr, nbytes = _calls.workspace(
        _native.LIB.tpf_layer_norm_backward_workspace_size, a, x, err
    )
    _calls.check_call(_native.LIB.tpf_layer_norm_backward, a, 1, ptr, nbytes, _calls.stream(x))
    for got, again in ((dx, dx_), (dw, dw_), (db, db_)):  # run to run: bitwise
        assert again is None or torch.equal(got, again)
    return y, mean, rstd, dx, dw, db


def _close(got, want, u, what):
    got, want = got.double().cpu(), want.double().cpu()
    assert torch.isfinite(got).all(), what
    rel = (got - want).norm() / max(want.norm().item(), 1e-30)
    assert rel <= 2 * u + 1e-5, f"{what}: relative error {rel:.3g}"


@requires_gpu
@pytest.mark.parametrize("x_dtype,y_dtype", PAIRS)
@pytest.mark.parametrize(
    "rows,W",
    [(1, 128), (7, 32), (7, 64), (100, 256), (333, 96), (333, 192), (4096, 128), (70001, 128)],
)
def test_kernels_match_the_fp64_reference(x_dtype, y_dtype, rows, W):
    x, w, b, dy = _inputs((rows, W), x_dtype, "cuda", seed=rows + W)
    w32, b32 = w.float(), b.float()  # fp32 parameters (what mixed-precision training holds)
    dy = dy.to(y_dtype)
    y, mean, rstd, dx, dw, db = _run_gpu(x, w32, b32, dy, 1e-5, y_dtype)
    ry, rdx, rdw, rdb = _torch_double(x, w32, b32, dy, 1e-5)
    _close(y, ry, U[y_dtype], "y")
    _close(dx, rdx, U[x_dtype], "dx")
    _close(dw, rdw, 0, "dweight")
    _close(db, rdb, 0, "dbias")
    _close(rstd, 1 / torch.sqrt(x.double().var(-1, unbiased=False) + 1e-5), 0, "rstd")


@requires_gpu
def test_kernels_nan_rows_stay_in_their_row_and_absent_affine():
    x, _, _, dy = _inputs((333, 128), torch.float32, "cuda", seed=3, affine=False)
    x[17, 5] = float("nan")
    y, mean, rstd = _norm.forward(x, None, None, 1e-5, torch.bfloat16)
    assert (
        torch.isnan(y[17].float()).all()
        and torch.isfinite(y[torch.arange(333) != 17].float()).all()
    )
    dx, dw, db = _norm.backward(dy.bfloat16(), x, None, None, 1e-5, mean, rstd, True, True)
    assert dw is None and db is None
    assert torch.isnan(dx[17]).all() and torch.isfinite(dx[torch.arange(333) != 17]).all()
    keep = torch.arange(333) != 17
    ry, rdx, _, _ = _torch_double(x[keep], None, None, dy.bfloat16()[keep], 1e-5)
    _close(y[keep], ry, U[torch.bfloat16], "y")
    _close(dx[keep], rdx, U[torch.float32], "dx")


@requires_gpu
def test_kernels_take_a_misaligned_contiguous_view():
    base, w, b, dy = _inputs((101 * 64 + 1,), torch.float32, "cuda", seed=4, affine=False)
    x = base[1:].view(101, 64)  # 4-byte offset: the scalar path
    w = torch.ones(64, device="cuda")
    y, mean, rstd = _norm.forward(x, w, None, 1e-5, torch.float32)
    dy = dy[1:].view(101, 64).bfloat16()
    ry, rdx, rdw, _ = _torch_double(x, w, None, dy, 1e-5)
    _close(y, ry, U[torch.float32], "y")
    assert math.isfinite(mean.sum().item())
    dx, dw, _ = _norm.backward(dy, x, w, None, 1e-5, mean, rstd, True, False)
    _close(dx, rdx, U[torch.float32], "dx")
    _close(dw, rdw, 0, "dweight")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_gpu)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7, 333])
def test_dx_in_is_added_to_dx_in_the_same_pass(device, dtype, rows):
    """dx_in (a residual's gradient) joins dx: against the FP64 gradient plus dx_in, within the
    rounding of one output; dx_in itself is left as it was."""
    x, w, b, dy = _inputs((rows, 128), dtype, device, seed=rows)
    dx_in = torch.randn(rows, 128, dtype=torch.float64).to(device, dtype)
    keep = dx_in.clone()
    y, mean, rstd = _norm.forward(x, w, b, 1e-5, dtype)
    dx, _, _ = _norm.backward(dy.to(dtype), x, w, b, 1e-5, mean, rstd, False, False, dx_in)
    assert torch.equal(dx_in, keep) and dx.data_ptr() != dx_in.data_ptr()
    _, rdx, _, _ = _torch_double(x, w, b, dy.to(dtype), 1e-5)
    want = rdx + dx_in.double()
    u = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-20
    assert (dx.double() - want).norm() <= 2 * u * want.norm()
