"""Train the Walker2d TRPO policy (sb3-contrib) with the rl-baselines3-zoo settings.

    .venv/bin/python scripts/train_walker.py --seed 0 --timesteps 1000000 [--out DIR] [--ship]

rl-baselines3-zoo ``hyperparams/trpo.yml`` (MuJoCo defaults, used for Walker2d):
normalize (observations and rewards), n_envs 2, MlpPolicy, batch_size 128,
n_steps 1024, gamma 0.99, gae_lambda 0.95, sub_sampling_factor 1, cg_max_steps 25,
cg_damping 0.1, n_critic_updates 20, learning_rate 1e-3, 1M steps.

Writes a run folder (``logs/train-walker-<time>`` by default): ``config.json``,
``metrics.jsonl`` (episode returns during training, the final evaluation),
``checkpoints/walker2d_trpo_<steps>.pt`` every ``--checkpoint-every`` steps, and
``walker2d_trpo.pt``: all in gpdyn's safe policy format (gpdyn.sim.policy). With
``--ship`` the final policy and the checkpoints are copied into ``gpdyn/policies/`` (package data).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gpdyn.device import set_threads
from gpdyn.runs import RunDir
from gpdyn.robots.walker import ENV_ID as WALKER_ENV_ID
from gpdyn.sim.policy import CHECKPOINT_DIR, SHIPPED_POLICY, evaluate_policy, export_sb3, load_policy

ZOO_SETTINGS = dict(
    batch_size=128,
    n_steps=1024,
    gamma=0.99,
    gae_lambda=0.95,
    sub_sampling_factor=1,
    cg_max_steps=25,
    cg_damping=0.1,
    n_critic_updates=20,
    learning_rate=1e-3,
)
N_ENVS = 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timesteps", type=int, default=1_000_000)
    ap.add_argument("--checkpoint-every", type=int, default=100_000, help="environment steps between checkpoints")
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--ship", action="store_true", help="copy the final policy and checkpoints into gpdyn/policies/ (package data)")
    args = ap.parse_args(argv)
    set_threads(1)

    from sb3_contrib import TRPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    config = {"env_id": WALKER_ENV_ID, "n_envs": N_ENVS, "normalize": True, "policy": "MlpPolicy", **ZOO_SETTINGS, **vars(args)}
    run = RunDir.create("train-walker", config, args.out)
    print(f"run folder: {run.path}", flush=True)
    ckpt_dir = run.path / "checkpoints"

    venv = VecNormalize(make_vec_env(WALKER_ENV_ID, n_envs=N_ENVS, seed=args.seed), gamma=ZOO_SETTINGS["gamma"])
    model = TRPO("MlpPolicy", venv, seed=args.seed, device="cpu", verbose=0, **ZOO_SETTINGS)
    t0 = time.time()

    class Checkpoints(BaseCallback):
        """Export a checkpoint every ``--checkpoint-every`` steps; log finished episodes."""

        def __init__(self) -> None:
            super().__init__()
            self.next_ckpt = args.checkpoint_every
            self.bar = tqdm(total=args.timesteps, unit="step", desc="TRPO Walker2d", mininterval=5)

        def _on_training_end(self) -> None:
            self.bar.close()

        def _on_step(self) -> bool:
            self.bar.update(N_ENVS)
            for info in self.locals["infos"]:
                if "episode" in info:
                    run.log(step=self.num_timesteps, episode_return=info["episode"]["r"], episode_length=info["episode"]["l"])
            if self.num_timesteps >= self.next_ckpt:
                path = ckpt_dir / f"walker2d_trpo_{self.next_ckpt}.pt"
                export_sb3(model, venv, path, meta={"timesteps": self.num_timesteps, "seed": args.seed})
                recent = [e["r"] for e in model.ep_info_buffer]
                print(
                    f"{self.num_timesteps:>8d} steps  {time.time() - t0:7.0f} s  mean return (last 100 ep) "
                    f"{np.mean(recent) if recent else float('nan'):8.1f}  -> {path.name}",
                    flush=True,
                )
                self.next_ckpt += args.checkpoint_every
            return True

    model.learn(total_timesteps=args.timesteps, callback=Checkpoints())
    train_s = time.time() - t0
    # sb3's own files too (pickles; kept in the run folder only, gpdyn never loads them)
    model.save(run.path / "sb3_model.zip")
    venv.save(str(run.path / "sb3_vecnormalize.pkl"))
    final = export_sb3(
        model, venv, run.path / SHIPPED_POLICY.name, meta={"timesteps": model.num_timesteps, "seed": args.seed}
    )
    returns = evaluate_policy(load_policy(final), episodes=args.eval_episodes, seed=10_000)
    run.log(final_eval_mean=returns.mean(), final_eval_std=returns.std(), final_eval_returns=returns, train_seconds=train_s)
    print(f"trained {model.num_timesteps} steps in {train_s:.0f} s; deterministic return over "
          f"{args.eval_episodes} episodes: {returns.mean():.1f} ± {returns.std():.1f} (min {returns.min():.1f})")
    if args.ship:
        CHECKPOINT_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copy2(final, SHIPPED_POLICY)
        for f in sorted(ckpt_dir.glob("*.pt")):
            shutil.copy2(f, CHECKPOINT_DIR / f.name)
        print(f"shipped to {SHIPPED_POLICY.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
