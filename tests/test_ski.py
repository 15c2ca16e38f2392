"""SKI building blocks: cubic interpolation, grid bounds, Kronecker/Toeplitz K_UU."""

from __future__ import annotations

import pytest
import torch

from gpdyn.errors import InputError
from gpdyn.gp.kernels import se_ard
from gpdyn.gp.ski import (
    AdditiveSKIKernel,
    Grid,
    GridError,
    SKIKernel,
    dense_rows,
    interp_weights,
    kron_dense,
    kron_matmul,
    scatter_gram,
    scatter_rhs,
    toeplitz_factors,
)

D64 = torch.float64


def _grid(sizes=(7, 9), lo=(-1.0, 0.0), hi=(1.0, 3.0), margin=0.1) -> Grid:
    return Grid.from_bounds(torch.tensor(lo, dtype=D64), torch.tensor(hi, dtype=D64), sizes, margin)


def test_reproduces_cubic_polynomials_inside_the_grid():
    g = torch.Generator().manual_seed(0)
    grid = _grid()
    lo, hi = grid.interior()
    x = lo + (hi - lo) * torch.rand(200, 2, generator=g, dtype=D64)
    u = grid.points()

    def poly(p):  # full tensor-product cubic, coefficients seeded
        c = torch.randn(4, 4, generator=torch.Generator().manual_seed(1), dtype=D64)
        return sum(c[i, j] * p[:, 0] ** i * p[:, 1] ** j for i in range(4) for j in range(4))

    idx, w, outside = interp_weights(x, grid)
    assert idx.shape == (200, 16) and w.shape == (200, 16)  # 4^d non-zeros per row
    assert not outside.any()
    interp = (w * poly(u)[idx]).sum(-1)
    torch.testing.assert_close(interp, poly(x), rtol=1e-10, atol=1e-10)
    # and a quartic is not reproduced: the test can fail
    assert (dense_rows(idx, w, grid.num_points) @ u[:, 0] ** 4 - x[:, 0] ** 4).abs().max() > 1e-6


def test_interior_covers_bounds_with_margin():
    grid = _grid(margin=0.25)
    lo, hi = grid.interior()
    torch.testing.assert_close(lo, torch.tensor([-1.5, -0.75], dtype=D64))
    torch.testing.assert_close(hi, torch.tensor([1.5, 3.75], dtype=D64))
    x = torch.stack([lo, hi])
    _, w, outside = interp_weights(x, grid)
    assert not outside.any()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, dtype=D64))


def test_points_outside_are_flagged_and_clamped_to_the_edge():
    grid = _grid()
    lo, hi = grid.interior()
    far = torch.tensor([[5.0, 1.0], [0.0, -7.0], [0.2, 1.0]], dtype=D64)
    edge = torch.stack([torch.stack([hi[0], far[0, 1]]), torch.stack([far[1, 0], lo[1]]), far[2]])
    idx, w, outside = interp_weights(far, grid)
    assert outside.tolist() == [True, True, False]
    idx_e, w_e, _ = interp_weights(edge, grid)
    m = grid.num_points
    torch.testing.assert_close(dense_rows(idx, w, m), dense_rows(idx_e, w_e, m))


def test_bad_grids_raise_input_errors():
    with pytest.raises(GridError, match=">= 4 points"):
        _grid(sizes=(3, 8))
    with pytest.raises(GridError, match="2 dimensions"):
        interp_weights(torch.zeros(4, 3, dtype=D64), _grid())
    assert issubclass(GridError, InputError)


def test_kronecker_toeplitz_kuu_equals_dense_kernel_on_the_grid():
    grid = _grid()
    ls = torch.tensor([[0.3, 0.8], [1.1, 0.5]], dtype=D64)
    amp = torch.tensor([1.5, 0.4], dtype=D64)
    factors = toeplitz_factors(grid, ls)
    assert [f.shape for f in factors] == [(2, 7, 7), (2, 9, 9)]
    u = grid.points()
    dense = se_ard(u, u, ls, amp)
    torch.testing.assert_close(kron_dense(factors, amp), dense, rtol=1e-12, atol=1e-12)
    x = torch.randn(2, grid.num_points, 5, dtype=D64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(kron_matmul(factors, amp, x), dense @ x, rtol=1e-12, atol=1e-12)


def test_scatter_caches_equal_dense_products():
    grid = _grid()
    g = torch.Generator().manual_seed(3)
    x = torch.rand(30, 2, generator=g, dtype=D64) * torch.tensor([2.0, 3.0], dtype=D64) - torch.tensor([1.0, 0.0], dtype=D64)
    y = torch.randn(30, generator=g, dtype=D64)
    idx, w, _ = interp_weights(x, grid)
    wd = dense_rows(idx, w, grid.num_points)
    torch.testing.assert_close(scatter_gram(idx[None], w[None], grid.num_points)[0], wd.T @ wd)
    torch.testing.assert_close(scatter_rhs(idx[None], w[None], y[None], grid.num_points)[0], wd.T @ y)


def test_ski_kernel_approximates_se_kernel():
    grid = _grid(sizes=(30, 30))
    ls, amp = torch.tensor([[0.6, 0.9]], dtype=D64), torch.tensor([1.0], dtype=D64)
    x = torch.rand(20, 2, generator=torch.Generator().manual_seed(4), dtype=D64) * torch.tensor([2.0, 3.0], dtype=D64) - torch.tensor([1.0, 0.0], dtype=D64)
    k = SKIKernel(grid)
    torch.testing.assert_close(k(x, x, ls, amp), se_ard(x, x, ls, amp), atol=2e-4, rtol=0)
    torch.testing.assert_close(k.diag(x, ls, amp), k(x, x, ls, amp).diagonal(dim1=-2, dim2=-1))


def test_additive_ski_kernel_is_a_sum_of_ski_kernels_plus_a_linear_kernel():
    """Two 1-D components on the columns of x and a linear term: the sum of the parts, each built here."""
    grid = Grid.from_bounds(torch.tensor([-1.0], dtype=D64), torch.tensor([1.0], dtype=D64), 8, 0.1)
    g = torch.Generator().manual_seed(0)
    x1 = torch.rand(5, 2, generator=g, dtype=D64) * 2 - 1
    x2 = torch.rand(4, 2, generator=g, dtype=D64) * 2 - 1
    ls = torch.tensor([[[0.5], [0.8]]], dtype=D64)  # [P=1, C=2, d=1]
    amp = torch.tensor([[1.5, 0.4]], dtype=D64)
    lin = torch.tensor([[0.3, 0.2, 0.1]], dtype=D64)  # [P, D + 1]
    kernel = AdditiveSKIKernel(grid, lambda x: x.view(1, x.shape[0], 2, 1), lambda: (ls, amp, lin))
    ski = SKIKernel(grid)
    want = sum(ski(x1[:, c : c + 1], x2[:, c : c + 1], ls[:, c], amp[:, c]) for c in range(2))
    want = want + (x1 * lin[0, :2]) @ x2.T + lin[0, 2]
    torch.testing.assert_close(kernel(x1, x2), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(kernel.diag(x1), kernel(x1, x1).diagonal(dim1=-2, dim2=-1), rtol=1e-12, atol=1e-12)
    # each component alone is the SE kernel up to the interpolation error of a fine grid
    fine = Grid.from_bounds(torch.tensor([-1.0], dtype=D64), torch.tensor([1.0], dtype=D64), 64, 0.1)
    one = AdditiveSKIKernel(fine, lambda x: x[:, :1].view(1, x.shape[0], 1, 1),
                            lambda: (ls[:, :1], amp[:, :1], lin[:, :0]))
    torch.testing.assert_close(one(x1, x2), se_ard(x1[:, :1], x2[:, :1], ls[:, 0], amp[:, 0]), rtol=1e-3, atol=1e-4)
