"""``gpdyn bench learners``: time and peak memory per step at the papers' sizes (N_m = 1024, D = 23, P = 9).

Configurations (SVDGP Section 4; ORTHDGP Fig. 2c): SVDGP M_alpha = 128^2, M_beta = 128
and M_alpha = 4096 for the linear-scaling check (the step time may grow at most 4.5x
for 4x M_alpha); SVI M = 1024; ORTHNAT |gamma| = 3500, |beta| = 1500 and at SVDGP's
sizes (|gamma| = 128^2, |beta| = 128). Bases are filled before timing.

Each configuration runs in a fresh process, so that one configuration's allocations
never hide another's. Peak memory is CUDA's allocator peak during the timed steps on a
GPU. On the CPU it is the process's peak resident set during the timed steps (Linux
``VmHWM``, reset through ``/proc/self/clear_refs`` just before them) and its growth over
the resident set just before them (parameters, optimiser state, data and the torch
runtime are in that base). On a GPU each timed step is also measured with CUDA events
(``step_gpu_s``). Results go to ``bench.json`` and ``report.md`` in the run folder, with the
device's name (``torch.cuda.get_device_name`` on a GPU).

The peer (``--peer gpytorch``): GPyTorch's SVGP (an ``ApproximateGP`` with a
``VariationalStrategy`` over a ``CholeskyVariationalDistribution``, learned inducing
locations, the P outputs as a batch of independent GPs, a Gaussian likelihood per output,
Adam on everything) joins the step-time table as ``gpytorch-svgp-1024`` (M = 1024, SVI's
size), timed on the same batch as gpdyn's configurations. With ``--store`` the learners and
the peer also race: each runs for the same time budget (process CPU time on the CPU, wall
time with a device sync per step on a GPU) on the same seeded minibatches of a real
regression problem, and is scored by nMSE on the held-out rows at fractions of the budget
(:func:`race`). gpytorch is not a dependency of gpdyn: ``scripts/install_peer.sh`` installs
it with ``--no-deps`` (it must never pull a second torch); without it ``--peer gpytorch``
is refused before any work (exit 2) with that command.
"""

from __future__ import annotations

import importlib
import math
import multiprocessing as mp
import time
from types import ModuleType
from pathlib import Path
from typing import Any

import torch

from gpdyn.device import device_name, dtype_name, resolve_device, resolve_dtype, seconds, set_threads
from gpdyn.errors import InputError
from gpdyn.gp import LEARNERS, learner_class, make_learner, preset_options
from gpdyn.gp.hyperparams import initial_noise_variance
from gpdyn.gp.kernels import median_lengthscale
from gpdyn.runs import RunDir

N_M, D, P = 1024, 23, 9
#: the peers ``--peer`` may name, and how to install each without touching torch
PEERS: dict[str, str] = {
    "gpytorch": "bash scripts/install_peer.sh   (pip install --no-deps gpytorch==1.15.2 linear_operator==0.6.1)",
}
#: the peer's name in the tables
PEER_SVGP = "gpytorch-svgp"
#: the learners that race by default (``--store``)
RACE_LEARNERS = ("svdgp", "svi", "orthnat", "wiski")
#: fractions of the budget at which a racing learner is scored
RACE_MARKS = (0.25, 0.5, 1.0)


def _paper(name: str, **overrides: Any) -> dict[str, Any]:
    """The learner's "paper" preset with ``overrides``: the sizes a configuration times."""
    return {**preset_options(learner_class(name), "paper"), **overrides}


_SVDGP = _paper("svdgp")
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "svdgp-4096": ("svdgp", _paper("svdgp", m_alpha=_SVDGP["m_alpha"] // 4)),
    "svdgp-16384": ("svdgp", _SVDGP),
    "svi-1024": ("svi", _paper("svi")),
    "orthnat-3500-1500": ("orthnat", _paper("orthnat")),
    "orthnat-16384-128": ("orthnat", _paper("orthnat", m_gamma=_SVDGP["m_alpha"], m_beta=_SVDGP["m_beta"])),
}
#: the peer's configurations, timed only with ``--peer gpytorch`` (M: SVI's paper size)
PEER_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    f"{PEER_SVGP}-{_paper('svi')['m']}": (PEER_SVGP, {"m": _paper("svi")["m"]}),
}


# -- the peer: GPyTorch SVGP ---------------------------------------------------------------
def import_peer(name: str = "gpytorch") -> ModuleType:
    """The peer's module; InputError (exit 2) with the install command when it is missing."""
    if name not in PEERS:
        raise InputError(f"--peer {name}: unknown peer; choose one of {', '.join(PEERS)}")
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise InputError(f"--peer {name}: {name} is not installed ({err}). It is a benchmark-only peer, not a "
                         f"dependency of gpdyn; install it without replacing torch: {PEERS[name]}") from err


class GPyTorchSVGP:
    """GPyTorch's SVGP as a peer of gpdyn's learners (``step`` and ``predict_mean`` only).

    Hensman et al. (2013)'s model as GPyTorch builds it: an ``ApproximateGP`` whose
    ``VariationalStrategy`` (whitened) holds a ``CholeskyVariationalDistribution`` over
    ``m`` inducing values with learned inducing locations; the P outputs are a batch of
    independent GPs (``batch_shape = [P]``: one SE-ARD kernel with its own amplitude, one
    Gaussian noise per output), zero prior mean as gpdyn's learners. The loss is minus
    GPyTorch's ``VariationalELBO`` (per point, ``num_data = n_data``) summed over the
    outputs; Adam with the constant step size ``lr`` updates every parameter (variational,
    inducing locations, hyperparameters), as in GPyTorch's SVGP examples (default 0.1, the
    gamma_0 of gpdyn's presets; GPyTorch's examples use 0.01). Start: gpdyn's (SVDGP
    Appendix B: median-trick length scales and the outputs' variance as the noise, from
    ``x0, y0``, unit amplitude), inducing locations at ``m`` rows of ``x0`` (seeded).
    """

    name = PEER_SVGP

    def __init__(self, x0: torch.Tensor, y0: torch.Tensor, m: int, *, n_data: int, lr: float = 0.1,
                 seed: int = 0) -> None:
        gpytorch = import_peer("gpytorch")
        if m < 1 or n_data < 1 or not (lr > 0 and math.isfinite(lr)):
            raise InputError(f"{PEER_SVGP}: need m >= 1, n_data >= 1 and a finite lr > 0, got {m}, {n_data}, {lr}")
        self.device, self.dtype = x0.device, x0.dtype
        self.input_dim, self.output_dim = int(x0.shape[1]), int(y0.shape[1])
        p, d = self.output_dim, self.input_dim
        gen = torch.Generator().manual_seed(int(seed))
        rows = torch.randperm(x0.shape[0], generator=gen)[:m].to(x0.device)
        if len(rows) < m:  # fewer starting rows than inducing points: repeat them, slightly moved
            extra = torch.randint(x0.shape[0], (m - len(rows),), generator=gen).to(x0.device)
            rows = torch.cat([rows, extra])
        inducing = x0[rows].unsqueeze(0).expand(p, m, d).clone()
        batch = torch.Size([p])

        class _SVGP(gpytorch.models.ApproximateGP):
            def __init__(self) -> None:
                dist = gpytorch.variational.CholeskyVariationalDistribution(m, batch_shape=batch)
                strategy = gpytorch.variational.VariationalStrategy(self, inducing, dist, learn_inducing_locations=True)
                super().__init__(strategy)
                self.mean_module = gpytorch.means.ZeroMean(batch_shape=batch)
                self.covar_module = gpytorch.kernels.ScaleKernel(
                    gpytorch.kernels.RBFKernel(ard_num_dims=d, batch_shape=batch), batch_shape=batch)

            def forward(self, x: torch.Tensor) -> Any:
                return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

        self.model = _SVGP().to(device=self.device, dtype=self.dtype)
        self.likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch).to(device=self.device, dtype=self.dtype)
        floor = float(self.likelihood.noise_covar.raw_noise_constraint.lower_bound) * 2
        with torch.no_grad():
            ls = median_lengthscale(x0, generator=gen)
            self.model.covar_module.base_kernel.lengthscale = ls.expand(p, 1, d)
            self.model.covar_module.outputscale = torch.ones(p, device=self.device, dtype=self.dtype)
            self.likelihood.noise = initial_noise_variance(y0).clamp_min(floor).reshape(p, 1)
        self.elbo = gpytorch.mlls.VariationalELBO(self.likelihood, self.model, num_data=int(n_data))
        self.optimizer = torch.optim.Adam([*self.model.parameters(), *self.likelihood.parameters()], lr=float(lr))
        self.m, self.lr = int(m), float(lr)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        """One Adam step on minus the ELBO of the minibatch ``x [N, D]``, ``y [N, P]``."""
        self.model.train()
        self.likelihood.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = -self.elbo(self.model(x), y.transpose(0, 1))  # [P]: one bound per output
        loss.sum().backward()
        self.optimizer.step()
        return {"loss": loss.detach().mean()}

    @torch.no_grad()
    def predict_mean(self, x: torch.Tensor) -> torch.Tensor:
        """Predictive mean of the latent function, ``[N, P]``."""
        self.model.eval()
        self.likelihood.eval()
        return self.model(x).mean.transpose(0, 1)

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive mean and variance of the latent function, ``[N, P]`` each."""
        self.model.eval()
        self.likelihood.eval()
        f = self.model(x)
        return f.mean.transpose(0, 1), f.variance.transpose(0, 1)


# -- step time and memory ------------------------------------------------------------------
def _status_mb(field: str) -> float | None:
    """A ``VmRSS``/``VmHWM`` line of ``/proc/self/status`` in MB (None off Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux ``clear_refs`` value 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def bench_one(name: str, sizes: dict[str, Any], device: str, dtype: torch.dtype, repeats: int) -> dict[str, Any]:
    """Median step time (s), predict time (s, for N_m points) and peak memory (MB) of one learner
    with full bases (or of the peer, ``name`` = :data:`PEER_SVGP`, with ``sizes["m"]`` inducing points)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_M, D, generator=g, dtype=torch.float64).to(device, dtype)
    y = torch.sin(x[:, :P]).to(device, dtype)
    if name == PEER_SVGP:
        # its inducing points start at random rows as gpdyn's bases are filled below
        x0 = torch.randn(max(N_M, sizes["m"]), D, generator=g, dtype=torch.float64).to(device, dtype)
        learner: Any = GPyTorchSVGP(x0, torch.sin(x0[:, :P]), sizes["m"], n_data=100 * N_M)
        counts = {"inducing": sizes["m"]}
    else:
        learner = make_learner(name, D, P, device=device, dtype=dtype, **{**sizes, "n_delta": N_M, "n_data": 100 * N_M})
        while True:  # fill every basis before timing
            before = learner.basis_counts
            learner.observe(torch.randn(N_M, D, generator=g, dtype=torch.float64).to(device, dtype), y)
            if learner.basis_counts == before:
                break
        counts = learner.basis_counts
    learner.step(x, y)  # warm-up
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated() / 2**20
        torch.cuda.reset_peak_memory_stats()
        measured = True
    else:
        base = _status_mb("VmRSS")
        measured = base is not None and _reset_peak_rss()
    times, cpu, gpu = [], [], []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0, c0 = time.perf_counter(), time.process_time()
        loss = learner.step(x, y)["loss"]
        if cuda:
            end.record()
        float(loss)  # one sync per timed step
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if cuda:
            gpu.append(start.elapsed_time(end) / 1e3)  # the device's time from the step's first kernel to its last
    if cuda:
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = _status_mb("VmHWM") if measured else None
    t0 = time.perf_counter()
    mean, _ = learner.predict(x)  # the first predict after a step also rebuilds the cache
    float(mean.sum())
    predict_s = time.perf_counter() - t0
    times.sort()
    cpu.sort()
    gpu.sort()
    return {
        "learner": name,
        "sizes": sizes,
        "counts": counts,
        "step_s": times[len(times) // 2],
        "step_cpu_s": cpu[len(cpu) // 2],
        "step_gpu_s": gpu[len(gpu) // 2] if gpu else None,
        "predict_s": predict_s,
        "base_mb": base,
        "peak_mb": peak,
        "step_growth_mb": (peak - base) if (peak is not None and base is not None) else None,
    }


def _child(queue: Any, threads: int, fn: Any, args: tuple[Any, ...]) -> None:
    set_threads(threads)
    try:
        queue.put(("ok", fn(*args)))
    except Exception as err:  # reported by the parent with the configuration's name
        queue.put(("error", f"{type(err).__name__}: {err}"))


def _isolated(what: str, fn: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    """``fn(*args)`` in a fresh process (spawned: no inherited allocations or CUDA state)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, torch.get_num_threads(), fn, args))
    proc.start()
    status, payload = queue.get()
    proc.join()
    if status != "ok":
        raise InputError(f"bench learners: {what} failed: {payload}")
    return payload


def run_isolated(name: str, sizes: dict[str, Any], device: str, dtype: torch.dtype, repeats: int) -> dict[str, Any]:
    """:func:`bench_one` in a fresh process (spawned: no inherited allocations or CUDA state)."""
    return _isolated(f"{name} {sizes}", bench_one, (name, sizes, device, dtype, repeats))


# -- nMSE at equal time ------------------------------------------------------------------------
def _nmse(model: Any, x: torch.Tensor, y: torch.Tensor, chunk: int = 1024) -> list[float]:
    """Held-out nMSE per output of ``model``'s predictive mean (gpdyn.gp.online.nmse)."""
    from gpdyn.gp.online import nmse

    with torch.no_grad():
        mean = torch.cat([model.predict_mean(x[i : i + chunk]) for i in range(0, x.shape[0], chunk)])
    return nmse(mean, y).double().cpu().tolist()


def _warm_up(name: str, x: torch.Tensor, y: torch.Tensor) -> None:
    """A throwaway model of ``name``'s kind, at a tiny size, takes a step and predicts on ``x, y``:
    the libraries' one-time costs (the peer's lazy imports and first calls, torch's) are paid
    before a race's clock starts, for every learner alike."""
    if name == PEER_SVGP:
        import_peer("gpytorch")
        model: Any = GPyTorchSVGP(x, y, min(16, len(x)), n_data=len(x))
    else:
        model = make_learner(name, x.shape[1], y.shape[1], preset="small", rows=len(x), device=x.device, dtype=x.dtype)
        model.observe(x, y)
    model.step(x, y)
    model.predict_mean(x)
    model.predict_mean(x)


def race_one(
    name: str, store: str, problem_name: str, preset: str, budget: float, device: str, dtype: torch.dtype,
    batch: int = N_M, seed: int = 0, peer_m: int | None = None, peer_lr: float = 0.1,
    marks: tuple[float, ...] = RACE_MARKS,
) -> dict[str, Any]:
    """Train ``name`` (a registered learner, or :data:`PEER_SVGP`) for ``budget`` seconds on the
    seeded iid minibatches of ``problem_name`` (SVDGP Algorithm 1 for gpdyn's learners: each
    minibatch is observed, then one step), scoring held-out nMSE at each fraction ``marks``
    of the budget. The clock counts the learner's work only (construction, minibatches,
    observe, step; not the scoring): process CPU time on the CPU, wall time with a device
    sync after each iteration on a GPU."""
    import gpdyn.robots.tasks  # noqa: F401  (registers every built-in task and its problems)
    from gpdyn.data.problems import load_problem
    from gpdyn.data.streams import IIDStream
    from gpdyn.experiments.learn import protocol_options

    problem = load_problem(store, problem_name, protocol="iid", seed=seed)
    x_train, y_train = problem.tensors("train", device, dtype)
    x_test, y_test = problem.tensors("test", device, dtype)
    n = len(x_train)
    stream = IIDStream(x_train, y_train, batch, seed=seed, device=device, dtype=dtype)

    _warm_up(name, x_train[:64], y_train[:64])  # one-time library costs (lazy imports, first calls) are no learner's work
    state: dict[str, Any] = {}

    def start() -> None:
        if name == PEER_SVGP:
            m = int(peer_m if peer_m is not None else min(preset_options(learner_class("svi"), preset)["m"], n))
            xb, yb = stream.next_batch()  # the first minibatch starts it, as observe() starts gpdyn's
            pool = torch.cat([xb, x_train[: max(0, m - len(xb))]]) if m > len(xb) else xb
            state["model"] = GPyTorchSVGP(pool, yb, m, n_data=n, lr=peer_lr, seed=seed)
            state["model"].step(xb, yb)
            state["sizes"] = {"m": m, "lr": peer_lr}
        else:
            state["model"] = make_learner(name, problem.input_dim, problem.output_dim, preset=preset, rows=n,
                                          device=device, dtype=dtype, seed=seed, **protocol_options(name, None, n))
            state["sizes"] = dict(state["model"].config)

    def iteration() -> None:
        xb, yb = stream.next_batch()
        model = state["model"]
        if name != PEER_SVGP:
            room = model.room()
            if room is not None and room < len(xb):
                xb_obs, yb_obs = xb[:room], yb[:room]
            else:
                xb_obs, yb_obs = xb, yb
            model.observe(xb_obs, yb_obs)
        model.step(xb, yb)

    used = seconds(start, device)  # the benchmarks' clock: CPU time on the CPU, synced wall time on a GPU
    model, sizes = state["model"], state["sizes"]
    steps = 1 if name == PEER_SVGP else 0
    todo = sorted(budget * f for f in marks)
    records = []
    while todo:
        used += seconds(iteration, device)
        steps += 1
        while todo and used >= todo[0]:
            scores = _nmse(model, x_test, y_test)
            records.append({"budget_s": todo.pop(0), "used_s": used, "steps": steps, "nmse": scores,
                            "nmse_mean": sum(scores) / len(scores)})
    final = records[-1]
    return {"learner": name, "sizes": sizes, "steps": final["steps"], "used_s": final["used_s"],
            "s_per_step": final["used_s"] / final["steps"], "nmse_mean": final["nmse_mean"], "nmse": final["nmse"],
            "marks": records, "rows": {"train": n, "test": len(x_test)}, "problem": problem.describe()}


def race(
    names: list[str], store: str | Path, problem: str, *, preset: str = "paper", budget: float = 60.0,
    device: str = "cpu", dtype: torch.dtype = torch.float64, batch: int = N_M, seed: int = 0,
    peer_m: int | None = None, peer_lr: float = 0.1,
) -> dict[str, dict[str, Any]]:
    """:func:`race_one` for each of ``names``, each in a fresh process."""
    out = {}
    for name in names:
        out[name] = _isolated(f"race {name}", race_one, (name, str(store), problem, preset, budget, device, dtype,
                                                         batch, seed, peer_m, peer_lr))
    return out


def race_table(results: dict[str, dict[str, Any]], cuda: bool) -> list[str]:
    """Markdown rows of :func:`race`'s results."""
    clock = "wall s (synced)" if cuda else "CPU s"
    marks = [f"nMSE at {f:g} budget" for f in RACE_MARKS]
    lines = [f"| learner | sizes | steps | {clock} used | ms/step | " + " | ".join(marks) + " |",
             "|---|---|---|---|---|" + "---|" * len(marks)]
    for key, r in results.items():
        sizes = r["sizes"]
        shown = {k: sizes[k] for k in ("m_alpha", "m_beta", "m", "m_gamma", "grid_size", "lr") if k in sizes}
        cells = " | ".join(f"{rec['nmse_mean']:.4f} ({rec['steps']})" for rec in r["marks"])
        lines.append(f"| {key} | {shown} | {r['steps']} | {r['used_s']:.1f} | {r['s_per_step'] * 1e3:.1f} | {cells} |")
    return lines


def _fmt_mb(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}"


def _fmt_ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 1e3:.1f}"


def bench_learners(
    device: str = "cpu", dtype: str | torch.dtype | None = None, repeats: int = 3, only: list[str] | None = None,
    out: str | Path | None = None, *, peer: str | None = None, store: str | Path | None = None,
    problem: str | None = None, budget: float = 60.0, learners: list[str] | None = None, preset: str = "paper",
    peer_lr: float = 0.1, seed: int = 0,
) -> tuple[RunDir, dict[str, Any]]:
    """Time every configuration (or those named in ``only``), each in a fresh process; print the
    table and the M_alpha scaling ratio; write ``bench.json`` and ``report.md`` into a run folder.

    ``peer="gpytorch"`` adds GPyTorch's SVGP (:data:`PEER_CONFIGS`); ``store`` and ``problem``
    add the race at equal time (:func:`race`) of ``learners`` (default :data:`RACE_LEARNERS`,
    at ``preset``) and the peer, ``budget`` seconds each."""
    device = str(resolve_device(device))
    dtype = resolve_dtype(dtype, device)
    if repeats < 1:
        raise InputError(f"--repeats must be >= 1, got {repeats}")
    if peer is not None:
        import_peer(peer)  # refused here, before any work, when it is missing
    configs = {**CONFIGS, **(PEER_CONFIGS if peer else {})}
    names = list(configs) if not only else only
    unknown = [n for n in names if n not in configs]
    if unknown:
        hint = "" if peer else f" ({', '.join(PEER_CONFIGS)} needs --peer gpytorch)"
        raise InputError(f"--only: unknown configuration(s) {unknown}; choose from {list(configs)}{hint}")
    racers: list[str] = []
    if store is not None or problem is not None:
        if store is None or problem is None:
            raise InputError("the race at equal time needs both --store and --problem")
        if not Path(store).exists():
            raise InputError(f"--store {store}: no such store")
        if not (budget > 0 and math.isfinite(budget)):
            raise InputError(f"--budget must be a finite number of seconds > 0, got {budget}")
        racers = list(learners or RACE_LEARNERS)
        bad = [n for n in racers if n not in LEARNERS]
        if bad:
            raise InputError(f"--learners: unknown learner(s) {bad}")
        for name in racers:
            preset_options(learner_class(name), preset)  # a learner without the preset is refused here
        if peer:
            racers.append(PEER_SVGP)
    cuda = device.startswith("cuda")
    name_of_device = device_name(device)
    config = {"device": device, "device_name": name_of_device, "dtype": dtype_name(dtype), "repeats": repeats, "N_m": N_M,
              "D": D, "P": P, "threads": torch.get_num_threads(), "peer": peer}
    if racers:
        config.update(race={"store": str(store), "problem": problem, "budget_s": budget, "learners": racers,
                            "preset": preset, "peer_lr": peer_lr, "seed": seed, "batch": N_M,
                            "clock": "wall, synced" if cuda else "process CPU"})
    run = RunDir.create("bench-learners", config, out)
    # the table as it fills, the ratio, the race and the run folder are the command's result: stdout, not the log
    print(f"gpdyn bench learners on {device} ({name_of_device}), {dtype_name(dtype)}, {torch.get_num_threads()} thread(s)")
    mem = "CUDA allocator" if cuda else "process RSS"
    print(f"{'configuration':20s} {'ms/step':>10s} {'CPU ms':>10s} {'GPU ms':>10s} {'predict ms':>10s} {'base MB':>8s} {'peak MB':>8s} {'step +MB':>8s}   ({mem})", flush=True)
    results = {}
    for key in names:
        name, sizes = configs[key]
        r = run_isolated(name, sizes, device, dtype, repeats)
        results[key] = r
        run.log(config=key, **r)
        print(f"{key:20s} {r['step_s'] * 1e3:10.1f} {r['step_cpu_s'] * 1e3:10.1f} {_fmt_ms(r['step_gpu_s']):>10s} {r['predict_s'] * 1e3:10.1f} "
              f"{_fmt_mb(r['base_mb']):>8s} {_fmt_mb(r['peak_mb']):>8s} {_fmt_mb(r['step_growth_mb']):>8s}", flush=True)
    summary: dict[str, Any] = {"results": results, "memory": mem, "device_name": name_of_device}
    if "svdgp-4096" in results and "svdgp-16384" in results:
        # on the CPU the process time is the one to compare: wall time also counts what
        # other processes on a shared machine take (the step uses the configured threads)
        key = "step_s" if cuda else "step_cpu_s"
        ratio = results["svdgp-16384"][key] / results["svdgp-4096"][key]
        wall_ratio = results["svdgp-16384"]["step_s"] / results["svdgp-4096"]["step_s"]
        summary["svdgp_ratio_16384_over_4096"] = ratio
        summary["svdgp_wall_ratio_16384_over_4096"] = wall_ratio
        print(f"SVDGP step time ratio M_alpha 16384 / 4096 ({'wall' if key == 'step_s' else 'CPU'} time): {ratio:.2f} "
              f"(linear: 4.0, limit 4.5) -> {'ok' if ratio <= 4.5 else 'TOO HIGH'}; wall-time ratio {wall_ratio:.2f}")
    race_lines: list[str] = []
    if racers:
        print(f"race: {', '.join(racers)} on {problem} ({store}), {budget:g} {'wall' if cuda else 'CPU'} s each", flush=True)
        raced = race(racers, store, problem, preset=preset, budget=budget, device=device, dtype=dtype, seed=seed,
                     peer_lr=peer_lr)
        for key, r in raced.items():
            run.log(race=key, **{k: v for k, v in r.items() if k != "problem"})
        summary["race"] = raced
        race_lines = race_table(raced, cuda)
        print("\n".join(race_lines), flush=True)
    run.write_json("bench.json", summary)
    lines = [f"# gpdyn bench learners ({device}: {name_of_device}, {dtype_name(dtype)}, N_m={N_M}, D={D}, P={P}, "
             f"{torch.get_num_threads()} thread(s))", "",
             f"Memory: {mem}; base = before the timed steps, peak = during them, step = peak - base. "
             "GPU ms: CUDA events around each step (n/a on the CPU).", "",
             "| configuration | ms/step (wall) | CPU ms/step | GPU ms/step | predict ms (N_m points) | base MB | peak MB | step MB |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {k} | {r['step_s'] * 1e3:.1f} | {r['step_cpu_s'] * 1e3:.1f} | {_fmt_ms(r['step_gpu_s'])} | {r['predict_s'] * 1e3:.1f} | "
              f"{_fmt_mb(r['base_mb'])} | {_fmt_mb(r['peak_mb'])} | {_fmt_mb(r['step_growth_mb'])} |" for k, r in results.items()]
    if "svdgp_ratio_16384_over_4096" in summary:
        lines += ["", f"SVDGP M_alpha 16384/4096 step-time ratio: {summary['svdgp_ratio_16384_over_4096']:.2f} (limit 4.5; "
                  f"{'wall' if cuda else 'CPU'} time; wall-time ratio {summary['svdgp_wall_ratio_16384_over_4096']:.2f})"]
    if race_lines:
        first = next(iter(summary["race"].values()))
        dims = f"D={first['problem']['input_dim']}, P={first['problem']['output_dim']}"
        lines += ["", f"## nMSE at equal time: {problem} ({dims}; {first['rows']['train']} training rows, {first['rows']['test']} "
                  f"held out, iid), {budget:g} {'wall' if cuda else 'CPU'} s each", "",
                  f"Every learner takes the same seeded minibatches of N_m = {N_M} rows; gpdyn's at their "
                  f"'{preset}' preset, {PEER_SVGP} with SVI's M and Adam at lr {peer_lr:g}. Cells: held-out nMSE "
                  "(mean over outputs) and, in brackets, the steps taken by then.", "", *race_lines]
    (run.path / "report.md").write_text("\n".join(lines) + "\n")
    print(f"run folder: {run.path}")
    return run, summary

