"""``gpdyn bench mpc``: MPC planning steps per CPU second with every learned Walker2d model.

One planning step is one :meth:`~gpdyn.control.mpc.Planner.plan` call of MPPI: K sampled
sequences of H steps through the learned walker-1 dynamics (H batched predictions on K
points), the Walker2d cost and the TRPO proposal on half of the samples. Each registered
learner is built at one preset of its size table (default ``"small"``, the size the
control runs use, ``gpdyn control walker --scale small``) with every basis function in
place, from random normalised inputs (the cost of a prediction does not depend on the
values), and its outputs are then given different length scales, as training leaves
them: a fresh model's outputs share their starting hyperparameters and points, and the
learners would then build one kernel for all of them (``fresh`` rows show that case). The
``svdgp (shared kernel)`` row is SVDGP with ``shared_kernel=True``: one length-scale set and
one set of bases for all outputs by construction, so after training its outputs differ in
their amplitudes (given distinct ones here) and coefficients only, and it keeps the one
kernel (:mod:`gpdyn.gp.svdgp`, docs/results/svdgp-shared-kernel/). The ``wiski (compiled
mean)`` row (CPU only) is WISKI with ``compiled_mean=True``: the learned dynamics' whole
model step as one compiled program around its dense kernel
(:func:`gpdyn.gp.wiski.additive_mean_dense`, :meth:`gpdyn.control.dynamics.LearnedDynamics.predict_mean`);
the ``compiled planner`` rows also run the cost and the TRPO proposal compiled
(``MPCConfig(compiled=True)``, :func:`gpdyn.compiled.traced`).

Each model plans twice: with the cost ignoring the variance (``uncertainty="mean"``: the
planner asks the learner's mean-only path, :meth:`~gpdyn.gp.base.Learner.predict_mean`) and
with a variance penalty (``"penalty"``, mean and variance). Times are seconds per planning
step after one warm-up step (:func:`gpdyn.device.seconds`): the process's CPU time on the
CPU, so that other jobs on a shared machine do not count, wall time between device syncs
on a GPU; ``gpdyn --threads`` sets torch's thread count (default 1).

In the same run it measures what bounds the rates:

- the planner alone (an identity model): sampling, the proposal and the cost;
- float32 matrix multiply (sgemm) throughput and ``exp2`` throughput, and SVDGP's mean
  path against them (per-output length scales and ``shared_kernel``): a mean at N points
  with M basis functions builds one ``2 N M D``-flop feature matmul and ``N M`` ``exp2``
  per distinct kernel and one ``2 N M``-flop matvec per output; its share of sgemm (the
  flops done), with the fused native kernel (:mod:`gpdyn.gp.native`) and on the torch
  path, and the torch path's share of its floor (the flops at sgemm speed plus the
  ``exp2`` at torch's rate);
- WISKI's mean prediction against a plain 16-weight gather: ``torch.gather`` of 16 indices
  per point and output from a ``[P, m]`` table, times weights, summed, on the same N.

With ``peer="pytorch-mppi"`` (:func:`peer_comparison`) it also runs pytorch-mppi's MPPI
(Williams et al. 2017, Alg. 2; a benchmark-only peer, never a dependency:
``bash scripts/install_peer.sh pytorch-mppi``) beside gpdyn's own :class:`~gpdyn.control.mpc.MPPI`
on the same dynamics, cost, K, H, noise, temperature and action box, with no proposal (the
peer has none), timed alternately in one run: a trivial walker-sized model
(:class:`DoubleIntegrator`, where the planner's own overhead is all there is) and each
learned model asked for (its mean-only path). The cost is :class:`TrackingCost`, a function
of the next state and the action alone, which is what the peer's ``running_cost(state,
action)`` sees.

Walker2d real time is 125 control steps per second (dt = 8 ms).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpdyn.control.dynamics import LearnedDynamics
from gpdyn.control.mpc import MPCConfig, make_planner
from gpdyn.data.problems import Normalizer
from gpdyn.device import device_name, resolve_device, seconds, set_threads
from gpdyn.errors import InputError
from gpdyn.gp import LEARNERS, PRESETS, make_learner
from gpdyn.gp.base import Learner
from gpdyn.gp.kernels import PREDICT_BLOCK_ELEMENTS
from gpdyn.robots.walker import DT, LAYOUT, NQ, NU, NV, NX, WALKER
from gpdyn.robots.legged import ACTION_HIGH, ACTION_LOW, TorchPolicy
from gpdyn.runs import RunDir

log = logging.getLogger(__name__)

REAL_TIME_HZ = 1.0 / DT  # 125 control steps per second
BENCH_MODELS = tuple(LEARNERS)  # every registered learner
#: points the residual learner's GP holds in the bench: between the half window it keeps
#: after a rebuild and its full window (400 at every preset)
RESIDUAL_POINTS = 300
#: rows of the random data that fill the bases
FILL_ROWS = 2048
#: extra rows of the planning table: (label, learner, its options), benched with distinct outputs
OPTION_VARIANTS = {"svdgp": [("svdgp (shared kernel)", {"shared_kernel": True})],
                   "wiski": [("wiski (compiled mean)", {"compiled_mean": True}),
                             ("wiski (compiled mean, compiled planner)", {"compiled_mean": True, "compiled": True})]}
#: options of a CPU-only path (their rows are left out on a GPU)
CPU_ONLY_OPTIONS = {"compiled_mean", "compiled"}
#: options of the planner (MPCConfig) rather than of the learner
PLANNER_OPTIONS = {"compiled"}
#: benchmark-only peer planners and how to install each without replacing torch
PEERS = {"pytorch-mppi": "bash scripts/install_peer.sh pytorch-mppi   (pip install --no-deps pytorch-mppi==0.9.1 "
                         "arm-pytorch-utilities==0.5.0 pytorch-seed==0.2.0)"}
#: the trivial model of the peer comparison
TRIVIAL = "double-integrator"
#: timed planning steps of the trivial model at least (a step takes milliseconds)
TRIVIAL_REPEATS = 10


def _distinct_outputs(learner: Learner, gen: torch.Generator) -> None:
    """Give each output its own length scales (log-normal, 10 %), as training leaves them; a
    shared-kernel SVDGP has one set (all its outputs get the first output's factor) and its
    outputs get their own amplitudes instead (log-normal, 30 %), which training leaves apart."""
    from gpdyn.gp.exact import ExactOnlineGP
    from gpdyn.gp.residual import ResidualGP
    from gpdyn.gp.variational import VariationalLearner

    p, d = learner.output_dim, learner.input_dim
    factor = torch.exp(0.1 * torch.randn(p, d, generator=gen, dtype=torch.float64)).to(learner.device, learner.dtype)
    with torch.no_grad():
        if isinstance(learner, VariationalLearner):
            log_ls = learner.params["log_ls"]
            log_ls.add_(torch.log(factor)[: log_ls.shape[0]])
            if learner.shared_kernel:
                learner.params["log_amp"].add_((0.3 * torch.randn(p, generator=gen, dtype=torch.float64)).to(log_ls))
            learner._cache = None
        elif isinstance(learner, ExactOnlineGP):
            learner.set_hyperparameters(lengthscale=learner.hp.lengthscale.detach() * factor)
        elif isinstance(learner, ResidualGP):
            _distinct_outputs(learner.prior, gen)
            if isinstance(learner.residual, ExactOnlineGP):
                _distinct_outputs(learner.residual, gen)


def filled_learner(name: str, device: torch.device, dtype: torch.dtype, preset: str = "small", seed: int = 0,
                   distinct: bool = True, options: dict[str, Any] | None = None) -> Learner:
    """A walker-1 learner at ``preset`` with every basis function in place (random inputs);
    ``distinct``: each output with its own length scales (:func:`_distinct_outputs`);
    ``options``: learner options over the preset (e.g. ``{"shared_kernel": True}``)."""
    d, p = LAYOUT.input_dim, LAYOUT.nv
    gen = torch.Generator().manual_seed(seed)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, d, generator=gen, dtype=dtype).to(device)
        return x, torch.randn(n, p, generator=gen, dtype=dtype).to(device)

    if name == "residual":  # a frozen SVDGP of the same preset plus the residual GP of control
        prior = filled_learner("svdgp", device, dtype, preset, seed, distinct=False)
        x, y = batch(RESIDUAL_POINTS)
        learner = make_learner("residual", d, p, preset=preset, prior=prior, reference_x=x, device=device, dtype=dtype,
                               seed=seed)
        learner.observe(x, y)
    else:
        learner = make_learner(name, d, p, preset=preset, device=device, dtype=dtype, seed=seed, **(options or {}))
        if learner.can("point_limit"):  # the exact GP at its limit
            learner.observe(*batch(learner.room()))
        else:
            if learner.can("n_delta"):
                learner.set_n_delta(FILL_ROWS)  # fill the bases in a few rounds
            rounds = max(1, -(-max(learner.basis_capacity.values(), default=FILL_ROWS) // FILL_ROWS))
            for _ in range(rounds):
                learner.observe(*batch(FILL_ROWS))
    if distinct:
        _distinct_outputs(learner, gen)
    return learner


def filled_model(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0, preset: str = "small",
                 distinct: bool = True, options: dict[str, Any] | None = None) -> LearnedDynamics:
    """Walker dynamics on :func:`filled_learner` (identity normaliser, delta target)."""
    d, p = LAYOUT.input_dim, LAYOUT.nv
    learner = filled_learner(name, device, dtype, preset, seed, distinct, options)
    normalizer = Normalizer(np.zeros(d), np.ones(d), np.zeros(p), np.ones(p))
    return LearnedDynamics.from_learner(learner, normalizer, LAYOUT)


def _state(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    state = torch.zeros(NX, device=device, dtype=dtype)
    state[1] = 1.25  # standing height: the rollouts stay healthy
    return state


def planning_seconds(dynamics: Any, proposal: TorchPolicy, cfg: MPCConfig, repeats: int, device: torch.device,
                     dtype: torch.dtype, seed: int = 0) -> float:
    """Seconds per MPPI planning step of ``dynamics`` (after one warm-up step; :func:`gpdyn.device.seconds`)."""
    planner = make_planner("mppi", dynamics, WALKER.cost(), [ACTION_LOW] * NU, [ACTION_HIGH] * NU, cfg, proposal=proposal,
                           device=device, dtype=dtype, seed=seed)
    state = _state(device, dtype)
    return seconds(lambda: planner.plan(state), device, repeats, warmup=1)


def basis_sizes(learner: Learner) -> str:
    """The sizes that set a prediction's cost, e.g. ``alpha 512, beta 64``."""
    from gpdyn.gp.exact import ExactOnlineGP
    from gpdyn.gp.residual import ResidualGP

    if isinstance(learner, ResidualGP):
        return f"prior ({basis_sizes(learner.prior)}) + {learner.residual.n} points"
    if isinstance(learner, ExactOnlineGP):
        return f"{learner.n} points"
    counts = learner.basis_counts
    if counts:
        return ", ".join(f"{k} {v}" for k, v in counts.items())
    sizes = getattr(learner, "num_inducing", None)
    return f"m = {sizes}" if sizes is not None else ""


def sgemm_gflops(dtype: torch.dtype, repeats: int = 5, n: int = 2048) -> float:
    """Matrix-multiply throughput (GFLOP/s of CPU time) of two ``n x n`` matrices in ``dtype``."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen, dtype=dtype)
    b = torch.randn(n, n, generator=gen, dtype=dtype)
    out = torch.empty(n, n, dtype=dtype)
    return 2.0 * n**3 / seconds(lambda: torch.mm(a, b, out=out), "cpu", repeats, warmup=1) / 1e9


def exp2_rate(dtype: torch.dtype, repeats: int = 5) -> float:
    """``exp2`` evaluations per CPU second (G/s) on one cache-sized block, as the prediction
    kernel runs them (:data:`gpdyn.gp.kernels.PREDICT_BLOCK_ELEMENTS` entries, out of place)."""
    gen = torch.Generator().manual_seed(0)
    src = -torch.rand(PREDICT_BLOCK_ELEMENTS, generator=gen, dtype=dtype) * 20.0  # kernel entries: exponents <= 0
    dst = torch.empty_like(src)
    reps = 50
    sec = seconds(lambda: [torch.exp2(src, out=dst) for _ in range(reps)], "cpu", repeats, warmup=1)
    return PREDICT_BLOCK_ELEMENTS * reps / sec / 1e9


def svdgp_mean_rate(learner: Learner, n: int, repeats: int, kernels: int, sgemm: float, exp2: float) -> dict[str, Any]:
    """SVDGP's mean path at ``n`` points against this machine's limit, with the fused native
    kernel (:mod:`gpdyn.gp.native`, where it builds) and on the torch path.

    A mean builds ``kernels`` feature matmuls of ``2 N M D`` flops and ``N M`` ``exp2`` each (P
    with per-output length scales, 1 with one kernel for all outputs) and P matvecs of
    ``2 N M``. The torch path's floor is those flops at sgemm speed (``sgemm`` GFLOP/s) plus
    the ``exp2`` at torch's own peak rate (``exp2`` G/s): ``share_of_floor`` is floor /
    measured time. ``gflops`` counts the flops actually done.
    """
    from gpdyn.gp import native

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, learner.input_dim, generator=gen, dtype=learner.dtype).to(learner.device)
    m, d, p = learner.basis_counts["alpha"], learner.input_dim, learner.output_dim
    flops = kernels * 2.0 * n * m * d + p * 2.0 * n * m
    floor = flops / (sgemm * 1e9) + kernels * n * m / (exp2 * 1e9)
    out: dict[str, Any] = {"M_alpha": m, "N": n, "kernels": kernels, "floor_seconds": floor,
                           "native": native.usable(x)}
    with torch.no_grad():
        # the path predictions take here (native where it builds and is not turned off), then the torch path
        for path, switch in (("", contextlib.nullcontext()), ("torch_", native.enabled(False))):
            with switch:
                sec = seconds(lambda: learner.predict_mean(x), learner.device, repeats, warmup=1)
                full = seconds(lambda: learner.predict(x), learner.device, repeats, warmup=1)
            out.update({f"{path}mean_seconds": sec, f"{path}predict_seconds": full, f"{path}gflops": flops / sec / 1e9,
                        f"{path}share_of_sgemm": flops / sec / 1e9 / sgemm})
    out["torch_share_of_floor"] = floor / out["torch_mean_seconds"]
    return out


def gather_seconds(p: int, m: int, n: int, repeats: int, dtype: torch.dtype, k: int = 16,
                   device: str | torch.device = "cpu") -> float:
    """Seconds of a plain ``k``-weight gather: ``k`` indices per point and output from a
    ``[p, m]`` table, times weights, summed (what an interpolated mean must at least do)."""
    gen = torch.Generator().manual_seed(2)
    table = torch.randn(p, m, generator=gen, dtype=dtype).to(device)
    idx = torch.randint(0, m, (p, n * k), generator=gen).to(device)
    w = torch.randn(p, n, k, generator=gen, dtype=dtype).to(device)
    return seconds(lambda: (table.gather(1, idx).view(p, n, k) * w).sum(-1), device, repeats, warmup=1)


def bench_mpc(
    models: list[str], samples: int, horizon: int, repeats: int, device: torch.device, dtype: torch.dtype,
    preset: str = "small", seed: int = 0, fresh: bool = True, progress: Callable[[str], None] = log.info,
    ratio_presets: tuple[str, ...] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Planning rows per model and mode, and the ratios (see the module docs; SVDGP's mean
    path is measured at ``ratio_presets``, default ``preset`` and "paper")."""
    from gpdyn.robots.policy import load_policy

    proposal = TorchPolicy(load_policy(), device, dtype)
    modes = {"mean": MPCConfig(horizon=horizon, samples=samples, uncertainty="mean"),
             "mean+variance": MPCConfig(horizon=horizon, samples=samples, uncertainty="penalty", var_weight=1.0)}
    rows: list[dict[str, Any]] = []

    def row(model: str, sizes: str, mode: str, sec: float, **extra: Any) -> dict[str, Any]:
        r = {"model": model, "sizes": sizes, "mode": mode, "preset": preset, "K": samples, "H": horizon,
             "seconds_per_step": sec, "steps_per_second": 1.0 / sec, "real_time_ratio": (1.0 / sec) / REAL_TIME_HZ,
             **extra}
        rows.append(r)
        progress(f"  {model:<16} {mode:<14} {sec:8.3f} s/step  {1.0 / sec:8.2f} steps/s")
        return r

    identity = lambda x, a: x  # noqa: E731  the planner alone: no model cost
    row("(planner alone)", "identity model", "mean", planning_seconds(identity, proposal, modes["mean"], repeats, device,
                                                                        dtype, seed))
    if device.type == "cpu":  # the cost and the TRPO proposal compiled (MPCConfig.compiled)
        try:
            row("(planner alone, compiled)", "identity model", "mean",
                planning_seconds(identity, proposal, replace(modes["mean"], compiled=True), repeats, device, dtype, seed))
        except InputError as err:  # no C++ compiler: reported in the table
            rows.append({"model": "(planner alone, compiled)", "sizes": "", "mode": "error", "error": str(err)})
            progress(f"  (planner alone, compiled): {err}")
    variants: list[tuple[str, str, bool, dict[str, Any] | None]] = [(name, name, True, None) for name in models]
    if fresh and "svdgp" in models:
        variants.append(("svdgp (fresh)", "svdgp", False, None))
    for name in models:
        variants += [(label, name, True, options) for label, options in OPTION_VARIANTS.get(name, [])
                     if device.type == "cpu" or not CPU_ONLY_OPTIONS & options.keys()]
    for label, name, distinct, options in variants:
        planner_options = {k: v for k, v in (options or {}).items() if k in PLANNER_OPTIONS}
        learner_options = {k: v for k, v in (options or {}).items() if k not in PLANNER_OPTIONS} or None
        try:
            dyn = filled_model(name, device, dtype, seed, preset, distinct, learner_options)
        except Exception as err:  # noqa: BLE001  reported in the table, the other models still run
            rows.append({"model": label, "sizes": "", "mode": "error", "error": f"{type(err).__name__}: {err}"})
            progress(f"  {label}: {type(err).__name__}: {err}")
            continue
        sizes = basis_sizes(dyn.model.learner)
        for mode, cfg in modes.items():
            try:
                row(label, sizes, mode, planning_seconds(dyn, proposal, replace(cfg, **planner_options), repeats, device,
                                                         dtype, seed))
            except Exception as err:  # noqa: BLE001
                rows.append({"model": label, "sizes": sizes, "mode": mode, "error": f"{type(err).__name__}: {err}"})
                progress(f"  {label} {mode}: {type(err).__name__}: {err}")
    ratios = measure_ratios(models, samples, device, dtype, ratio_presets or (preset, "paper"), seed, max(3, repeats),
                            progress)
    return rows, ratios


def measure_ratios(models: list[str], n: int, device: torch.device, dtype: torch.dtype, presets: tuple[str, ...],
                   seed: int, repeats: int, progress: Callable[[str], None] = log.info) -> dict[str, Any]:
    """sgemm throughput, SVDGP's mean path against it (at each of ``presets``), and WISKI's
    mean prediction (at ``presets[0]``) against a 16-weight gather, all at ``n`` points."""
    cpu = device.type == "cpu"
    ratios: dict[str, Any] = {"sgemm_gflops": sgemm_gflops(dtype) if cpu else None,
                              "exp2_gps": exp2_rate(dtype) if cpu else None, "svdgp": [], "wiski": None}
    if cpu:
        progress(f"  sgemm ({str(dtype).replace('torch.', '')}): {ratios['sgemm_gflops']:.1f} GFLOP/s, "
                 f"exp2 {ratios['exp2_gps']:.2f} G/s")
    if "svdgp" in models and cpu:
        for size in dict.fromkeys(presets):
            for features, options in (("per output", None), ("one kernel (shared_kernel)", {"shared_kernel": True})):
                learner = filled_learner("svdgp", device, dtype, size, seed, options=options)
                kernels = 1 if options else learner.output_dim
                rate = svdgp_mean_rate(learner, n, repeats, kernels, ratios["sgemm_gflops"], ratios["exp2_gps"])
                rate.update(preset=size, features=features)
                ratios["svdgp"].append(rate)
                progress(f"  svdgp {size} {features}: mean {rate['mean_seconds'] * 1e3:.2f} ms, "
                         f"{rate['gflops']:.1f} GFLOP/s = {100 * rate['share_of_sgemm']:.0f} % of sgemm"
                         f"{' (native kernel)' if rate['native'] else ''}; torch path "
                         f"{rate['torch_mean_seconds'] * 1e3:.2f} ms = {100 * rate['torch_share_of_sgemm']:.0f} % "
                         f"of sgemm, {100 * rate['torch_share_of_floor']:.0f} % of its floor")
    if "wiski" in models:
        ratios["wiski"] = wiski_mean_ratio(n, device, dtype, presets[0], seed, repeats, progress)
        if device.type == "cpu":
            ratios["wiski_compiled"] = wiski_mean_ratio(n, device, dtype, presets[0], seed, repeats, progress,
                                                        compiled_mean=True)
    return ratios


def wiski_mean_ratio(n: int, device: torch.device, dtype: torch.dtype, preset: str, seed: int, repeats: int,
                     progress: Callable[[str], None] = log.info, **options: Any) -> dict[str, Any]:
    """WISKI's ``predict_mean`` at ``n`` points (with ``options``) against a 16-weight gather."""
    label = "wiski" + "".join(f" {k}" for k in options)
    try:
        learner = filled_learner("wiski", device, dtype, preset, seed, options=options or None)
        gen = torch.Generator().manual_seed(3)
        x = torch.randn(n, learner.input_dim, generator=gen, dtype=dtype).to(device)
        with torch.no_grad():
            mean_sec = seconds(lambda: learner.predict_mean(x), device, repeats, warmup=1)  # warm-up: the compile
        m = int(getattr(learner, "num_inducing", 256))
        gather = gather_seconds(learner.output_dim, m, n, repeats, dtype, device=device)
    except Exception as err:  # noqa: BLE001  reported, the other ratios still stand
        return {"label": label, "error": f"{type(err).__name__}: {err}"}
    progress(f"  {label} mean {mean_sec * 1e3:.2f} ms vs 16-weight gather {gather * 1e3:.2f} ms: {mean_sec / gather:.2f}x")
    return {"label": label, "N": n, "m": m, "mean_seconds": mean_sec, "gather_seconds": gather, "ratio": mean_sec / gather}


class DoubleIntegrator:
    """A trivial walker-sized model ``(state [K, 18], action [K, 6]) -> next_state``: each
    actuated joint (the last six of the nine) a double integrator whose acceleration is
    ``gain * action``, the unactuated root coordinates drift at constant velocity."""

    def __init__(self, device: torch.device, dtype: torch.dtype, gain: float = 10.0, dt: float = DT) -> None:
        self.dt = dt
        self.b = torch.zeros(NU, NV, device=device, dtype=dtype)  # action -> acceleration, [nu, nv]
        self.b[torch.arange(NU), torch.arange(NV - NU, NV)] = gain * dt

    def __call__(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        v1 = state[:, NQ:] + action @ self.b
        return torch.cat([state[:, :NQ] + self.dt * v1, v1], dim=-1)


class TrackingCost:
    """A quadratic walking cost of the next state and the action alone (what pytorch-mppi's
    ``running_cost(state, action)`` sees): torso height from 1.25 m, pitch from upright,
    forward speed from ``speed``, and effort; it never terminates (``None``: gpdyn's planner
    then skips its termination bookkeeping, the peer has none)."""

    def __init__(self, speed: float = 1.0, effort: float = 1e-3) -> None:
        self.speed, self.effort = speed, effort

    def step(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Cost ``[K]`` of arriving at ``state [K, 18]`` under ``action [K, 6]``."""
        return ((state[:, 1] - 1.25) ** 2 + state[:, 2] ** 2 + (state[:, NQ] - self.speed) ** 2
                + self.effort * (action * action).sum(-1))

    def __call__(self, state: torch.Tensor, action: torch.Tensor,
                 next_state: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.step(next_state, action), None


def import_peer(name: str) -> Any:
    """The peer planner class (pytorch-mppi's ``MPPI``), or an :class:`InputError` with the
    command that installs it."""
    if name not in PEERS:
        raise InputError(f"bench mpc --peer {name!r}: choose one of {', '.join(PEERS)}")
    try:
        from pytorch_mppi import MPPI as PeerMPPI
    except ImportError as err:
        raise InputError(f"--peer {name}: {name} is not installed ({err}). It is a benchmark-only peer, not a "
                         f"dependency of gpdyn; install it without replacing torch: {PEERS[name]}") from err
    return PeerMPPI


def peer_planners(dynamics: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], cost: TrackingCost, cfg: MPCConfig,
                  device: torch.device, dtype: torch.dtype, seed: int = 0, peer: str = "pytorch-mppi") -> tuple[Any, Any]:
    """gpdyn's MPPI and the peer's on the same ``dynamics`` (next state alone), ``cost``, K, H,
    noise (``cfg.noise_std``, one value for every action), temperature and action box, both
    with MPPI's control cost ``lambda u' Sigma^-1 eps`` and no proposal."""
    PeerMPPI = import_peer(peer)
    if isinstance(cfg.noise_std, (list, tuple)):
        raise InputError("bench mpc --peer: one noise_std for every action")
    ours = make_planner("mppi", dynamics, cost, [ACTION_LOW] * NU, [ACTION_HIGH] * NU, cfg, device=device, dtype=dtype,
                        seed=seed)
    sigma = torch.eye(NU, device=device, dtype=dtype) * float(cfg.noise_std) ** 2
    torch.manual_seed(seed)  # the peer samples from torch's global generator
    theirs = PeerMPPI(dynamics, cost.step, NX, sigma, num_samples=cfg.samples, horizon=cfg.horizon, device=device,
                      lambda_=cfg.temperature, u_min=torch.full((NU,), ACTION_LOW, device=device, dtype=dtype),
                      u_max=torch.full((NU,), ACTION_HIGH, device=device, dtype=dtype))
    return ours, theirs


def peer_comparison(models: list[str], samples: int, horizon: int, repeats: int, device: torch.device,
                    dtype: torch.dtype, preset: str = "small", seed: int = 0, peer: str = "pytorch-mppi",
                    noise_std: float = 0.3, temperature: float = 1.0,
                    progress: Callable[[str], None] = log.info) -> list[dict[str, Any]]:
    """Seconds per planning step of gpdyn's MPPI and the peer's (:func:`peer_planners`) on
    :class:`DoubleIntegrator` and on each learned model of ``models`` (its mean-only path),
    and of the model's ``H`` calls on ``K`` points alone (what any planner must spend), after
    one warm-up step each; the three are timed alternately, one step at a time, in turned
    order every other round (:func:`gpdyn.device.seconds`), ``repeats`` steps each (at least
    :data:`TRIVIAL_REPEATS` for the trivial model), and the rows give the means and the ratio
    gpdyn / peer."""
    import_peer(peer)  # refuse before building any model
    cfg = MPCConfig(horizon=horizon, samples=samples, noise_std=noise_std, temperature=temperature, control_cost=1.0,
                    uncertainty="mean")
    cost = TrackingCost()
    state = _state(device, dtype)
    rows = []
    for name in [TRIVIAL, *models]:
        if name == TRIVIAL:
            dynamics, sizes, n = DoubleIntegrator(device, dtype), "linear, 18 states", max(repeats, TRIVIAL_REPEATS)
        else:
            learned = filled_model(name, device, dtype, seed, preset)
            dynamics, sizes, n = learned.predict_mean, basis_sizes(learned.model.learner), repeats
        ours, theirs = peer_planners(dynamics, cost, cfg, device, dtype, seed, peer)
        x = state.expand(samples, -1).clone()
        a = torch.zeros(samples, NU, device=device, dtype=dtype)
        steps = {"gpdyn": lambda: ours.plan(state), peer: lambda: theirs.command(state),
                 "model": lambda: [dynamics(x, a) for _ in range(horizon)]}
        times: dict[str, list[float]] = {k: [] for k in steps}
        with torch.no_grad():
            for fn in steps.values():  # warm-up
                fn()
            for i in range(n):
                # A B C, then C B A: neither planner always runs after the other
                for k in (list(steps) if i % 2 == 0 else list(reversed(steps))):
                    times[k].append(seconds(steps[k], device, 1))
        ours_s, peer_s, model_s = (sum(times[k]) / n for k in steps)
        rows.append({"model": name, "sizes": sizes, "K": samples, "H": horizon, "noise_std": noise_std,
                     "temperature": temperature, "repeats": n, "gpdyn_seconds": ours_s, "peer": peer,
                     "peer_seconds": peer_s, "ratio": ours_s / peer_s, "model_seconds": model_s})
        progress(f"  peer {name:<18} gpdyn {ours_s * 1e3:8.2f} ms/step  {peer} {peer_s * 1e3:8.2f} ms/step  "
                 f"ratio {ours_s / peer_s:.2f}  (the model's H calls alone {model_s * 1e3:.2f} ms)")
    return rows


def peer_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`peer_comparison`."""
    peer = rows[0]["peer"] if rows else "peer"
    lines = [f"| model | sizes | gpdyn MPPI: CPU-ms/step | {peer}: CPU-ms/step | gpdyn / {peer} | the model's H calls "
             "alone: CPU-ms | timed steps |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['sizes']} | {r['gpdyn_seconds'] * 1e3:.2f} | {r['peer_seconds'] * 1e3:.2f} | "
                     f"{r['ratio']:.2f} | {r['model_seconds'] * 1e3:.2f} | {r['repeats']} |")
    return "\n".join(lines)


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table: one line per model, mean-only and mean+variance side by side."""
    lines = ["| model | sizes | mean only: s/step | steps/s | mean+variance: s/step | steps/s | speed-up |",
             "|---|---|---|---|---|---|---|"]
    by_model: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_model.setdefault(r["model"], {})[r["mode"]] = r
    for model, modes in by_model.items():
        if "error" in modes:
            lines.append(f"| {model} | | error: {modes['error']['error']} | | | | |")
            continue
        cells = []
        for mode in ("mean", "mean+variance"):
            r = modes.get(mode)
            cells += [f"{r['seconds_per_step']:.3f}", f"{r['steps_per_second']:.2f}"] if r and "error" not in r else \
                [f"error: {r['error']}" if r else "", ""]
        a, b = modes.get("mean"), modes.get("mean+variance")
        speed = f"{b['seconds_per_step'] / a['seconds_per_step']:.2f}x" if a and b and "error" not in a and \
            "error" not in b else ""
        sizes = next(iter(modes.values()))["sizes"]
        lines.append(f"| {model} | {sizes} | {' | '.join(cells)} | {speed} |")
    return "\n".join(lines)


def ratio_text(ratios: dict[str, Any]) -> str:
    """The ratios as markdown."""
    out = []
    if ratios.get("sgemm_gflops"):
        out.append(f"- sgemm (2048 x 2048, this dtype): **{ratios['sgemm_gflops']:.1f} GFLOP/s** of CPU time; "
                   f"`exp2` on a cache-sized block: **{ratios.get('exp2_gps') or float('nan'):.2f} G/s**.")
    for r in ratios.get("svdgp", []):
        fused = ("the fused native kernel" if r.get("native")
                 else "the torch path (the native kernel is turned off or did not build)")
        out.append(f"- SVDGP mean path, {r['preset']} preset (M_alpha = {r['M_alpha']}), {r['features']}, "
                   f"N = {r['N']}, {fused}: {r['mean_seconds'] * 1e3:.2f} CPU-ms per `predict_mean` "
                   f"({r['predict_seconds'] * 1e3:.2f} ms per `predict`), {r['gflops']:.1f} GFLOP/s done = "
                   f"**{100 * r['share_of_sgemm']:.0f} % of sgemm**. The torch path (matmul, `exp2`, matvec): "
                   f"{r['torch_mean_seconds'] * 1e3:.2f} ms = {100 * r['torch_share_of_sgemm']:.0f} % of sgemm; its "
                   f"floor (the flops at sgemm speed plus {r['kernels']} x N x M `exp2` at torch's rate) "
                   f"{r['floor_seconds'] * 1e3:.2f} ms: {100 * r['torch_share_of_floor']:.0f} % of that floor.")
    for w in (ratios.get("wiski"), ratios.get("wiski_compiled")):
        if w and "error" in w:
            out.append(f"- `{w.get('label', 'wiski')}` mean vs gather: error: {w['error']}")
        elif w:
            out.append(f"- `{w.get('label', 'wiski')}` `predict_mean` at N = {w['N']}: {w['mean_seconds'] * 1e3:.3f} "
                       f"CPU-ms; a plain 16-weight gather from a [P, {w['m']}] table: {w['gather_seconds'] * 1e3:.3f} ms; "
                       f"**ratio {w['ratio']:.2f}**.")
    return "\n".join(out)


def run_benchmark(
    models: list[str] | None = None, samples: int = 1000, horizon: int = 30, repeats: int = 1,
    device: str | torch.device = "cpu", out: str | Path | None = None, preset: str = "small", threads: int | None = None,
    dtype: torch.dtype = torch.float32, command: str | None = None, peer: str | None = None,
) -> RunDir:
    """``gpdyn bench mpc``: the planning-rate table of ``models`` (default every learner) into a
    run folder's ``report.md`` and on screen. ``threads``: torch's CPU threads (None: as set,
    e.g. by the command's ``--threads``, default 1); ``command``: the command line, for the report;
    ``peer``: also run :func:`peer_comparison` against that peer on the trivial model and ``models``."""
    device = resolve_device(device)
    models = list(models or BENCH_MODELS)
    bad = [m for m in models if m not in BENCH_MODELS]
    if bad or samples < 2 or horizon < 1 or repeats < 1 or preset not in PRESETS:
        raise InputError(f"bench mpc: models from {', '.join(BENCH_MODELS)} (got {bad}), presets from {', '.join(PRESETS)} "
                         f"(got {preset}), samples >= 2, horizon >= 1, repeats >= 1")
    if peer is not None:
        import_peer(peer)  # refused before the run folder
    if threads is not None:
        set_threads(threads)
    threads = torch.get_num_threads()
    dtype_name = str(dtype).replace("torch.", "")
    MPCConfig(horizon=horizon, samples=samples).check_memory(NX, NU, dtype, device)  # before the run folder
    run = RunDir.create("bench-mpc", {"models": models, "samples": samples, "horizon": horizon, "repeats": repeats,
                                      "preset": preset, "device": str(device), "dtype": dtype_name, "threads": threads,
                                      "device_name": device_name(device), "torch": torch.__version__, "command": command, "peer": peer}, out=out)
    print(f"gpdyn bench mpc: run folder {run.path}")  # the run folder and the tables: results, on stdout
    rows, ratios = bench_mpc(models, samples, horizon, repeats, device, dtype, preset)
    for r in rows:
        run.log(**r)
    run.write_json("ratios.json", ratios)
    text, rtext = table(rows), ratio_text(ratios)
    ptext = ""
    if peer is not None:
        peer_rows = peer_comparison(models, samples, horizon, repeats, device, dtype, preset, peer=peer)
        for r in peer_rows:
            run.log(table="peer", **r)
        cfg = peer_rows[0]
        ptext = (f"\n\n## Peer: gpdyn's MPPI against {peer} (same run)\n\nSame dynamics, cost (`TrackingCost`), "
                 f"K = {samples}, H = {horizon}, noise std {cfg['noise_std']}, temperature {cfg['temperature']}, action "
                 f"box, MPPI control cost, no proposal; learned models through their mean-only path. The two planners "
                 f"and the model's H calls alone are timed alternately, one step at a time, in turned order every "
                 f"other round, after one warm-up step each.\n\n{peer_table(peer_rows)}")
    clock = ("CPU seconds of this process (`time.process_time`)" if device.type == "cpu"
             else "Wall seconds between two device syncs")
    header = (f"# MPC planning rate\n\n"
              f"MPPI, K = {samples}, H = {horizon}, TRPO proposal on half of the samples, learners at their "
              f"`{preset}` preset; {dtype_name}, {threads} torch thread(s), device {device} ({device_name(device)}); "
              f"torch {torch.__version__}. {clock} per planning step after one warm-up step, {repeats} timed "
              f"step(s) per row. Walker2d real time: {REAL_TIME_HZ:.0f} control "
              f"steps/s.\n\n" + (f"Command: `{command}`\n\n" if command else ""))
    (run.path / "report.md").write_text(f"{header}{text}\n\n## What bounds the rates (same run)\n\n{rtext}{ptext}\n")
    print(text)
    print(rtext + ptext)
    return run


__all__ = ["BENCH_MODELS", "PEERS", "REAL_TIME_HZ", "DoubleIntegrator", "TrackingCost", "bench_mpc", "filled_learner",
           "filled_model", "gather_seconds", "import_peer", "measure_ratios", "peer_comparison", "peer_planners",
           "peer_table", "run_benchmark", "sgemm_gflops", "exp2_rate", "svdgp_mean_rate", "table"]
