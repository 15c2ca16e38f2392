"""Replay stored control episodes through the frozen and the online (residual GP) Walker2d models.

    .venv/bin/python scripts/walker_online_error.py --store data/walker20.zarr \
        --episodes logs/ctl4-weak_motorx0.3-s*/episodes.zarr [--condition changed] \
        [--lengthscales 1,3] [--noises 0.001,0.01,0.1]

Pretrains the model as `gpdyn control walker` does (``pretrained_walker_model``), then walks
through every stored episode of one plant condition (any controller: the transitions are
the plant's, whoever chose the actions) exactly as the online controller would: predict the
next velocity, score it against what the plant did, then condition the residual GP on the
transition (``walker_residual_gp``, one per episode, from the frozen model). Prints the
mean one-step next-velocity RMSE over each episode and over its last 50 steps, for the
frozen model and for the residual GP at each lengthscale factor and noise variance
(normalised units). On the nominal plant the residual GP should not do worse than the
frozen model; on the changed plant it should do better. No simulator runs, so a
setting of the online model is compared on identical data, without the noise of where a
controller happened to walk.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from gpdyn.experiments.control_walker import (
    CONDITIONS,
    WalkerRunConfig,
    pretrained_walker_model,
    walker_train_inputs,
    walker_residual_gp,
)
from gpdyn.robots.walker import DT, LearnedWalkerDynamics
from gpdyn.data.store import EpisodeStore


def stored_episodes(paths: list[Path], condition: str) -> list[dict[str, np.ndarray]]:
    """States, actions and next states of every episode of ``condition`` in the control stores."""
    out = []
    for path in paths:
        store = EpisodeStore.open(path)
        for i, stored in enumerate(store.episode_values("condition")):
            if CONDITIONS[int(stored)] == condition:
                ep = store.episode(i, ["qpos", "qvel", "action", "next_qpos", "next_qvel"])
                out.append({"state": np.concatenate([ep["qpos"], ep["qvel"]], axis=1), "action": ep["action"],
                            "next_state": np.concatenate([ep["next_qpos"], ep["next_qvel"]], axis=1)})
    if not out:
        raise SystemExit(f"no {condition} episodes in {[str(p) for p in paths]}")
    return out


def replay(dynamics: LearnedWalkerDynamics, episode: dict[str, np.ndarray], learn: bool) -> np.ndarray:
    """One-step next-velocity RMSE per step; with ``learn`` the model observes each transition after predicting it."""
    s, a, s1 = (torch.as_tensor(episode[k]) for k in ("state", "action", "next_state"))
    errors = np.empty(len(s))
    for t in range(len(s)):
        with torch.no_grad():
            v, _ = dynamics.predict_velocity(s[t : t + 1], a[t : t + 1])
        errors[t] = float((v[0] - s1[t, 9:]).pow(2).mean().sqrt())
        if learn:
            x, y = dynamics.training_pair(s[t : t + 1], a[t : t + 1], s1[t : t + 1])
            dynamics.learner.observe(x, y)
            dynamics.learner.step(x, y)
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True, help="the Walker2d rollouts the model is pretrained on")
    parser.add_argument("--episodes", type=Path, nargs="+", required=True, help="control runs' episodes.zarr")
    parser.add_argument("--condition", choices=CONDITIONS, default="changed", help="which plant's episodes to replay")
    parser.add_argument("--lengthscales", default="1,3", help="residual GP lengthscale factors to compare")
    parser.add_argument("--noises", default="0.001", help="residual GP noise variances to compare")
    parser.add_argument("--learner", default="svdgp")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    factors = [float(f) for f in args.lengthscales.split(",") if f.strip()]
    noises = [float(f) for f in args.noises.split(",") if f.strip()]
    episodes = stored_episodes(args.episodes, args.condition)
    cfg = WalkerRunConfig(learner=args.learner, pretrain_iterations=args.iterations, seed=args.seed, progress=False)
    learner, frozen, _ = pretrained_walker_model(cfg, args.store)
    reference = walker_train_inputs(cfg, args.store)
    print(f"{len(episodes)} {args.condition} episodes ({sum(len(e['state']) for e in episodes)} steps); "
          "one-step next-velocity RMSE, mean over episodes:")
    print("| model | whole episode | last 50 steps |")
    print("|---|---|---|")
    rows = [("frozen", None)] + [(f"online, residual GP, lengthscale x{f:g}, noise {n:g}", (f, n))
                                 for f in factors for n in noises]
    for name, setting in rows:
        whole, last = [], []
        for episode in episodes:
            if setting is None:
                errors = replay(frozen, episode, learn=False)
            else:
                online = replace(cfg, residual_lengthscale=setting[0], residual_noise=setting[1])
                model = walker_residual_gp(learner, reference, online)
                errors = replay(LearnedWalkerDynamics(model, frozen.normalizer, DT, target=cfg.target), episode, learn=True)
            whole.append(errors.mean())
            last.append(errors[-50:].mean())
        print(f"| {name} | {np.mean(whole):.2f} | {np.mean(last):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
