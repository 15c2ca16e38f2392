"""CPU time of the two costliest pieces of the KUKA controller's step, each two ways, in one run.

The online arm controller (``gpdyn control kuka``) evaluates the rigid-body regressor twice per step
(the feed-forward at the reference, the filter's update at the measured row) and takes one row into
its WISKI learner. This prints the CPU ms of each way and their ratio:

- the regressor ``Y`` of the iiwa (101 columns) at one row and per row of a batch of 1,000: the
  Newton-Euler columns (``InertialRegressor.__call__``) against their definition, one ``mj_inverse`` of a
  moved model per column (``by_differences``);
- products with few right-hand columns at the sizes of the controller's WISKI (``P = 7`` outputs,
  ``M = 358`` basis weights, float64): plain ``a @ b``, which takes a slow BLAS path on the CPU, against
  ``gpdyn.gp.kernels.matmul_few_columns`` (the transposed product);
- one WISKI ``observe`` of one row under :func:`gpdyn.gp.wiski.for_control` (the Woodbury update of
  ``B^{-1}``) with the helper and with plain ``@`` in its place.

    python scripts/bench_arm_step.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

import gpdyn.gp.wiski as wiski_module
from gpdyn.gp import make_learner
from gpdyn.gp.kernels import matmul_few_columns
from gpdyn.gp.training import pretrain_learner
from gpdyn.robots.kuka import kuka_arm
from gpdyn.robots.regressor import InertialRegressor


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
    print("| piece | before [ms] | now [ms] | before / now |")
    print("|---|---|---|---|")
    arm = kuka_arm()
    regressor = InertialRegressor(arm.torque_model())
    rng = np.random.default_rng(0)
    q, qd, qdd = rng.uniform(-1, 1, (1000, 7)), rng.normal(0, 1, (1000, 7)), rng.normal(0, 3, (1000, 7))
    one = q[:1], qd[:1], qdd[:1]
    before, now = cpu_ms(lambda: regressor.by_differences(*one), args.repeat), cpu_ms(lambda: regressor(*one), args.repeat)
    print(f"| regressor, one row: by differences / Newton-Euler | {before:.3f} | {now:.3f} | {before / now:.1f} |")
    before, now = cpu_ms(lambda: regressor.by_differences(q, qd, qdd), 1), cpu_ms(lambda: regressor(q, qd, qdd), 1)
    print(f"| regressor, per row of 1,000 | {before / 1000:.3f} | {now / 1000:.3f} | {before / now:.1f} |")
    for batch in ((7,), ()):
        for q in (1, 2, 8, 16):
            a = torch.randn(*batch, 358, 358, dtype=torch.float64)
            b = torch.randn(*batch, 358, q, dtype=torch.float64)
            plain, helper = cpu_ms(lambda: a @ b, args.repeat), cpu_ms(lambda: matmul_few_columns(a, b), args.repeat)
            print(f"| {list(a.shape)} @ {list(b.shape)}: plain / matmul_few_columns | {plain:.3f} | {helper:.3f} | "
                  f"{plain / helper:.1f} |")
    plain, helper = observe_ms(args.repeat, plain=True), observe_ms(args.repeat, plain=False)
    print(f"| WISKI observe, one row, for_control: plain / matmul_few_columns | {plain:.2f} | {helper:.2f} | "
          f"{plain / helper:.1f} |")


if __name__ == "__main__":
    main()
