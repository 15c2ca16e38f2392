"""Learned Walker2d models under the spline sampler: one-step error and sample ranking against the true model.

    .venv/bin/python scripts/sampler_learned_model.py svdgp:cpu:600 exact:small:0 svi:cpu:600

Each argument is LEARNER:PRESET:PRETRAIN_ITERATIONS. Data: the true-model sampler's own
walking (seeds 0-7, 1,000 steps; exploration noise 0.1 on the executed action) for
training, seeds 50-51 (400 steps) held out. Printed per learner: the held-out one-step
nMSE of the velocity change (mean over the 9 joints) and the Spearman correlation between
the learned and the true model's costs of the sampler's 20 spline samples at 20 held-out
states (1.0: the learned model ranks the samples as the plant does). docs/control.md
records a run.
"""
import sys, time, numpy as np, torch
from scipy.stats import spearmanr
from gpdyn.sim.loop import run_episode
from gpdyn.control.spline_sampling import SamplerConfig, SamplingController, SplineSampler, LearnedForward, split_state
from gpdyn.control.dynamics import LearnedDynamics
from gpdyn.data.problems import Normalizer
from gpdyn.gp import make_learner
from gpdyn.gp.training import pretrain_learner
from gpdyn.robots.walker import DT, LAYOUT, make_env
from gpdyn.robots.legged import WalkingCost, state_rows
torch.set_num_threads(1)
noise = 0.1
class Noisy(SamplingController):
    def act(self, obs, info):
        a, r = super().act(obs, info)
        return np.clip(a + noise * self.rng.standard_normal(a.shape), -1, 1), r
def collect(seeds, steps):
    X, Y, S = [], [], []
    for seed in seeds:
        env = make_env(); c = Noisy(WalkingCost(), DT, SamplerConfig(), seed=seed); c.rng = np.random.default_rng(seed)
        r = run_episode(env, c, steps=steps, reset_seed=seed, rows=state_rows, next_rows=("qpos", "qvel")).rows
        s = np.concatenate([r["qpos"], r["qvel"]], 1)
        X.append(np.concatenate([s[:, 1:9], s[:, 9:], r["action"]], 1)); Y.append(r["next_qvel"] - r["qvel"]); S.append(s)
    return np.concatenate(X), np.concatenate(Y), np.concatenate(S)
t0 = time.process_time()
X, Y, S = collect(range(8), 1000); Xt, Yt, St = collect([50, 51], 400)
print("rows", len(X), len(Xt), "collect cpu", round(time.process_time() - t0))
norm = Normalizer(X.mean(0), X.std(0) + 1e-8, Y.mean(0), Y.std(0) + 1e-8)
x = torch.as_tensor(norm.normalize_x(X)); y = torch.as_tensor(norm.normalize_y(Y))
env = make_env(); env.reset(seed=0); model = env.unwrapped.model
for name, preset, iters in [(a, b, int(c)) for a, b, c in (s.split(":") for s in sys.argv[1:])]:
    learner = make_learner(name, 23, 9, preset=preset, rows=len(x), dtype=torch.float64)
    t0 = time.process_time(); pretrain_learner(learner, x, y, iterations=iters, progress=False); tp = time.process_time() - t0
    dyn = LearnedDynamics.from_learner(learner, norm, LAYOUT, target="change")
    with torch.no_grad():
        pred = dyn.model.predict_mean(torch.as_tensor(Xt)).numpy()
    nmse = ((pred - (Yt + Xt[:, 8:17])) ** 2).mean(0) / Yt.var(0)
    # ranking: at held-out states, the sampler's samples scored by the true and the learned model
    cfg = SamplerConfig(); cost = WalkingCost()
    true_s = SplineSampler(model, cost, DT, -1.0, 1.0, cfg, seed=1)
    learned_f = LearnedForward(dyn, 9, cfg.stride)
    rhos = []
    rng = np.random.default_rng(0)
    for i in rng.choice(len(St), 20, replace=False):
        knots = rng.uniform(-1, 1, (1, cfg.knots, 6)) * 0.3 + 0.3 * rng.standard_normal((cfg.samples, cfg.knots, 6))
        ctrl = np.einsum("hn,knu->khu", true_s.spline, np.clip(knots, -1, 1))
        qt, vt = split_state(true_s.rollout(St[i], ctrl), 9)
        ql, vl = split_state(learned_f.rollout(St[i], ctrl), 9)
        rhos.append(spearmanr(cost(qt, vt, ctrl), cost(ql, vl, ctrl)).statistic)
    print(name, preset, iters, "pretrain cpu", round(tp), "held-out one-step nMSE of the change (mean over joints)",
          round(float(nmse.mean()), 3), "Spearman of sample costs", round(float(np.nanmean(rhos)), 2), flush=True)
