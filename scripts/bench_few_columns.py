"""CPU time of products with few right-hand columns, plain against ``matmul_few_columns``, in one run.

``a @ b`` with ``b`` of 1-16 columns (a control step's one row, a small batch) takes a slow BLAS
path on the CPU; ``gpdyn.gp.kernels.matmul_few_columns`` takes the transposed product instead.
This prints, at the sizes of the KUKA controller's WISKI (``P = 7`` outputs, ``M = 358`` basis
weights, float64), the CPU ms of each form and their ratio:

- the raw products ``[P, M, M] @ [P, M, q]`` and ``[M, M] @ [M, q]``;
- one WISKI ``observe`` of one row under :func:`gpdyn.gp.wiski.for_control` (the Woodbury update of
  ``B^{-1}``, the controller's per-step learner update), with the helper and with plain ``@`` in its place.

    python scripts/bench_few_columns.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

import gpdyn.gp.wiski as wiski_module
from gpdyn.gp import make_learner
from gpdyn.gp.kernels import matmul_few_columns
from gpdyn.gp.training import pretrain_learner


def cpu_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()
    start = time.process_time()
    for _ in range(repeat):
        fn()
    return 1e3 * (time.process_time() - start) / repeat


def observe_ms(repeat: int, plain: bool) -> float:
    """CPU ms of one single-row ``observe`` of a controller's WISKI (inputs 21, outputs 7, ``small`` preset)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000 + repeat, 21, generator=g, dtype=torch.float64)
    y = torch.sin(x[:, :7]) + 0.1 * x[:, 7:14]
    learner = make_learner("wiski", 21, 7, preset="small", seed=0, dtype=torch.float64)
    pretrain_learner(learner, x[:3000], y[:3000], iterations=100, batch=128, seed=0, progress=False)
    wiski_module.for_control(learner)
    learner.predict_mean(x[:1])  # the full refresh the Woodbury updates start from
    helper = wiski_module.matmul_few_columns
    if plain:
        wiski_module.matmul_few_columns = torch.matmul
    try:
        start = time.process_time()
        for row in range(3000, 3000 + repeat):
            learner.observe(x[row : row + 1], y[row : row + 1])
        return 1e3 * (time.process_time() - start) / repeat
    finally:
        wiski_module.matmul_few_columns = helper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| product | plain @ [ms] | matmul_few_columns [ms] | plain / helper |")
    print("|---|---|---|---|")
    for batch in ((7,), ()):
        for q in (1, 2, 8, 16):
            a = torch.randn(*batch, 358, 358, dtype=torch.float64)
            b = torch.randn(*batch, 358, q, dtype=torch.float64)
            plain, helper = cpu_ms(lambda: a @ b, args.repeat), cpu_ms(lambda: matmul_few_columns(a, b), args.repeat)
            print(f"| {list(a.shape)} @ {list(b.shape)} | {plain:.3f} | {helper:.3f} | {plain / helper:.1f} |")
    plain, helper = observe_ms(args.repeat, plain=True), observe_ms(args.repeat, plain=False)
    print(f"| WISKI observe, one row, for_control | {plain:.2f} | {helper:.2f} | {plain / helper:.1f} |")


if __name__ == "__main__":
    main()
