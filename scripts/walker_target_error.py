"""One-step error of the Walker2d control model for each learner target, on and off the training data.

    .venv/bin/python scripts/walker_target_error.py --store data/walker20.zarr \
        --episodes logs/ctlm-*/episodes.zarr [--learner svdgp --iterations 300]

Pretrains the model exactly as `gpdyn control walker` does (``pretrained_walker_model``),
once per target (``change``: qvel[t+1] - qvel[t]; ``velocity``: qvel[t+1]), and prints the
next-velocity RMSE in physical units on the held-out walker-1 split (TRPO data) and on the
rows of the given control episode stores (the MPC's own trajectories, which the model has
not seen), beside "the velocity persists" (qvel[t+1] = qvel[t]). Only episodes of model-
based controllers (frozen, online) are read from the control stores.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from gpdyn.experiments.control_walker import CONTROLLERS, WalkerRunConfig, pretrained_walker_model
from gpdyn.robots.walker import QVEL_INPUTS, TARGETS, LearnedWalkerDynamics
from gpdyn.data.store import EpisodeStore


def control_rows(paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """walker-1 inputs and next velocities of the frozen/online episodes in the control stores."""
    model_based = {CONTROLLERS.index("frozen"), CONTROLLERS.index("online")}
    xs, ys = [], []
    for path in paths:
        store = EpisodeStore.open(path)
        for i, controller in enumerate(store.episode_values("controller")):
            if int(controller) in model_based:
                ep = store.episode(i, ["qpos", "qvel", "action", "next_qvel"])
                state = torch.as_tensor(np.concatenate([ep["qpos"], ep["qvel"]], axis=1))
                xs.append(LearnedWalkerDynamics.features(state, torch.as_tensor(ep["action"])).numpy())
                ys.append(ep["next_qvel"])
    if not xs:
        raise SystemExit(f"no frozen or online episodes in {[str(p) for p in paths]}")
    return np.concatenate(xs), np.concatenate(ys)


def rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True, help="the Walker2d rollouts the model is pretrained on")
    parser.add_argument("--episodes", type=Path, nargs="+", required=True, help="control runs' episodes.zarr")
    parser.add_argument("--learner", default="svdgp")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    x_ctl, y_ctl = control_rows(args.episodes)
    print(f"{len(x_ctl)} control rows from {len(args.episodes)} stores; next-velocity RMSE (rad/s, m/s):")
    print("| target | held-out TRPO rows | MPC trajectories |")
    print("|---|---|---|")
    persistence_ctl = rmse(x_ctl[:, QVEL_INPUTS], y_ctl)
    for target in TARGETS:
        cfg = WalkerRunConfig(learner=args.learner, target=target, pretrain_iterations=args.iterations, seed=args.seed,
                              progress=False)
        _, dynamics, fit = pretrained_walker_model(cfg, args.store)
        with torch.no_grad():
            v, _ = dynamics.predict_inputs(torch.as_tensor(x_ctl, dtype=torch.float64))
        print(f"| {target} | {fit['test_velocity_rmse']:.2f} | {rmse(v.numpy(), y_ctl):.2f} |")
    print(f"| (velocity persists) | {fit['test_persistence_rmse']:.2f} | {persistence_ctl:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
