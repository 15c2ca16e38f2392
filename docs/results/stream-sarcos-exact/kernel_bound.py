"""How far can an exact GP go on the SARCOS stream? Its hyperparameters from the first 1,024 rows (as
every streamed learner's) or from 1,500 rows drawn from the whole stream (looking ahead: no online
learner can have them), with the SE-ARD kernel or SE-ARD plus a Bayesian linear and quadratic term.

    PYTHONPATH=. python docs/results/stream-sarcos-exact/kernel_bound.py data/sarcos_test.zarr se:init se:ahead sq:init sq:ahead

Each condition: the hyperparameters by 100 Adam steps (lr 0.05) on the log marginal likelihood of their
rows, SE-ARD from the median-trick start of gpdyn's exact learner (``ExactOnlineGP``); the extended kernel
``SE-ARD + [x, 1]^T diag(v) [x', 1] + c ([x, 1]^T [x', 1])^2`` from the fitted SE-ARD values and 100
more steps on all of them. Then the prequential rule of ``gpdyn replay --protocol stream`` (its
defaults: init 1,024 rows, chunks of 256, scored from row 2,048; gpdyn.gp.prequential.StreamScores):
every chunk predicted by the exact posterior of all rows before it, with the hyperparameters kept.
"""
import sys
import time

import torch

from gpdyn.data.problems import load_problem
from gpdyn.gp import make_learner
from gpdyn.gp.prequential import StreamProtocol, StreamScores

torch.set_num_threads(1)
PROTOCOL = StreamProtocol()
AHEAD_ROWS, ITERS, LR = 1500, 100, 0.05


def se_fit(x, y):
    """SE-ARD lengthscale [P, D], amplitude [P], noise [P] fitted by gpdyn's exact learner on x, y."""
    gp = make_learner("exact", x.shape[1], y.shape[1], max_points=len(x), refit_every=1, refit_iters=ITERS, lr=LR,
                      device="cpu", dtype=torch.float64, seed=0)
    gp.observe(x, y)
    gp.step(x, y)  # refit_every=1: ITERS Adam steps on all observed rows
    return {k: v.clone() for k, v in gp.hp.as_dict().items()}


def gram(p, j, a, b, extended):
    """Kernel matrix of output j between a and b."""
    ls = p["lengthscale"][j]
    d2 = torch.cdist(a / ls, b / ls).pow(2)
    k = p["amplitude"][j] * torch.exp(-0.5 * d2)
    if extended:
        fa, fb = torch.cat([a, torch.ones_like(a[:, :1])], 1), torch.cat([b, torch.ones_like(b[:, :1])], 1)
        k = k + (fa * p["linear"][j]) @ fb.T + p["quadratic"][j] * (fa @ fb.T).pow(2)
    return k


def extended_fit(x, y, se):
    """The extended kernel's values, from the SE-ARD fit plus small linear and quadratic variances."""
    d, outs = x.shape[1], y.shape[1]
    raw = {"lengthscale": se["lengthscale"].log(), "amplitude": se["amplitude"].log(), "noise": se["noise"].log(),
           "linear": torch.full((outs, d + 1), -4.0, dtype=torch.float64), "quadratic": torch.full((outs,), -6.0, dtype=torch.float64)}
    for v in raw.values():
        v.requires_grad_(True)
    opt = torch.optim.Adam(raw.values(), lr=LR)
    eye = torch.eye(len(x), dtype=torch.float64)
    for _ in range(ITERS):
        opt.zero_grad()
        p = {k: v.exp() for k, v in raw.items()}
        loss = 0.0
        for j in range(outs):
            chol = torch.linalg.cholesky(gram(p, j, x, x, True) + p["noise"][j] * eye)
            z = torch.linalg.solve_triangular(chol, y[:, j : j + 1], upper=False)
            loss = loss + 0.5 * z.pow(2).sum() + chol.diagonal().log().sum()
        (loss / len(x)).backward()
        opt.step()
    return {k: v.detach().exp() for k, v in raw.items()}


def stream(x, y, p, extended):
    """Prequential scores of the exact posterior with hyperparameters p kept."""
    scores = StreamScores(y.shape[1], torch.device("cpu"))
    for start in range(PROTOCOL.init_rows, len(x), PROTOCOL.chunk):
        if start < PROTOCOL.warm_rows:
            continue  # learned before anything is scored: the exact posterior below conditions on every earlier row
        end = min(start + PROTOCOL.chunk, len(x))
        seen, new = x[:start], x[start:end]
        mean, var = torch.empty(end - start, y.shape[1], dtype=torch.float64), torch.empty_like(y[start:end])
        for j in range(y.shape[1]):
            chol = torch.linalg.cholesky(gram(p, j, seen, seen, extended) + p["noise"][j] * torch.eye(start, dtype=torch.float64))
            cross = gram(p, j, new, seen, extended)
            mean[:, j] = (cross @ torch.cholesky_solve(y[:start, j : j + 1], chol))[:, 0]
            v = torch.linalg.solve_triangular(chol, cross.T, upper=False)
            prior = torch.diagonal(gram(p, j, new, new, extended))
            var[:, j] = prior - v.pow(2).sum(0) + p["noise"][j]
        scores.add(mean, var, y[start:end])
    return scores.summary()


def main():
    problem = load_problem(sys.argv[1], "arm", protocol="stream", progress=False)
    x, y = problem.tensors("train", "cpu", torch.float64)
    ahead = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))[:AHEAD_ROWS]
    for condition in sys.argv[2:]:
        kernel, rows = condition.split(":")
        fit_rows = torch.arange(PROTOCOL.init_rows) if rows == "init" else ahead
        t0 = time.process_time()
        p = se_fit(x[fit_rows], y[fit_rows])
        if kernel == "sq":
            p = extended_fit(x[fit_rows], y[fit_rows], p)
        s = stream(x, y, p, kernel == "sq")
        nmse, cov = torch.tensor(s["nmse"]), torch.tensor(s["coverage"])
        print(f"{condition}: nmse {nmse.mean():.4f} coverage {cov.mean():.3f} per output "
              f"{[round(v, 3) for v in s['nmse']]} cpu {time.process_time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
