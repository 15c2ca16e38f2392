"""How far can an exact GP go on the SARCOS stream? Its hyperparameters from the first 1,024 rows (as
every streamed learner's), from 1,500 rows drawn from the whole stream (looking ahead: no online
learner can have them), or refitted on 1,500 of the rows seen at the first scored row and every 1,024
rows after it (what an online learner could do), with the SE-ARD kernel, SE-ARD plus a Bayesian linear and quadratic term
(``sq``), or SE-ARD plus a linear term and a term with the structure of rigid-body inverse dynamics
(``rb``).

    PYTHONPATH=. python docs/results/stream-sarcos-exact/kernel_bound.py data/sarcos_test.zarr se:init se:ahead sq:init sq:ahead rb:init
    PYTHONPATH=. python docs/results/stream-sarcos-exact/kernel_bound.py data/sarcos_test.zarr rb:ahead rb:refit
    PYTHONPATH=. python docs/results/stream-sarcos-exact/kernel_bound.py data/kuka_dev.zarr --problem kuka --rows 4449 se:init rb:init

Each condition: the hyperparameters by 100 Adam steps (lr 0.05) on the log marginal likelihood of their
rows, SE-ARD from the median-trick start of gpdyn's exact learner (``ExactOnlineGP``); the extended kernel
``SE-ARD + [x, 1]^T diag(v) [x', 1] + c ([x, 1]^T [x', 1])^2`` from the fitted SE-ARD values and 100
more steps on all of them. The ``rb`` kernel adds to SE-ARD and the linear term

    a2 SE(q, q'; l_q) (b0 + qdd^T diag(v) qdd' + qd^T diag(w) qd' + (qd^T diag(u) qd')^2),

the structure of ``tau = M(q) qdd + C(q, qd) qd + g(q)``: for each configuration ``q``, torque linear
in the accelerations and quadratic in the velocities, with coefficients smooth in ``q`` (inputs
``[q, qd, qdd]``, 7 each); all of its values by 100 Adam steps from the SE-ARD fit. Then the prequential rule of ``gpdyn replay --protocol stream`` (its
defaults: init 1,024 rows, chunks of 256, scored from row 2,048; gpdyn.gp.prequential.StreamScores):
every chunk predicted by the exact posterior of all rows before it, with the hyperparameters kept.
"""
import argparse
import math
import time

import torch

from gpdyn.data.problems import load_problem
from gpdyn.gp import make_learner
from gpdyn.gp.prequential import StreamProtocol, StreamScores

torch.set_num_threads(1)
PROTOCOL = StreamProtocol()
AHEAD_ROWS, ITERS, LR = 1500, 100, 0.05
REFIT_ROWS = 1024  # "refit": rows between refits of the hyperparameters
RB_JITTER = 1e-6  # with the rb kernel's noise on the diagonal: its Gram matrix can be near singular


def se_fit(x, y):
    """SE-ARD lengthscale [P, D], amplitude [P], noise [P] fitted by gpdyn's exact learner on x, y."""
    gp = make_learner("exact", x.shape[1], y.shape[1], max_points=len(x), refit_every=1, refit_iters=ITERS, lr=LR,
                      device="cpu", dtype=torch.float64, seed=0)
    gp.observe(x, y)
    gp.step(x, y)  # refit_every=1: ITERS Adam steps on all observed rows
    return {k: v.clone() for k, v in gp.hp.as_dict().items()}


def gram(p, j, a, b, kernel):
    """Kernel matrix of output j between a and b (kernel "se", "sq" or "rb")."""
    ls = p["lengthscale"][j]
    d2 = torch.cdist(a / ls, b / ls).pow(2)
    k = p["amplitude"][j] * torch.exp(-0.5 * d2)
    if kernel != "se":
        fa, fb = torch.cat([a, torch.ones_like(a[:, :1])], 1), torch.cat([b, torch.ones_like(b[:, :1])], 1)
        k = k + (fa * p["linear"][j]) @ fb.T
    if kernel == "sq":
        k = k + p["quadratic"][j] * (fa @ fb.T).pow(2)
    if kernel == "rb":
        (qa, va, aa), (qb, vb, ab) = a.split(7, dim=1), b.split(7, dim=1)
        kq = torch.exp(-0.5 * torch.cdist(qa / p["lq"][j], qb / p["lq"][j]).pow(2))
        poly = p["b0"][j] + (aa * p["v"][j]) @ ab.T + (va * p["w"][j]) @ vb.T + ((va * p["u"][j]) @ vb.T).pow(2)
        k = k + p["a2"][j] * kq * poly
    return k


def extended_fit(x, y, se, kernel):
    """The extended kernel's values, from the SE-ARD fit plus small linear and quadratic variances
    (``sq``), or plus a small linear variance and the rigid-body term sharing half of SE-ARD's
    amplitude (``rb``)."""
    d, outs = x.shape[1], y.shape[1]
    f64 = {"dtype": torch.float64}
    raw = {"lengthscale": se["lengthscale"].log(), "amplitude": se["amplitude"].log(), "noise": se["noise"].log(),
           "linear": torch.full((outs, d + 1), -4.0, **f64)}
    if kernel == "sq":
        raw["quadratic"] = torch.full((outs,), -6.0, **f64)
    else:
        half = (0.5 * se["amplitude"]).log()
        raw.update(amplitude=half.clone(), a2=half.clone(), lq=torch.full((outs, 7), math.log(2.0), **f64),
                   b0=torch.zeros(outs, **f64), v=torch.full((outs, 7), -2.0, **f64), w=torch.full((outs, 7), -2.0, **f64),
                   u=torch.full((outs, 7), -2.0, **f64))
    for v in raw.values():
        v.requires_grad_(True)
    opt = torch.optim.Adam(raw.values(), lr=LR)
    eye = torch.eye(len(x), dtype=torch.float64)
    for _ in range(ITERS):
        opt.zero_grad()
        p = {k: v.exp() for k, v in raw.items()}
        loss = 0.0
        for j in range(outs):
            chol = torch.linalg.cholesky(gram(p, j, x, x, kernel) + (p["noise"][j] + RB_JITTER * (kernel == "rb")) * eye)
            z = torch.linalg.solve_triangular(chol, y[:, j : j + 1], upper=False)
            loss = loss + 0.5 * z.pow(2).sum() + chol.diagonal().log().sum()
        (loss / len(x)).backward()
        opt.step()
    return {k: v.detach().exp() for k, v in raw.items()}


def fit(x, y, kernel):
    p = se_fit(x, y)
    return p if kernel == "se" else extended_fit(x, y, p, kernel)


def stream(x, y, hyperparameters, kernel):
    """Prequential scores of the exact posterior, the chunk from row ``start`` on with hyperparameters
    ``hyperparameters(start)``."""
    scores = StreamScores(y.shape[1], torch.device("cpu"))
    for start in range(PROTOCOL.init_rows, len(x), PROTOCOL.chunk):
        if start < PROTOCOL.warm_rows:
            continue  # learned before anything is scored: the exact posterior below conditions on every earlier row
        p = hyperparameters(start)
        end = min(start + PROTOCOL.chunk, len(x))
        seen, new = x[:start], x[start:end]
        mean, var = torch.empty(end - start, y.shape[1], dtype=torch.float64), torch.empty_like(y[start:end])
        for j in range(y.shape[1]):
            chol = torch.linalg.cholesky(gram(p, j, seen, seen, kernel) + (p["noise"][j] + RB_JITTER * (kernel == "rb")) * torch.eye(start, dtype=torch.float64))
            cross = gram(p, j, new, seen, kernel)
            mean[:, j] = (cross @ torch.cholesky_solve(y[:start, j : j + 1], chol))[:, 0]
            v = torch.linalg.solve_triangular(chol, cross.T, upper=False)
            prior = torch.diagonal(gram(p, j, new, new, kernel))
            var[:, j] = prior - v.pow(2).sum(0) + p["noise"][j]
        scores.add(mean, var, y[start:end])
    return scores.summary()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store")
    parser.add_argument("conditions", nargs="+", help="KERNEL:ROWS, KERNEL se, sq or rb, ROWS init, ahead or refit")
    parser.add_argument("--problem", default="arm", help="an arm problem, inputs [q, qd, qdd] (default arm)")
    parser.add_argument("--rows", type=int, help="the stream's first ROWS rows only (default all)")
    args = parser.parse_args()
    problem = load_problem(args.store, args.problem, protocol="stream", progress=False)
    x, y = problem.tensors("train", "cpu", torch.float64)
    x, y = x[: args.rows], y[: args.rows]
    ahead = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))[:AHEAD_ROWS]
    for condition in args.conditions:
        kernel, rows = condition.split(":")
        t0 = time.process_time()
        if rows == "refit":  # refitted on AHEAD_ROWS of the rows seen, at the first scored row and every REFIT_ROWS
            fits = {}

            def hyperparameters(start, kernel=kernel, fits=fits):
                at = PROTOCOL.warm_rows + (start - PROTOCOL.warm_rows) // REFIT_ROWS * REFIT_ROWS
                if at not in fits:
                    seen = torch.randperm(at, generator=torch.Generator().manual_seed(at))[:AHEAD_ROWS]
                    fits[at] = fit(x[seen], y[seen], kernel)
                return fits[at]
        else:
            fit_rows = torch.arange(PROTOCOL.init_rows) if rows == "init" else ahead
            kept = fit(x[fit_rows], y[fit_rows], kernel)

            def hyperparameters(start, kept=kept):
                return kept
        s = stream(x, y, hyperparameters, kernel)
        nmse, cov = torch.tensor(s["nmse"]), torch.tensor(s["coverage"])
        print(f"{condition}: nmse {nmse.mean():.4f} coverage {cov.mean():.3f} per output "
              f"{[round(v, 3) for v in s['nmse']]} cpu {time.process_time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
