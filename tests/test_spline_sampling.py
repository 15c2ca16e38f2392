"""The spline predictive-sampling planner: splines, a known system, and Walker2d walking on the true model."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from gpdyn.control.spline_sampling import SamplerConfig, SamplingController, SplineSampler, linear_spline_matrix
from gpdyn.errors import InputError
from gpdyn.experiments.walk_true_model import walk
from gpdyn.robots.legged import WalkingCost

# a unit mass on a frictionless slider, pushed by a motor of gear 1 (force in N)
SLIDER = """
<mujoco>
  <option timestep="0.01"/>
  <worldbody>
    <body name="cart">
      <joint name="x" type="slide" axis="1 0 0" damping="0.5"/>
      <geom type="box" size="0.1 0.1 0.1" mass="1" contype="0" conaffinity="0"/>
    </body>
  </worldbody>
  <actuator><motor joint="x" gear="1" ctrlrange="-1 1"/></actuator>
</mujoco>
"""


def test_linear_spline_reproduces_linear_sequences():
    w = linear_spline_matrix(horizon=20, knots=4)
    assert w.shape == (20, 4)
    np.testing.assert_allclose(w.sum(1), 1.0)
    knots = np.linspace(0.0, 19.0, 4)
    np.testing.assert_allclose(w @ (3.0 * knots - 1.0), 3.0 * np.arange(20) - 1.0, atol=1e-12)
    np.testing.assert_allclose(w[0], [1, 0, 0, 0])
    np.testing.assert_allclose(w[-1], [0, 0, 0, 1])


@pytest.mark.parametrize("temperature", [0.0, 0.2])
@pytest.mark.slow
def test_sampler_drives_a_slider_to_its_target(temperature):
    model = mujoco.MjModel.from_xml_string(SLIDER)
    data = mujoco.MjData(model)
    target = 0.5

    def cost(qpos, qvel, controls):
        return (10 * (qpos[..., 0] - target) ** 2 + 0.1 * qvel[..., 0] ** 2).sum(-1)

    cfg = SamplerConfig(samples=16, horizon=30, stride=2, knots=4, noise_std=0.5, temperature=temperature,
                        integrator="euler")
    sampler = SplineSampler(model, cost, 0.01, -1.0, 1.0, cfg, seed=0)
    for _ in range(300):
        action, record = sampler.plan(np.concatenate([data.qpos, data.qvel]))
        assert np.all(np.abs(action) <= 1.0) and np.isfinite(record["plan_cost"])
        data.ctrl[:] = action
        mujoco.mj_step(model, data)
    assert abs(data.qpos[0] - target) < 0.05, data.qpos[0]
    assert abs(data.qvel[0]) < 0.2
    assert model.opt.timestep == 0.01  # the plant keeps its own step; the planner has a copy


def test_sampler_rollout_matches_the_plant_at_the_same_step():
    model = mujoco.MjModel.from_xml_string(SLIDER)
    sampler = SplineSampler(model, lambda q, v, u: q[..., 0].sum(-1), 0.01, -1.0, 1.0,
                            SamplerConfig(horizon=5, knots=2, stride=1, integrator="euler"), seed=0)
    controls = np.full((1, 5, 1), 0.7)
    states = sampler.rollout(np.zeros(2), controls)
    q, v = states[..., :1], states[..., 1:]
    data = mujoco.MjData(model)
    for t in range(5):
        data.ctrl[:] = 0.7
        mujoco.mj_step(model, data)
        np.testing.assert_allclose(q[0, t], data.qpos, rtol=1e-12)
        np.testing.assert_allclose(v[0, t], data.qvel, rtol=1e-12)


@pytest.mark.slow
def test_walker_walks_with_the_true_model():
    record = walk(seed=0, steps=200, config=SamplerConfig(), cost=WalkingCost())
    assert not record["fell"] and record["length"] == 200
    assert record["distance_m"] > 0.6, record  # 1.6 s: past the start-up, moving forward


@pytest.mark.parametrize("option", [dict(samples=1), dict(knots=1), dict(knots=40, horizon=32), dict(noise_std=0.0),
                                    dict(temperature=float("nan")), dict(integrator="leapfrog"), dict(stride=0)])
def test_impossible_options_are_refused_by_name(option):
    name = next(iter(option))
    with pytest.raises(InputError, match=name):
        SamplerConfig(**option).validate()


def test_a_wrong_state_shape_is_refused():
    model = mujoco.MjModel.from_xml_string(SLIDER)
    sampler = SplineSampler(model, lambda q, v, u: q[..., 0].sum(-1), 0.01, -1.0, 1.0)
    with pytest.raises(InputError, match=r"state of shape \(3,\), expected \(2,\)"):
        sampler.plan(np.zeros(3))
    with pytest.raises(InputError, match="reset"):
        SamplingController(WalkingCost(), 0.008).act(np.zeros(17), {})


def test_learned_forward_holds_each_control_for_stride_steps():
    import torch

    from gpdyn.control.spline_sampling import LearnedForward

    def dynamics(state, action):  # a double integrator: q' = q + dt v, v' = v + dt u
        q, v = state[:, :1], state[:, 1:]
        return torch.cat([q + 0.1 * v, v + 0.1 * action], dim=-1)

    forward = LearnedForward(dynamics, nq=1, stride=2)
    controls = np.array([[[1.0], [0.0]], [[-1.0], [2.0]]])  # K = 2 samples, H = 2 planning steps
    states = forward.rollout(np.zeros(2), controls)
    q, v = states[..., :1], states[..., 1:]
    assert q.shape == (2, 2, 1) and v.shape == (2, 2, 1)
    for k in range(2):
        state = np.zeros(2)
        for t in range(2):
            for _ in range(2):
                state = np.array([state[0] + 0.1 * state[1], state[1] + 0.1 * controls[k, t, 0]])
            np.testing.assert_allclose([q[k, t, 0], v[k, t, 0]], state, rtol=1e-12)
    # as the sampler's planning model: the sampler rolls through it, not through MuJoCo
    model = mujoco.MjModel.from_xml_string(SLIDER)
    sampler = SplineSampler(model, lambda q, v, u: ((q[..., 0] - 0.3) ** 2).sum(-1), 0.01, -1.0, 1.0,
                            SamplerConfig(horizon=10, knots=3, stride=2), forward=forward)
    np.testing.assert_allclose(sampler.rollout(np.zeros(2), controls), states)
    # one planning step of each of K starts: the rollout's first step
    np.testing.assert_allclose(forward.predict_mean(np.zeros((2, 2)), controls[:, 0]), states[:, 0])
