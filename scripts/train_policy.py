"""Train a legged-robot TRPO policy (sb3-contrib) with the rl-baselines3-zoo settings.

    .venv/bin/python scripts/train_policy.py --env Hopper-v5 --seed 0 --timesteps 1000000 [--out DIR] [--ship]

``--env`` is ``Walker2d-v5`` or ``Hopper-v5``. Both use rl-baselines3-zoo
``hyperparams/trpo.yml``'s MuJoCo settings: normalize (observations and rewards),
n_envs 2, MlpPolicy, batch_size 128, n_steps 1024, gamma 0.99, gae_lambda 0.95,
sub_sampling_factor 1, cg_max_steps 25, cg_damping 0.1, n_critic_updates 20,
learning_rate 1e-3, 1M steps.

Writes a run folder (``logs/train-<walker|hopper>-<time>`` by default): ``config.json``,
``metrics.jsonl`` (episode returns during training, the evaluations),
``checkpoints/<stem>_<steps>.pt`` every ``--checkpoint-every`` steps and ``<stem>.pt``
(``walker2d_trpo`` / ``hopper_trpo``), all in gpdyn's safe policy format with the env id
recorded; sb3's own zip and VecNormalize pickle for the final model and each checkpoint
(``sb3/``; gpdyn never loads these). At the end the final policy and each checkpoint are
evaluated with sb3 itself: deterministic actions, the VecNormalize statistics frozen,
``--eval-episodes`` episodes from reset seeds 10000, 10001, ...
With ``--ship`` the final policy and the checkpoints are copied into ``gpdyn/policies/``
(package data; checkpoints under ``gpdyn/policies/checkpoints/``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

import gpdyn
from gpdyn.device import set_threads
from gpdyn.robots.policy import episode_returns, export_sb3
from gpdyn.runs import RunDir

#: gpdyn's package data folder of shipped policies (checkpoints in its ``checkpoints/``)
POLICY_DIR = Path(gpdyn.__file__).resolve().parent / "policies"
CHECKPOINT_DIR = POLICY_DIR / "checkpoints"

#: gymnasium id -> (run folder job name, policy file stem)
ENVS = {
    "Walker2d-v5": ("walker", "walker2d_trpo"),
    "Hopper-v5": ("hopper", "hopper_trpo"),
}
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
EVAL_SEED = 10_000


def evaluate_sb3(model_zip: Path, vecnormalize_pkl: Path, env_id: str, episodes: int, seed: int) -> np.ndarray:
    """Undiscounted returns of deterministic episodes (reset seeds ``seed + i``), VecNormalize frozen."""
    import gymnasium as gym
    from sb3_contrib import TRPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    model = TRPO.load(model_zip, device="cpu")
    norm = VecNormalize.load(str(vecnormalize_pkl), DummyVecEnv([lambda: gym.make(env_id)]))
    norm.training, norm.norm_reward = False, False
    try:
        return episode_returns(gym.make(env_id), lambda obs: model.predict(norm.normalize_obs(obs), deterministic=True)[0],
                               episodes, seed)
    finally:
        norm.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", required=True, help=f"gymnasium id: {' or '.join(ENVS)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timesteps", type=int, default=1_000_000)
    ap.add_argument("--checkpoint-every", type=int, default=100_000, help="environment steps between checkpoints")
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None, help="run folder (default logs/train-<walker|hopper>-<time>)")
    ap.add_argument("--ship", action="store_true", help="copy the final policy and checkpoints into gpdyn/policies/ (package data)")
    args = ap.parse_args(argv)
    if args.env not in ENVS:
        ap.error(f"--env {args.env!r}: not a policy this script trains; choose {' or '.join(map(repr, ENVS))}")
    for name in ("timesteps", "checkpoint_every", "eval_episodes"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= 1")
    job, stem = ENVS[args.env]
    set_threads(1)

    from sb3_contrib import TRPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    config = {"env_id": args.env, "n_envs": N_ENVS, "normalize": True, "policy": "MlpPolicy", **ZOO_SETTINGS,
              **{k: v for k, v in vars(args).items() if k != "env"}}
    run = RunDir.create(f"train-{job}", config, args.out)
    print(f"run folder: {run.path}", flush=True)
    ckpt_dir, sb3_dir = run.path / "checkpoints", run.path / "sb3"
    sb3_dir.mkdir()

    venv = VecNormalize(make_vec_env(args.env, n_envs=N_ENVS, seed=args.seed), gamma=ZOO_SETTINGS["gamma"])
    model = TRPO("MlpPolicy", venv, seed=args.seed, device="cpu", verbose=0, **ZOO_SETTINGS)
    t0, cpu0 = time.time(), time.process_time()
    # (steps, gpdyn file, sb3 zip, VecNormalize pickle) of each checkpoint
    saved: list[tuple[int, Path, Path, Path]] = []

    def save(steps: int, path: Path, tag: str) -> tuple[int, Path, Path, Path]:
        meta = {"timesteps": model.num_timesteps, "seed": args.seed}
        files = (steps, export_sb3(model, venv, path, args.env, meta), sb3_dir / f"{tag}.zip", sb3_dir / f"{tag}_vecnormalize.pkl")
        model.save(files[2])
        venv.save(str(files[3]))
        return files

    class Checkpoints(BaseCallback):
        """Export a checkpoint every ``--checkpoint-every`` steps; log finished episodes."""

        def __init__(self) -> None:
            super().__init__()
            self.next_ckpt = args.checkpoint_every
            self.bar = tqdm(total=args.timesteps, unit="step", desc=f"TRPO {args.env}", mininterval=30)

        def _on_training_end(self) -> None:
            self.bar.close()

        def _on_step(self) -> bool:
            self.bar.update(N_ENVS)
            for info in self.locals["infos"]:
                if "episode" in info:
                    run.log(step=self.num_timesteps, episode_return=info["episode"]["r"], episode_length=info["episode"]["l"])
            if self.num_timesteps >= self.next_ckpt:
                name = f"{stem}_{self.next_ckpt}"
                saved.append(save(self.next_ckpt, ckpt_dir / f"{name}.pt", name))
                recent = [e["r"] for e in model.ep_info_buffer]
                print(
                    f"{self.num_timesteps:>8d} steps  {time.time() - t0:7.0f} s  mean return (last 100 ep) "
                    f"{np.mean(recent) if recent else float('nan'):8.1f}  -> {name}.pt",
                    flush=True,
                )
                self.next_ckpt += args.checkpoint_every
            return True

    model.learn(total_timesteps=args.timesteps, callback=Checkpoints())
    train_s, train_cpu_s = time.time() - t0, time.process_time() - cpu0
    _, final, final_zip, final_pkl = save(model.num_timesteps, run.path / f"{stem}.pt", "final")
    run.log(train_seconds=train_s, train_cpu_seconds=train_cpu_s, timesteps=model.num_timesteps)
    print(f"trained {model.num_timesteps} steps in {train_s:.0f} s wall, {train_cpu_s:.0f} s CPU", flush=True)

    print(f"evaluation: deterministic, {args.eval_episodes} episodes, reset seeds {EVAL_SEED}+", flush=True)
    for steps, path, zip_file, pkl_file in [*saved, (model.num_timesteps, final, final_zip, final_pkl)]:
        returns = evaluate_sb3(zip_file, pkl_file, args.env, args.eval_episodes, EVAL_SEED)
        run.log(eval_policy=path.name, eval_steps=steps, eval_mean=returns.mean(), eval_std=returns.std(),
                eval_min=returns.min(), eval_returns=returns)
        print(f"  {path.name:<28s} mean {returns.mean():8.1f}  std {returns.std():7.1f}  min {returns.min():8.1f}", flush=True)
    if args.ship:
        CHECKPOINT_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copy2(final, POLICY_DIR / final.name)
        for _, path, _, _ in saved:
            shutil.copy2(path, CHECKPOINT_DIR / path.name)
        print(f"shipped {final.name} and {len(saved)} checkpoints to {POLICY_DIR}")
    run.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
