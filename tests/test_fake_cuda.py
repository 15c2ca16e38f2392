"""GPU readiness without a GPU: every learner and planner on a fake accelerator, on any machine.

``tests/test_cuda_sync.py`` counts host syncs on a real GPU and is skipped without one. This
file runs the same calls under torch's :class:`~torch._subclasses.fake_tensor.FakeTensorMode`,
which computes shapes, dtypes and devices but no values, so that a CPU-only machine finds
the two faults that only show on a GPU:

- a host tensor mixed into device work (a tensor made without ``device=``, a CPU generator
  drawing device numbers): the fake mode raises ``FakeTensorDeviceMismatchError`` as a GPU
  raises its "Expected all tensors to be on the same device";
- a host sync: reading a device value back (``.item()``, ``float()``, ``bool()``,
  ``.tolist()``, a 0-d tensor as an index), an operation whose output size depends on the
  values (``nonzero``, boolean masks, ``unique``), a ``torch.linalg`` call that checks its
  result on the host (``cholesky``, ``inv``, ``solve``, ``eigh``, ``svd``), a blocking copy
  between host and device (``.cpu()``, ``torch.tensor(data, device=...)``). :class:`Monitor`
  raises :class:`HostSync` naming the operation and the gpdyn function it came from.

The fake device is torch's ``meta`` device, not ``cuda``: a CPU-only torch build registers
no CUDA device guard, so fake ``cuda`` tensors cannot be written in place from Python
(``Tensor.copy_``, ``t[i] = v``), cannot be moved to ``"cuda"`` without an index, and any
autograd on them (every learner's ``step``) aborts the process in
``c10::impl::getDeviceGuardImpl``. ``meta`` behaves as a GPU does where it matters here:
gpdyn's code takes its non-CPU paths, a CPU operand other than a 0-d scalar is refused,
and no value can be read back. What ``meta`` does not take are the branches written for
``device.type == "cuda"`` alone (the variational learners' pinned index copies); those
run in ``tests/test_cuda_sync.py``.

What each call may sync is the contract of ``tests/test_cuda_sync.py``: ``predict``,
``predict_mean``, ``predict_y`` and ``step`` never; ``observe`` where it validates its
input (:meth:`gpdyn.gp.base.Learner.check_inputs`) and where a learner documents a
host-side first-batch initialisation; a planner's rollout never, its ``plan`` where it
reads its :class:`~gpdyn.control.mpc.PlanInfo` and checks the plan on the host. Each such
place is an explicit allowance (the gpdyn function, and why), and every allowance must be
used: one that no longer syncs fails its test, so the list never outlives the code.

Values a fake tensor does not have are answered where the host must read them (during
construction, and at an allowed sync) as data that passes every check would give:
``isfinite``/``all`` true, ``any`` false, a count of a true mask its size, other integers 0,
other numbers 1, a copy to the host zeros. A CPU tensor's value (Adam's step counter) is
no sync and is answered the same way.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping

import mujoco
import numpy as np
import pytest
import torch
from test_cuda_sync import OPTIONS, SYNC_FREE_OBSERVE
from test_spline_sampling import SLIDER
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from gpdyn.control.dynamics import LearnedDynamics
from gpdyn.robots.layout import StateLayout
from gpdyn.control.mpc import PLANNERS, MPCConfig, make_planner
from gpdyn.control.spline_sampling import LearnedForward, SamplerConfig, SplineSampler
from gpdyn.data.problems import Normalizer
from gpdyn.gp import LEARNERS, make_learner
from gpdyn.robots.walker import LAYOUT, NU, NX, WALKER
from gpdyn.robots.legged import ACTION_HIGH, ACTION_LOW, TorchPolicy

DEVICE = torch.device("meta")  # the fake accelerator (module docs)
DTYPE = torch.float32  # a GPU's default
D, P = LAYOUT.input_dim, LAYOUT.nv  # walker-1: 23 -> 9, as tests/test_cuda_sync.py
N = 64
#: one fake mode for the whole file: per-device constants that gpdyn caches (the walker
#: cost's bounds) stay valid from one test to the next
FAKE = FakeTensorMode(allow_non_fake_inputs=True)

aten = torch.ops.aten
#: operations that wait for a GPU, and what each is
SYNC_OPS = {
    aten._local_scalar_dense.default: "a device value read on the host",
    aten._linalg_check_errors.default: "a torch.linalg result checked on the host",
    aten._linalg_eigh.default: "torch.linalg.eigh, checked for convergence on the host",
    aten._linalg_svd.default: "torch.linalg.svd, checked for convergence on the host",
    aten.linalg_eig.default: "torch.linalg.eig, computed on the host",
    aten.nonzero.default: "an output sized by the values (nonzero, a boolean mask)",
    aten.masked_select.default: "an output sized by the values (masked_select)",
    aten._unique2.default: "an output sized by the values (unique)",
    aten.unique_dim.default: "an output sized by the values (unique)",
    aten.unique_consecutive.default: "an output sized by the values (unique_consecutive)",
    aten.repeat_interleave.Tensor: "an output sized by the values (repeat_interleave)",
    aten.bincount.default: "an output sized by the values (bincount)",
    aten.equal.default: "torch.equal, a Python bool",
    aten.allclose.default: "torch.allclose, a Python bool",
}
#: indexing by tensors: a boolean mask becomes nonzero inside the fake mode, out of the
#: dispatcher's sight, and a host index tensor is copied to the device (both allowed by the fake mode)
INDEXING = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}
HOST_DATA = {torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor}


class HostSync(AssertionError):
    """A host sync where the contract promises none."""


class DeviceMixing(AssertionError):
    """Host state where device state is due (what a GPU refuses)."""


def gpdyn_site() -> str:
    """``module.function`` of the innermost gpdyn frame on the stack (the code that asked)."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module == "gpdyn" or module.startswith("gpdyn."):
            return f"{module}.{frame.f_code.co_qualname}"
        frame = frame.f_back
    return "(outside gpdyn)"


class Monitor:
    """What may sync where; see the module docs.

    Outside :meth:`call` (construction and setup) every sync is answered. Inside, a sync
    at a site of ``allowed`` is answered and recorded; anywhere else it raises
    :class:`HostSync` (and is recorded, so that code which swallows the error still
    fails the call).
    """

    def __init__(self) -> None:
        self.label: str | None = None
        self.allowed: Mapping[str, str] = {}
        self.used: set[str] = set()
        self.violations: list[str] = []
        self.device_generators: list[torch.Generator] = []

    @contextlib.contextmanager
    def call(self, label: str, allowed: Mapping[str, str] | None = None) -> Iterator[None]:
        """Check the syncs of the calls inside; ``allowed``: site -> why it may sync. Every
        allowance must be used."""
        self.label, self.allowed, self.used, self.violations = label, dict(allowed or {}), set(), []
        try:
            yield
        finally:
            self.label = None
        if self.violations:
            raise HostSync(f"{label}: {self.violations[0]}")
        stale = sorted(set(self.allowed) - self.used)
        assert not stale, f"{label}: allowed syncs that did not happen (remove them): {stale}"

    def sync(self, what: str) -> None:
        """A sync (``what``) happened: raise unless it is allowed here."""
        if self.label is None:
            return
        site = gpdyn_site()
        if site in self.allowed:
            self.used.add(site)
            return
        self.violations.append(f"{what} in {site}")
        raise HostSync(f"{self.label}: {what} in {site}")


def _truth(t: object) -> object:
    return getattr(t, "_fake_truth", None)


def _answer(t: torch.Tensor) -> bool | int | float:
    """The value a host read of the fake 0-d ``t`` gets (module docs)."""
    truth = _truth(t)
    if truth is not None:
        return truth
    if t.dtype == torch.bool:
        return True
    return 0 if not t.is_floating_point() and not t.is_complex() else 1.0


class _Dispatch(TorchDispatchMode):
    """Sees every aten operation before the fake mode runs it."""

    def __init__(self, monitor: Monitor) -> None:
        super().__init__()
        self.monitor = monitor

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = args[0] if args else None
        on_device = isinstance(first, torch.Tensor) and first.device == DEVICE
        if func in SYNC_OPS and on_device:
            self.monitor.sync(f"{SYNC_OPS[func]} ({func})")
        elif func.overloadpacket in INDEXING and on_device:
            indices = [i for i in args[1] if isinstance(i, torch.Tensor)]
            if any(i.dtype in (torch.bool, torch.uint8) for i in indices):
                self.monitor.sync(f"a boolean mask index, an output sized by the values ({func})")
            elif any(i.device.type == "cpu" for i in indices):
                self.monitor.sync(f"a host index tensor, copied to the device before use ({func})")
        elif func is aten._to_copy.default and isinstance(first, torch.Tensor):
            dst = torch.device(kwargs.get("device", first.device))
            if dst.type == "cpu" and on_device:
                self.monitor.sync(f"a copy from the device to the host ({func})")
                with unset_fake_temporarily():  # real zeros: the host may hand them to numpy
                    return torch.zeros(first.shape, dtype=kwargs.get("dtype") or first.dtype)
            if dst == DEVICE and first.device.type == "cpu" and not kwargs.get("non_blocking", False):
                self.monitor.sync(f"a blocking copy from the host to the device ({func})")
        elif func is aten.copy_.default and first.device != args[1].device and args[1].ndim > 0:
            if not (first.device == DEVICE and len(args) > 2 and args[2]):  # non_blocking host-to-device
                self.monitor.sync(f"a blocking copy between host and device ({func})")
        if func is aten._local_scalar_dense.default:
            return _answer(first)
        if func is aten._linalg_check_errors.default:
            return None
        out = func(*args, **kwargs)
        self._tag(func, args, out)
        return out

    @staticmethod
    def _tag(func, args, out) -> None:
        """The truth of checks, for :func:`_answer`: isfinite and all true, any false (module docs)."""
        if not isinstance(out, torch.Tensor) or out.dtype not in (torch.bool, torch.int64):
            return
        packet = func.overloadpacket
        inner = _truth(args[0]) if args and isinstance(args[0], torch.Tensor) else None
        if packet is aten.all:
            out._fake_truth = True if inner is None else bool(inner)
        elif packet is aten.any:
            out._fake_truth = False if inner is None else bool(inner)
        elif packet in (aten.logical_not, aten.bitwise_not) and inner is not None:
            out._fake_truth = not inner
        elif packet in (aten.sum, aten.count_nonzero) and isinstance(inner, bool) and args[0].dtype == torch.bool:
            out._fake_truth = args[0].numel() // max(out.numel(), 1) if inner else 0


class _Functions(TorchFunctionMode):
    """Sees the Python-level calls the dispatcher never shows: tensors made from host data
    on the device, and generators."""

    def __init__(self, monitor: Monitor) -> None:
        super().__init__()
        self.monitor = monitor

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_DATA:
            data = args[1] if func is torch.Tensor.new_tensor else (args[0] if args else kwargs.get("data"))
            target = kwargs.get("device", args[0].device if func is torch.Tensor.new_tensor else None)
            if target is not None and torch.device(target) == DEVICE and not isinstance(data, torch.Tensor):
                self.monitor.sync(f"a blocking copy of host data to the device ({func.__name__})")
        if func is torch.Tensor.numpy:
            return self._numpy(args[0])
        generator = kwargs.get("generator")
        if generator is not None and not any(generator is g for g in self.monitor.device_generators):
            target = kwargs.get("device") or next((a.device for a in args if isinstance(a, torch.Tensor)), None)
            if target is not None and torch.device(target) == DEVICE:
                raise DeviceMixing(f"{func.__name__} in {gpdyn_site()}: a CPU generator draws device numbers "
                                   "(a GPU refuses it: pass the device's generator)")
        out = func(*args, **kwargs)
        if func in (torch.isfinite, torch.Tensor.isfinite) and isinstance(out, torch.Tensor):
            out._fake_truth = True  # composite: the dispatcher sees only its comparisons
        return out

    @staticmethod
    def _numpy(t: torch.Tensor) -> np.ndarray:
        """A real tensor's numbers (its operations would otherwise run fake), zeros for a fake
        host tensor's; a device tensor has none on the host (a GPU raises too)."""
        if not isinstance(t, FakeTensor):
            with unset_fake_temporarily():
                return t.numpy()
        if t.device.type != "cpu":
            raise DeviceMixing(f"numpy() of a {t.device} tensor in {gpdyn_site()}: copy it to the host first")
        with unset_fake_temporarily():
            return torch.zeros(t.shape, dtype=t.dtype).numpy()


@contextlib.contextmanager
def fake_device() -> Iterator[Monitor]:
    """The fake accelerator and its :class:`Monitor`."""
    monitor = Monitor()
    with FAKE, _Functions(monitor), _Dispatch(monitor):
        yield monitor


@contextlib.contextmanager
def device_generators(monitor: Monitor, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``torch.Generator(device=DEVICE)`` inside: a CPU generator standing in for the device's,
    which the fake mode cannot make (the fake ops draw no numbers)."""
    real = torch.Generator

    def generator(device: str | torch.device = "cpu") -> torch.Generator:
        if torch.device(device) != DEVICE:
            return real(device)
        made = real("cpu")
        monitor.device_generators.append(made)
        return made

    with monkeypatch.context() as patch:
        patch.setattr(torch, "Generator", generator)
        yield


def on_device(t: torch.Tensor, shape: tuple[int, ...]) -> None:
    """``t`` is a device tensor of ``shape`` and the learner's dtype (never a host copy)."""
    assert isinstance(t, torch.Tensor) and t.device == DEVICE, f"{type(t).__name__} on {getattr(t, 'device', None)}"
    assert t.shape == shape and t.dtype == DTYPE, (tuple(t.shape), t.dtype)


# -- learners ---------------------------------------------------------------------------------
CHECK_VALUES = "gpdyn.gp.base.Learner.check_inputs"
#: observe: the base class validates its input on the host (gpdyn.gp.base.ENTRY_POINTS,
#: observe checks values on the device), except where a learner promises no sync
#: (tests/test_cuda_sync.py SYNC_FREE_OBSERVE: WISKI with validate=False, once its grid is set)
OBSERVE_SYNCS = {CHECK_VALUES: "observe validates its input values on the host (Learner.check_inputs)"}
#: the first observe's host-side initialisation, where a learner documents one
FIRST_OBSERVE_SYNCS: dict[str, dict[str, str]] = {
    "wiski": {"gpdyn.gp.wiski.WISKI.pretrain": "the first data run the batch phase, which returns its loss as a float"},
    "ssgp": {  # SSGP's module docs, "Hyperparameters"
        "gpdyn.gp.ssgp.SSGP._start": "the first batch selects the hyperparameters by an evidence search on the host",
        "gpdyn.gp.ssgp.SSGP._search_lambda": "best_lambda's grid search returns floats (documented host sync)",
        "gpdyn.gp.ssgp.SSGP._spectrum": "the evidence's eigendecomposition (best_lambda: a host sync on a GPU)",
    },
}
FIRST_OBSERVE_SYNCS["svdgp-stream"] = FIRST_OBSERVE_SYNCS["ssgp"] | {  # the same selection (StreamSVDGP's module docs)
    "gpdyn.gp.svdgp_stream.StreamSVDGP.observe": "the first batch draws alpha with the learner's (host) generator"}
#: a learner's own checks at every observe, beside the base class's
EVERY_OBSERVE_SYNCS: dict[str, dict[str, str]] = {
    "residual": {"gpdyn.gp.base.Learner.check_finite":
                 "the residual y - prior(x) is checked for NaN on the host: a diverged prior is refused"},
}
#: a learner's own host decisions at the observes after the first
LATER_OBSERVE_SYNCS: dict[str, dict[str, str]] = {
    "svdgp-stream": {"gpdyn.gp.svdgp_stream.StreamSVDGP._grow":
                     "which rows join alpha is decided on the host (StreamSVDGP's module docs, the bases)"},
}


def fake_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of fake rows (no values: the fake mode draws nothing)."""
    return torch.randn(N, D, device=DEVICE, dtype=DTYPE), torch.randn(N, P, device=DEVICE, dtype=DTYPE)


#: fewer iterations of the first batch's loops than the small preset's: each runs the same
#: operations again, and a fake operation costs as much as a real one on a small problem
FEWER_ITERATIONS = {"wiski": {"init_iters": 2}, "ssgp": {"select_iters": 2}, "svdgp-stream": {"select_iters": 2}}


def fake_learner(name: str):
    """Learner ``name`` at the small preset on the fake device, with test_cuda_sync's options."""
    options = {**OPTIONS.get(name, {}), **FEWER_ITERATIONS.get(name, {})}
    if name == "residual":  # a frozen prior learner under the residual GP
        prior = make_learner("svdgp", D, P, preset="small", device=DEVICE, dtype=DTYPE, seed=0)
        x, y = fake_batch()
        prior.observe(x, y)
        prior.step(x, y)
        options["prior"] = prior
    return make_learner(name, D, P, preset="small", device=DEVICE, dtype=DTYPE, seed=0, **options)


@pytest.mark.parametrize("name", list(LEARNERS))
@pytest.mark.slow
def test_learner_on_a_fake_gpu(name):
    """observe, step, predict, predict_mean and predict_y on a fresh learner, then observe, step
    and predict_mean again (the steady state: the data, the optimiser and the caches exist),
    each call's syncs checked."""
    with fake_device() as monitor:
        learner = fake_learner(name)
        for round_, calls in enumerate((("predict", "predict_mean", "predict_y"), ("predict_mean",))):
            x, y = fake_batch()
            allowed = {} if round_ and name in SYNC_FREE_OBSERVE else dict(OBSERVE_SYNCS)
            allowed.update(EVERY_OBSERVE_SYNCS.get(name, {}))
            allowed.update((LATER_OBSERVE_SYNCS if round_ else FIRST_OBSERVE_SYNCS).get(name, {}))
            with monitor.call(f"{name}.observe #{round_}", allowed):
                learner.observe(x, y)
            with monitor.call(f"{name}.step #{round_}"):
                metrics = learner.step(x, y)
            for key, value in metrics.items():  # device tensors stay there (a read back would have been a sync)
                assert not isinstance(value, torch.Tensor) or value.device == DEVICE, (key, value)
            for call in calls:
                with monitor.call(f"{name}.{call} #{round_}"):
                    out = getattr(learner, call)(x)
                for t in out if isinstance(out, tuple) else (out,):
                    on_device(t, (N, P))


# -- planners ---------------------------------------------------------------------------------
K, H = 8, 3
#: what a plan reads on the host by design (gpdyn.control.mpc.Planner.plan: PlanInfo's floats,
#: the checks of the state and of the plan before it is applied); the rollout reads nothing
PLAN_SYNCS = {
    "gpdyn.control.mpc.Planner._check_state": "the measured state is checked for NaN on the host",
    "gpdyn.control.mpc.Planner.plan": "the action is checked for NaN before it is applied (the fallback)",
}
FIRST_PLAN_SYNCS = {"gpdyn.control.mpc.Planner._initial_nominal": "the first nominal plan is checked for NaN"}
OPTIMISE_SYNCS = {
    "mppi": {"gpdyn.control.mpc.MPPI._optimise": "PlanInfo's floats",
             "gpdyn.control.mpc._finite_summary": "the finite samples' fraction, a float of PlanInfo",
             "gpdyn.control.mpc._finite_std": "PlanInfo's cost spread"},
    "cem": {"gpdyn.control.mpc.CEM._optimise": "the best cost's finiteness and PlanInfo's floats, once per plan"},
}
PLANNER_LEARNER = "svdgp"


def fake_walker_dynamics() -> LearnedDynamics:
    """The walker-1 model of the planners' learner, fed one batch, with the identity normaliser."""
    learner = fake_learner(PLANNER_LEARNER)
    learner.observe(*fake_batch())
    normalizer = Normalizer(np.zeros(D), np.ones(D), np.zeros(P), np.ones(P))
    return LearnedDynamics.from_learner(learner, normalizer, LAYOUT)


PENALTY = {"uncertainty": "penalty", "var_weight": 1.0}  # the rollout through predict
MEAN = {"uncertainty": "mean"}  # through predict_mean
#: a sampled prediction, offsets to the proposal, its tail after the horizon, MPPI's control cost
SAMPLE_RELATIVE_TAIL = {"uncertainty": "sample", "relative_to_proposal": True, "proposal_tail": 1, "control_cost": 1.0}


# every registered planner through predict; the rollout's other modes are shared code, run by MPPI
PLANNER_CASES = [(name, "penalty", PENALTY) for name in PLANNERS] + [
    ("mppi", "mean", MEAN), ("mppi", "sample-relative-tail", SAMPLE_RELATIVE_TAIL)]


@pytest.mark.parametrize(("planner_name", "options"), [(name, options) for name, _, options in PLANNER_CASES],
                         ids=[f"{name}-{mode}" for name, mode, _ in PLANNER_CASES])
@pytest.mark.slow
def test_planner_on_a_fake_gpu(planner_name, options, monkeypatch):
    """Two plans (the first and a warm-started one) and a rollout through a learned walker model
    with the TRPO proposal and critic; the rollout never syncs."""
    from gpdyn.robots.policy import load_policy

    trpo = load_policy()  # read on the host, before the fake mode
    with fake_device() as monitor:
        dynamics = fake_walker_dynamics()
        policy = TorchPolicy(trpo, DEVICE, DTYPE)
        cost = WALKER.cost()
        state = torch.zeros(NX, device=DEVICE, dtype=DTYPE)
        state[1] = 1.25  # standing height
        cost(state[None], torch.zeros(1, NU, device=DEVICE, dtype=DTYPE), state[None])  # its per-device constants
        cfg = MPCConfig(horizon=H, samples=K, iterations=2, **options)
        with device_generators(monitor, monkeypatch):
            planner = make_planner(planner_name, dynamics, cost, [ACTION_LOW] * NU, [ACTION_HIGH] * NU, cfg,
                                   proposal=policy, terminal_value=policy.value, device=DEVICE, dtype=DTYPE, seed=0)
        warm = {**PLAN_SYNCS, **OPTIMISE_SYNCS[planner_name]}
        first = dict(warm)
        if not cfg.relative_to_proposal:  # the first nominal: the proposal's rollout, checked (zero offsets are not)
            first.update(FIRST_PLAN_SYNCS)
        with monitor.call(f"{planner_name}.plan (first)", first):
            action, info = planner.plan(state)
        assert not info.fallback, info.fallback
        on_device(action, (NU,))
        with monitor.call(f"{planner_name}.plan (warm start)", warm):
            planner.plan(state)
        with monitor.call(f"{planner_name}.rollout"):
            roll = planner.rollout(state, planner.nominal, planner.noise_std.expand(H, NU))
        on_device(roll.costs, (K,))
        on_device(roll.actions, (K, H, NU))


#: the sampler plans on the host (numpy): per plan one copy of the start state and the
#: controls to the device and one of the paths back (gpdyn.control.spline_sampling.LearnedForward)
FORWARD_SYNCS = {"gpdyn.control.spline_sampling.LearnedForward.rollout":
                 "the host's state and controls to the device and the paths back, once per plan"}


def test_spline_sampler_on_a_fake_gpu():
    """The spline sampler through a learned slider model on the device: only the copies in and out."""
    model = mujoco.MjModel.from_xml_string(SLIDER)
    layout = StateLayout(nq=1, nv=1, nu=1, dt=0.01, position_inputs=(0,))
    cfg = SamplerConfig(samples=4, horizon=4, stride=1, knots=2, integrator="euler")

    def path_cost(qpos, qvel, controls):
        return ((qpos[..., 0] - 0.5) ** 2).sum(-1)

    with fake_device() as monitor:
        learner = make_learner("exact", layout.input_dim, layout.nv, preset="small", device=DEVICE, dtype=DTYPE)
        learner.observe(torch.randn(N, layout.input_dim, device=DEVICE, dtype=DTYPE),
                        torch.randn(N, layout.nv, device=DEVICE, dtype=DTYPE))
        normalizer = Normalizer(np.zeros(layout.input_dim), np.ones(layout.input_dim), np.zeros(1), np.ones(1))
        dynamics = LearnedDynamics.from_learner(learner, normalizer, layout)
        forward = LearnedForward(dynamics, layout.nq, cfg.stride, device=DEVICE, dtype=DTYPE)
        sampler = SplineSampler(model, path_cost, 0.01, -1.0, 1.0, cfg, seed=0, forward=forward)
        for step in range(2):
            with monitor.call(f"spline sampler plan #{step}", FORWARD_SYNCS):
                action, record = sampler.plan(np.zeros(2))
            assert action.shape == (1,) and np.isfinite(record["plan_cost"])


def test_the_arm_filters_gp_of_the_angles_on_a_fake_gpu():
    """The GP of the joint angles (its interpolation rows and prior, the rigid-body filter's design and covariance
    blocks) on the device: built there from device angles, and its rows and prior without a host sync. The filter
    around it runs MuJoCo's regressor on the host (gpdyn/gp/rigid_body.py), so this is the part a GPU would run."""
    from gpdyn.gp.angle_gp import AngleGPBasis

    with fake_device() as monitor:
        basis = AngleGPBasis(torch.randn(N, 7, device=DEVICE, dtype=DTYPE), points=6)
        with monitor.call("AngleGPBasis.rows and prior", {}):
            rows, prior = basis.rows(torch.randn(5, 7, device=DEVICE, dtype=DTYPE)), basis.prior()
        assert rows.shape == (5, 42) and prior.shape == (42, 42) and rows.device == prior.device == torch.device(DEVICE)


# -- the harness itself ------------------------------------------------------------------------
def test_the_fake_device_catches_what_a_gpu_refuses():
    """Each fault the module docs name raises; reads outside a checked call get the module docs'
    answers; an allowance that is never used fails."""
    with fake_device() as monitor:
        x = torch.ones(4, 3, device=DEVICE, dtype=DTYPE)
        for read in (lambda: x.sum().item(), lambda: bool((x > 0).all()), lambda: x.tolist(),
                     lambda: x[x > 0], lambda: torch.linalg.cholesky(x.T @ x), lambda: torch.linalg.eigh(x.T @ x),
                     lambda: x.cpu(), lambda: torch.tensor([1.0, 2.0], device=DEVICE),
                     lambda: torch.ones(3).to(DEVICE), lambda: x[torch.zeros((), dtype=torch.long, device=DEVICE)],
                     lambda: x[torch.tensor([0, 2])]):
            with pytest.raises(HostSync):
                with monitor.call("harness"):
                    read()
        with pytest.raises(Exception, match="same device|expected device"):
            x + torch.ones(3)
        with pytest.raises(DeviceMixing, match="CPU generator"):
            torch.randn(3, device=DEVICE, generator=torch.Generator())
        with monitor.call("harness"):  # no sync: queued work, a 0-d CPU scalar, an async host copy, CPU values
            (x * torch.tensor(2.0)).sum()
            torch.ones(3).to(DEVICE, non_blocking=True)
            assert torch.ones(3).sum().item() == 1.0  # a CPU read: answered, never a sync
        # answers: the checks pass, counts are full
        assert bool(torch.isfinite(x).all()) and not bool((x > 0).any()) and int(torch.isfinite(x).sum()) == 12
        assert float(x.sum()) == 1.0
        host = x.cpu()  # real zeros, which the host can hand to numpy
        assert not isinstance(host, FakeTensor) and host.shape == (4, 3) and host.numpy().sum() == 0.0
        with pytest.raises(AssertionError, match="did not happen"):  # a stale allowance
            with monitor.call("harness", {"gpdyn.somewhere": "no longer syncs"}):
                x * 2
