"""Do the learned Walker2d models rank MPPI's sampled plans as the real plant does?

    .venv/bin/python scripts/walker_sample_ranking.py --store data/walker20.zarr \
        --change torso_mass --seed 16 --episodes 2 [--horizon 3 --proposal-tail 0] [--noise-std 0.1]

MPPI can only improve on its proposal when the model orders the K sampled offset
sequences as the plant would: the weights are ``softmax(-cost / lambda)`` of the model's
costs. This drives the changed plant with the TRPO policy (``--driver trpo``, cheap) or with
the cold-start MPC on the online model (``--driver online``), keeps the online model
(ResidualGP) learning from every transition, as `gpdyn control walker` does, and every
``--every`` steps scores the same K offset sequences (zero mean, as a cold-started plan
samples them) three times, with the same noise: through the frozen model, the online
model and the true simulator (``SimWalkerDynamics`` on the changed plant). Per episode and
model it prints

- the Spearman rank correlation of the model's sample costs with the true ones (1: the
  model orders the plans as the plant does; 0: the weights follow model noise),
- the regret of the model's MPPI choice: the true cost of the ``softmax(-cost / lambda)``
  average of the samples minus that of the truly best sample (reward units), and
- the cost bias, the mean of model cost minus true cost.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from gpdyn.experiments.control_walker import (
    WalkerRunConfig,
    online_walker_model,
    pretrained_walker_model,
    walker_planner,
    walker_reset_seed,
    walker_train_inputs,
)
from gpdyn.control.mpc import Planner
from gpdyn.robots.walker import NU, PLANT_CHANGES, SimWalkerDynamics, apply_plant_change, state_of


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (no ties expected among continuous costs)."""
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def mppi_regret(model_costs: np.ndarray, true_costs: np.ndarray, temperature: float) -> float:
    """True cost of the model's MPPI-weighted choice minus the best true cost among the samples."""
    w = np.exp(-(model_costs - model_costs.min()) / temperature)
    w /= w.sum()
    return float((w * true_costs).sum() - true_costs.min())


def score_samples(planners: dict[str, Planner], state: torch.Tensor, horizon: int, seed: int) -> dict[str, np.ndarray]:
    """Each planner's costs of the same K zero-mean offset sequences (same generator seed)."""
    costs = {}
    for name, planner in planners.items():
        planner.generator.manual_seed(seed)
        mean = torch.zeros(horizon, NU, dtype=planner.dtype, device=planner.device)
        with torch.no_grad():
            costs[name] = planner.rollout(state, mean, planner.noise_std.expand(horizon, NU)).costs.cpu().numpy()
    return costs


def run(cfg: WalkerRunConfig, store: Path, episodes: int, every: int, driver: str) -> list[dict]:
    from gpdyn.sim.policy import load_policy
    from gpdyn.sim.walker import make_env

    torch.manual_seed(cfg.seed)
    learner, frozen, _ = pretrained_walker_model(cfg, store)
    online, updater = online_walker_model(learner, frozen, cfg, walker_train_inputs(cfg, store))
    policy = load_policy()
    rows = []
    for episode in range(episodes):
        env = make_env()
        sim = env.unwrapped
        obs, _ = env.reset(seed=walker_reset_seed(cfg.seed, episode))  # as run_walker's episode k
        apply_plant_change(sim.model, cfg.change, cfg.change_factor)
        acting = walker_planner(cfg, online, sim, policy, cfg.samples)
        judges = {name: walker_planner(cfg, model, sim, policy, cfg.samples)
                  for name, model in (("frozen", frozen), ("online", online), ("true", SimWalkerDynamics(sim.model)))}
        found: dict[str, list[tuple[float, float, float]]] = {"frozen": [], "online": []}
        total, t = 0.0, 0
        for t in range(cfg.steps):
            s = torch.as_tensor(state_of(sim.data), dtype=torch.float64)
            if t % every == 0:
                costs = score_samples(judges, s, cfg.horizon, seed=1000 * episode + t)
                for name in found:
                    ok = np.isfinite(costs["true"]) & np.isfinite(costs[name])
                    if ok.sum() > 2:
                        found[name].append((spearman(costs[name][ok], costs["true"][ok]),
                                            mppi_regret(costs[name][ok], costs["true"][ok], cfg.temperature),
                                            float(np.mean(costs[name][ok] - costs["true"][ok]))))
            a = acting.plan(s)[0] if driver == "online" else torch.as_tensor(policy.act(obs), dtype=torch.float64)
            obs, reward, terminated, truncated, _ = env.step(a.numpy())
            total += float(reward)
            s1 = torch.as_tensor(state_of(sim.data), dtype=torch.float64)
            updater(*online.training_pair(s[None], a[None], s1[None]))
            if terminated or truncated:
                break
        env.close()
        for name, values in found.items():
            v = np.array(values)
            rows.append({"episode": episode + 1, "model": name, "return": total, "length": t + 1, "probes": len(v),
                         "rank_corr": float(v[:, 0].mean()), "regret": float(v[:, 1].mean()), "bias": float(v[:, 2].mean())})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True, help="the Walker2d rollouts the model is pretrained on")
    parser.add_argument("--change", choices=sorted(PLANT_CHANGES), default="torso_mass")
    parser.add_argument("--change-factor", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--episodes", type=int, default=1)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--every", type=int, default=5, help="probe every this many control steps")
    parser.add_argument("--driver", choices=("trpo", "online"), default="trpo", help="who acts on the plant")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--horizon", type=int, default=10)
    parser.add_argument("--proposal-tail", type=int, default=20)
    parser.add_argument("--noise-std", type=float, default=0.1)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--residual-noise", type=float, default=0.1, help="the online ResidualGP's noise variance")
    parser.add_argument("--iterations", type=int, default=300, help="pretraining iterations")
    args = parser.parse_args(argv)
    if args.episodes < 1 or args.steps < 1 or args.every < 1:
        parser.error("--episodes, --steps and --every must be >= 1")
    torch.set_num_threads(1)
    cfg = WalkerRunConfig(learner="svdgp", steps=args.steps, samples=args.samples, horizon=args.horizon,
                          noise_std=args.noise_std, temperature=args.temperature, relative_to_proposal=True,
                          terminal_value=True, proposal_tail=args.proposal_tail, uncertainty="mean", warm_start=False,
                          residual_noise=args.residual_noise, pretrain_iterations=args.iterations, change=args.change,
                          change_factor=args.change_factor, seed=args.seed, progress=False)
    cfg.validate()
    print(f"{args.change} (factor {args.change_factor or 'default'}), seed {args.seed}, driver {args.driver}; K = {args.samples}, "
          f"H = {args.horizon}, proposal tail {args.proposal_tail}, noise {args.noise_std:g}, temperature {args.temperature:g}")
    print("| episode | model | return (length) | probes | rank correlation with the plant | MPPI regret | cost bias |")
    print("|---|---|---|---|---|---|---|")
    for r in run(cfg, args.store, args.episodes, args.every, args.driver):
        print(f"| {r['episode']} | {r['model']} | {r['return']:.1f} ({r['length']}) | {r['probes']} | {r['rank_corr']:.3f} | "
              f"{r['regret']:.2f} | {r['bias']:+.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
