"""The fused native prediction kernel (gpdyn/gp/native.py, native_exp2.cpp), float32 and
float64, against the float64 torch path: every layout of features, the exp2 polynomials
over their whole range, NaN, threads, torch.compile, and the fallback when it cannot be
built."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from gpdyn.gp import kernels, native

F32, F64 = torch.float32, torch.float64
#: relative error of the kernel-times-vector against the float64 reference: float32 rounding
#: of the features' inner products and sums, float64 rounding
TOLERANCE = {F32: 2e-6, F64: 1e-13}
needs_compiler = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None or not native.wanted(),
                                    reason="needs the C++ compiler $CXX (g++ by default) and GPDYN_NATIVE not 0: the native kernel")


def _reference(u: torch.Tensor, v: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
    """``exp2(U V^T) vec`` in float64, the kernel stored whole."""
    k = torch.exp2(u.double() @ v.double().transpose(-1, -2))
    return (k.expand(vec.shape[0], *k.shape[-2:]) @ vec.double().unsqueeze(-1)).squeeze(-1)


def _features(shape: tuple[int, ...], gen: torch.Generator, scale: float = 0.3, dtype: torch.dtype = F32) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=dtype) * scale


@needs_compiler
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("u_per_output, v_per_output", [(True, True), (False, True), (True, False), (False, False)])
@pytest.mark.parametrize("p, n, m, r", [(3, 37, 53, 4), (2, 1, 1, 1), (1, 16, 8, 25), (4, 100, 300, 6)])
def test_native_equals_the_float64_kernel_times_vector(dtype, u_per_output, v_per_output, p, n, m, r):
    """Per-output kernels, one side shared, one kernel for all vectors; sizes off the kernel's
    16-point and 8-basis tiles and across its 256-term partial sums."""
    g = torch.Generator().manual_seed(p * 1000 + n + m + r)
    u = _features((p, n, r) if u_per_output else (n, r), g, dtype=dtype)
    v = _features((p, m, r) if v_per_output else (m, r), g, dtype=dtype)
    vec = torch.randn(p, m, generator=g, dtype=dtype)
    assert native.usable(u, v, vec)
    got = kernels.exp2_matvec(u, v, vec)
    want = _reference(u, v, vec)
    assert got.shape == (p, n) and got.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * float(want.abs().max()))
    with native.enabled(False):  # the torch path gives the same numbers
        torch.testing.assert_close(kernels.exp2_matvec(u, v, vec), got, rtol=5 * tol, atol=5 * tol * float(want.abs().max()))


@needs_compiler
def test_one_kernel_serves_more_vectors_than_one_pass_holds():
    g = torch.Generator().manual_seed(1)
    u, v = _features((21, 5), g), _features((40, 5), g)
    vec = torch.randn(native.MAX_VECTORS + 6, 40, generator=g, dtype=F32)
    want = _reference(u, v, vec)
    torch.testing.assert_close(native.exp2_matvec(u, v, vec).double(), want, rtol=2e-6, atol=2e-6 * float(want.abs().max()))


@needs_compiler
@pytest.mark.parametrize("dtype, bound, accuracy", [(F32, 126.0, 3e-7), (F64, 1022.0, 1e-15)])
def test_exp2_polynomial_is_accurate_to_rounding_and_flushes_under_the_smallest_normal(dtype, bound, accuracy):
    """One basis function with feature 1 and unit weight: the output is exp2 of the input."""
    s = torch.cat([torch.linspace(-bound, bound, 40001, dtype=F64), torch.tensor([-0.5, 0.5, -1e-8, 0.0, 3.49999])])
    s = s.to(dtype)
    one = torch.ones(1, 1, dtype=dtype)
    got = native.exp2_matvec(s[:, None], one, one)[0]
    want = torch.exp2(s.double())
    assert float(((got.double() - want) / want).abs().max()) < accuracy
    far = native.exp2_matvec(torch.tensor([[-bound - 1.5], [-1e4], [-1e30]], dtype=dtype), one, one)[0]
    assert far.tolist() == [0.0, 0.0, 0.0]  # under the smallest normal number: no kernel mass


@needs_compiler
def test_a_nan_feature_gives_nan_in_its_own_rows_only():
    g = torch.Generator().manual_seed(2)
    u, v = _features((3, 20, 4), g), _features((3, 30, 4), g)
    u[1, 7, 2] = float("nan")
    got = native.exp2_matvec(u, v, torch.randn(3, 30, generator=g))
    assert torch.isnan(got[1, 7])
    got[1, 7] = 0.0
    assert torch.isfinite(got).all()


@needs_compiler
def test_rows_split_over_threads_give_the_same_numbers(monkeypatch):
    g = torch.Generator().manual_seed(3)
    u, v, vec = _features((2, 101, 6), g), _features((2, 77, 6), g), torch.randn(2, 77, generator=g)
    one = native.exp2_matvec(u, v, vec)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    torch.testing.assert_close(native.exp2_matvec(u, v, vec), one, rtol=0, atol=0)


@needs_compiler
def test_svdgp_mean_in_float32_takes_the_native_path_and_matches_the_torch_path(monkeypatch):
    from gpdyn.gp import make_learner
    from learner_data import random_data

    x, y = (t.to(F32) for t in random_data(200, 5, 2, seed=4))
    learner = make_learner("svdgp", input_dim=5, output_dim=2, preset="small", dtype=F32, seed=0)
    learner.observe(x, y)
    learner.step(x, y)
    test = torch.randn(50, 5, generator=torch.Generator().manual_seed(5), dtype=F32)
    calls = []
    fused_kernel, laid_out = native.exp2_matvec, native.exp2_matvec_laid_out
    monkeypatch.setattr(native, "exp2_matvec", lambda *a: calls.append(a[0].shape[-2]) or fused_kernel(*a))
    # the learner's own entry: the inputs built in the kernel's layout, the points (padded) along the last axis
    monkeypatch.setattr(native, "exp2_matvec_laid_out", lambda *a: calls.append(a[0].shape[-1]) or laid_out(*a))
    with torch.no_grad():
        fused = learner.predict_mean(test)
        assert calls and calls[-1] == -(-50 // native.LANES) * native.LANES
        with native.enabled(False):
            torch_path = learner.predict_mean(test)
    torch.testing.assert_close(fused, torch_path, rtol=1e-5, atol=1e-5 * float(torch_path.abs().max()))


def test_mixed_dtypes_autograd_and_turned_off_stay_on_the_torch_path():
    x32 = torch.zeros(2, 2, dtype=F32)
    assert not native.usable(x32, x32.double())
    assert not native.usable(x32.half())
    assert not native.usable(x32.requires_grad_())
    with native.enabled(False):
        assert not native.usable(torch.zeros(2, 2, dtype=F32))


def test_a_compiler_that_fails_warns_once_and_predictions_run_on_the_torch_path(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_failed", None)
    monkeypatch.setattr(native, "_enabled", True)
    with pytest.warns(RuntimeWarning, match="no-such-compiler.*GPDYN_NATIVE=0"):
        assert native.library() is None
    assert native.library() is None  # the failure is remembered: no second build, no second warning
    g = torch.Generator().manual_seed(6)
    u, v, vec = _features((2, 9, 3), g), _features((2, 11, 3), g), torch.randn(2, 11, generator=g)
    want = _reference(u, v, vec)
    torch.testing.assert_close(kernels.exp2_matvec(u, v, vec).double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


@needs_compiler
def test_a_build_goes_to_the_cache_once_under_a_key_of_source_flags_compiler_and_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = native._build()
    cache = tmp_path / "gpdyn" / "native"
    built = sorted(p.name for p in cache.iterdir())
    assert len(built) == 3 and built[0] == native.BUILD_LOCK and built[1].startswith("exp2-") and built[1].endswith(".so")
    assert built[2] == built[1] + native.DIGEST_SUFFIX  # the library, its sha256 and the builders' lock, nothing else
    stamps = {name: (cache / name).stat().st_mtime_ns for name in built}
    second = native._build()
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == stamps
    assert first._name == second._name == str(cache / built[1])


@needs_compiler
def test_shapes_that_do_not_fit_are_refused_and_an_output_axis_of_one_is_shared():
    """The kernel reads raw memory: a mismatch never reaches it."""
    g = torch.Generator().manual_seed(8)
    u, v, vec = _features((3, 20, 4), g), _features((3, 30, 4), g), torch.randn(3, 30, generator=g)
    for bad in ((u[:2], v, vec), (u, v[..., :3], vec), (u, v, vec[:, :29]), (u, v, vec[:2]), (u[0, 0], v, vec)):
        with pytest.raises(ValueError, match=r"exp2_matvec: u \[.*\] do not fit"):
            native.exp2_matvec(*bad)
    want = _reference(u[:1].expand(3, -1, -1), v, vec)
    torch.testing.assert_close(native.exp2_matvec(u[:1], v, vec).double(), want, rtol=2e-6, atol=2e-6 * float(want.abs().max()))
    assert native.exp2_matvec(u[:, :0], v, vec).shape == (3, 0)
    assert native.exp2_matvec(u[:0], v[:0], vec[:0]).shape == (0, 20)


@needs_compiler
@pytest.mark.parametrize("dtype", [F32, F64])
def test_exp2_overflow_is_inf_and_nan_stays_nan(dtype):
    one = torch.ones(1, 1, dtype=dtype)
    s = torch.tensor([[float("inf")], [1e4], [float("-inf")], [float("nan")]], dtype=dtype)
    got = native.exp2_matvec(s, one, one)[0]
    assert got[:3].tolist() == [float("inf"), float("inf"), 0.0] and torch.isnan(got[3])


@needs_compiler
@pytest.mark.slow
def test_the_operator_passes_torch_opcheck_and_compiles_with_inductor():
    """The fake implementation matches the real output (shape, strides) for N off the lanes,
    and torch.compile keeps the operator in one graph (fullgraph: no break)."""
    g = torch.Generator().manual_seed(9)
    u, v, vec = _features((2, 19, 4), g), _features((2, 23, 4), g), torch.randn(2, 23, generator=g)
    torch.library.opcheck(torch.ops.gpdyn.exp2_matvec.default, (u, v, vec),
                          test_utils=("test_schema", "test_faketensor"))
    compiled = torch.compile(lambda a, b, c: kernels.exp2_matvec(a, b, c) * 2.0, fullgraph=True)
    torch.testing.assert_close(compiled(u, v, vec), kernels.exp2_matvec(u, v, vec) * 2.0)


@needs_compiler
def test_a_forked_child_runs_the_threaded_kernel(monkeypatch):
    """The thread pool does not survive fork: the child builds its own instead of waiting forever."""
    import signal
    import time

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    g = torch.Generator().manual_seed(10)
    u, v, vec = _features((2, 64, 3), g), _features((2, 9, 3), g), torch.randn(2, 9, generator=g)
    want = native.exp2_matvec(u, v, vec)
    assert native._pool is not None
    pid = os.fork()
    if pid == 0:  # the child: exit 0 when it starts with no pool and its call returns the parent's numbers
        try:
            fresh = native._pool is None  # an inherited pool's queued work may wait for threads that are gone
            os._exit(0 if fresh and torch.equal(native.exp2_matvec(u, v, vec), want) else 1)
        finally:
            os._exit(2)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's kernel call hung")


@needs_compiler
@pytest.mark.parametrize("shared_kernel", [False, True])
@pytest.mark.parametrize("n", [1, 16, 37])
def test_svdgp_predictions_with_inputs_built_in_the_kernel_layout_match_the_torch_path(shared_kernel, n):
    """SVDGP's CPU predictions build the input features straight into the native kernel's
    layout (padded to its lanes): mean, variance and the mean alone equal the torch path's,
    float64, to rounding; per-output and shared length scales."""
    from gpdyn.gp import make_learner
    from learner_data import random_data

    x, y = random_data(300, 5, 3, seed=8)
    learner = make_learner("svdgp", input_dim=5, output_dim=3, preset="small", dtype=F64, seed=0,
                           shared_kernel=shared_kernel)
    for lo in range(0, 300, 100):
        learner.observe(x[lo : lo + 100], y[lo : lo + 100])
        learner.step(x[lo : lo + 100], y[lo : lo + 100])
    test = torch.randn(n, 5, generator=torch.Generator().manual_seed(9), dtype=F64)
    with torch.no_grad():
        cache = learner._prediction_cache(test, "predict")
        assert learner._laid_out(cache, test)
        mean, var = learner.predict(test)
        mean_only = learner.predict_mean(test)
        with native.enabled(False):
            assert not learner._laid_out(cache, test)
            torch_mean, torch_var = learner.predict(test)
    torch.testing.assert_close(mean, torch_mean, rtol=1e-12, atol=1e-12 * float(torch_mean.abs().max()))
    torch.testing.assert_close(var, torch_var, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(mean_only, mean, rtol=0, atol=0)


@needs_compiler
def test_the_laid_out_entry_refuses_what_does_not_fit_its_layout():
    ut, v, vec = torch.zeros(2, 4, 16, dtype=F64), torch.zeros(2, 3, 4, dtype=F64), torch.zeros(2, 3, dtype=F64)
    assert native.exp2_matvec_laid_out(ut, v, vec).shape == (2, 16)
    for bad in ((ut[..., :15], v, vec), (ut, v[:, :, :3], vec), (ut.transpose(1, 2).contiguous().transpose(1, 2), v, vec),
                (torch.zeros(3, 4, 16, dtype=F64), v, vec)):
        with pytest.raises(ValueError, match="exp2_matvec_laid_out"):
            native.exp2_matvec_laid_out(*bad)
