"""The one planner interface and the one planning-model interface (gpdyn/control/planner.py): who implements them,
that a path model's one step is its rollout's first, and that one controller drives every planner."""

from __future__ import annotations

from collections.abc import Mapping

import mujoco
import numpy as np
import pytest
import torch

from gpdyn.control.controllers import MPCController
from gpdyn.control.dynamics import LearnedDynamics, SimDynamics
from gpdyn.control.hybrid_model import HybridForward, ResidualConfig
from gpdyn.control.identified_model import IdentificationConfig, IdentifiedForward
from gpdyn.control.mpc import CEM, MPPI, MPCConfig, PlanInfo
from gpdyn.control.planner import PathModel, Planner, PlanningController, PlanningModel, env_state
from gpdyn.control.spline_sampling import LearnedForward, MujocoForward, SamplerConfig, SamplingController, SplineSampler
from gpdyn.data.problems import Normalizer
from gpdyn.errors import InputError
from gpdyn.experiments.walk_learned_model import nominal_model
from gpdyn.gp import make_learner
from gpdyn.robots.layout import StateLayout
from gpdyn.robots.legged import WalkingCost
from gpdyn.robots.walker import DT, make_env
from gpdyn.sim.loop import run_episode
from test_spline_sampling import SLIDER
from walker_transitions import transitions

torch.set_num_threads(1)



def _slider_cost(qpos, qvel, controls):
    return ((qpos[..., 0] - 0.5) ** 2).sum(-1)


def _torch_cost(x, u, nxt):
    return (nxt[:, 0] - 0.5) ** 2, None


def _learned_dynamics() -> LearnedDynamics:
    layout = StateLayout(nq=1, nv=1, nu=1, dt=0.01, position_inputs=(0,))
    learner = make_learner("exact", layout.input_dim, layout.nv, preset="small", dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    learner.observe(torch.randn(20, layout.input_dim, generator=gen, dtype=torch.float64),
                    torch.randn(20, layout.nv, generator=gen, dtype=torch.float64))
    normalizer = Normalizer(np.zeros(layout.input_dim), np.ones(layout.input_dim), np.zeros(1), np.ones(1))
    return LearnedDynamics.from_learner(learner, normalizer, layout)


def test_every_planner_implements_the_planner_interface():
    model = mujoco.MjModel.from_xml_string(SLIDER)
    sim = SimDynamics(model, 1)
    planners = [cls(sim, _torch_cost, [-1.0], [1.0], MPCConfig(horizon=4, samples=8)) for cls in (MPPI, CEM)]
    planners.append(SplineSampler(model, _slider_cost, 0.01, -1.0, 1.0, SamplerConfig(horizon=4, knots=2, samples=4)))
    for planner in planners:
        assert isinstance(planner, Planner), type(planner)
        planner.reset()
        action, info = planner.plan(np.array([0.1, 0.0]))  # [qpos, qvel]; the torch planners take numpy too
        assert np.asarray(action).shape == (1,) and isinstance(info, Mapping) and len(info) > 0
    info = planners[0].plan(torch.tensor([0.1, 0.0], dtype=torch.float64))[1]
    assert isinstance(info, PlanInfo) and dict(info) == info.as_dict() and info["cost"] == info.cost
    with pytest.raises(KeyError):
        info["no such field"]


def test_every_planning_model_implements_the_model_interface():
    model = mujoco.MjModel.from_xml_string(SLIDER)
    walker = nominal_model()
    learned = _learned_dynamics()
    torch_models = [learned, SimDynamics(model, 1)]
    path_models = [MujocoForward(model, 0.01, 2, "euler"), LearnedForward(learned, nq=1, stride=2),
                   HybridForward(walker, DT), IdentifiedForward(walker, DT)]
    for m in torch_models + path_models:
        assert isinstance(m, PlanningModel), type(m)
    for m in path_models:
        assert isinstance(m, PathModel), type(m)
    for m in torch_models:
        nxt = m.predict_mean(torch.zeros(3, 2, dtype=torch.float64), torch.ones(3, 1, dtype=torch.float64))
        assert nxt.shape == (3, 2) and bool(torch.isfinite(nxt).all())
    # the simulator's one step is MuJoCo's
    data = mujoco.MjData(model)
    data.ctrl[:] = 0.7
    mujoco.mj_step(model, data)
    got = SimDynamics(model, 1).predict_mean(torch.zeros(1, 2, dtype=torch.float64), torch.full((1, 1), 0.7,
                                                                                                dtype=torch.float64))
    np.testing.assert_allclose(got[0].numpy(), np.concatenate([data.qpos, data.qvel]), rtol=1e-12)


def test_a_path_models_step_is_its_rollouts_first_from_each_start():
    """``predict_mean`` of K states is, row by row, the first step of a rollout from that state; for the MuJoCo
    planning model it is MuJoCo's own step at the planning time step."""
    model = mujoco.MjModel.from_xml_string(SLIDER)
    forward = MujocoForward(model, 0.01, stride=2, integrator="euler")
    states = np.array([[0.0, 0.0], [0.3, -1.0], [-0.2, 0.5]])
    actions = np.array([[0.7], [-0.4], [1.0]])
    step = forward.predict_mean(states, actions)
    plan_model = forward.model
    assert plan_model.opt.timestep == pytest.approx(0.02) and model.opt.timestep == 0.01
    for k in range(3):
        data = mujoco.MjData(plan_model)
        data.qpos[:], data.qvel[:], data.ctrl[:] = states[k, :1], states[k, 1:], actions[k]
        mujoco.mj_step(plan_model, data)
        np.testing.assert_allclose(step[k], np.concatenate([data.qpos, data.qvel]), rtol=1e-12)
        np.testing.assert_array_equal(step[k], forward.rollout(states[k], actions[k : k + 1, None])[0, 0])
    with pytest.raises(InputError, match="state of shape"):
        forward.rollout(np.zeros(3), np.zeros((1, 2, 1)))


@pytest.mark.parametrize("learned", [ResidualConfig(warmup=6, space="velocity"), ResidualConfig(warmup=6, space="force"),
                                     IdentificationConfig(warmup=4)])
def test_learned_path_models_step_each_start_as_their_rollout_does(learned):
    walker = nominal_model()
    forward = (IdentifiedForward(walker, DT, config=learned) if isinstance(learned, IdentificationConfig)
               else HybridForward(walker, DT, config=learned))
    data = transitions("weak_motor", 0.3, 8, seed=2)
    for q, v, u, nv in data:
        forward.observe(q, v, u, nv)
    assert forward.in_use
    states = np.stack([np.concatenate([q, v]) for q, v, _, _ in data[-3:]])
    actions = np.random.default_rng(0).uniform(-1, 1, (3, 6))
    step = forward.predict_mean(states, actions)
    for k in range(3):
        np.testing.assert_allclose(step[k], forward.rollout(states[k], actions[k : k + 1, None])[0, 0], atol=1e-12)


def test_one_controller_drives_either_planner_on_walker2d():
    """The base controller itself runs MPPI (on the true simulator) and the spline sampler in the episode loop;
    the MPC and sampling controllers are it with their records."""
    cost = WalkingCost()

    def sampler(env):
        m = env.unwrapped.model
        return SplineSampler(m, cost, DT, -1.0, 1.0, SamplerConfig(samples=4, horizon=8, knots=3), seed=0)

    def mppi(env):
        return MPPI(SimDynamics(env.unwrapped.model, 4), lambda x, a, nx: ((nx[:, 1] - 1.25) ** 2, None),
                    -torch.ones(6), torch.ones(6), MPCConfig(horizon=3, samples=6))

    controllers = [PlanningController("sampler", sampler), PlanningController("mppi", mppi),
                   SamplingController(cost, DT, SamplerConfig(samples=4, horizon=8, knots=3)),
                   MPCController("mpc", mppi, env_state)]
    for controller in controllers:
        env = make_env()
        episode = run_episode(env, controller, steps=3, reset_seed=1)
        env.close()
        assert episode.record["length"] == 3, controller.name
        assert np.all(np.abs(episode.rows["action"]) <= 1.0)
    with pytest.raises(InputError, match="reset"):
        PlanningController("none", sampler).act(np.zeros(17), {})
