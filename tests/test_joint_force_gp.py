"""The GP force of each actuated joint's own angle and velocity, alone and inside the identified planning model."""

from __future__ import annotations

import numpy as np
import pytest
from walker_transitions import transitions

from gpdyn.control.hybrid_model import HybridForward
from gpdyn.control.identified_model import IdentificationConfig, IdentifiedForward
from gpdyn.control.joint_force_gp import JointForceGP
from gpdyn.control.spline_sampling import SamplerConfig
from gpdyn.errors import InputError
from gpdyn.experiments.walk_learned_model import nominal_model
from gpdyn.robots.walker import DT

KNEE = 4  # the right knee (leg_joint): its qpos and qvel index in Walker2d


def _states(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
    qpos, qvel = np.zeros((rows, 9)), rng.uniform(-8, 8, (rows, 9))
    qpos[:, 3:] = rng.uniform(-1.5, 0.0, (rows, 6))
    return qpos, qvel


def test_a_spring_damper_fitted_by_the_basis_is_the_force_and_its_summary() -> None:
    """Whitened weights fitted by least squares to a 50 N m/rad spring and 5 N m s/rad damper at the knee give that
    force through the planner's table and report it as such; the other joints stay at zero."""
    gp = JointForceGP(nominal_model(), points=8, std=60.0, lengthscale=1.0, velocity_range=10.0)
    rng = np.random.default_rng(0)
    qpos, qvel = _states(rng, 400)
    spring = -50.0 * qpos[:, KNEE] - 5.0 * qvel[:, KNEE]
    knee = gp.names.index("leg_joint")
    rows = np.stack([gp.features(q, v)[knee] for q, v in zip(qpos, qvel, strict=True)])  # [400, 2 points]
    weights = np.zeros(gp.size)
    block = slice(knee * 2 * gp.points, (knee + 1) * 2 * gp.points)
    weights[block] = np.linalg.lstsq(rows, spring, rcond=None)[0]
    gp.set_weights(weights)
    force = gp.force(qpos, qvel)
    np.testing.assert_allclose(force[:, KNEE], rows @ weights[block], atol=0.05)  # the table is the basis
    assert np.abs(force[:, KNEE] - spring).max() < 1.0
    assert np.abs(np.delete(force, KNEE, axis=1)).max() == 0.0
    summary = gp.stiffness_damping()
    assert summary["stiffness:leg_joint"] == pytest.approx(50.0, rel=0.05)
    assert summary["damping:leg_joint"] == pytest.approx(5.0, rel=0.05)
    assert abs(summary["stiffness:thigh_joint"]) < 1e-9
    copied = gp.copy()
    gp.set_weights(np.zeros(gp.size))
    assert np.abs(copied.force(qpos, qvel)[:, KNEE] - spring).max() < 1.0  # the copy keeps its own weights


def test_inputs_outside_the_grid_keep_the_edge_value() -> None:
    gp = JointForceGP(nominal_model(), points=6, std=30.0, lengthscale=1.0, velocity_range=10.0)
    gp.set_weights(np.random.default_rng(1).standard_normal(gp.size))
    qpos, qvel = np.zeros((2, 9)), np.zeros((2, 9))
    qvel[:, KNEE] = [10.0, 25.0]  # the velocity range's edge, and beyond it
    force = gp.force(qpos, qvel)
    np.testing.assert_allclose(force[0], force[1])


@pytest.mark.parametrize("bad", [{"points": 3}, {"std": 0.0}, {"lengthscale": -1.0}, {"velocity_range": 0.0}])
def test_impossible_options_are_refused(bad: dict[str, float]) -> None:
    options = {"points": 6, "std": 30.0, "lengthscale": 1.0, "velocity_range": 10.0, **bad}
    with pytest.raises(InputError, match="joint force GP"):
        JointForceGP(nominal_model(), **options)
    name = {"points": "joint_gp_points", "std": "joint_gp_std", "lengthscale": "joint_gp_lengthscale",
            "velocity_range": "joint_gp_velocity_range"}[next(iter(bad))]
    with pytest.raises(InputError, match=f"option {name}"):
        IdentificationConfig(**{name: next(iter(bad.values()))}).validate()


def test_a_residual_on_top_of_the_joint_gp_is_refused() -> None:
    with pytest.raises(InputError, match="joint GP"):
        HybridForward(nominal_model(), DT, identification=IdentificationConfig(joint_gp_points=6))


@pytest.mark.slow
def test_identified_model_learns_a_knee_spring_with_the_joint_gp() -> None:
    """With a spring-damper added at the right knee, the joint GP learns the knee's force in the same regression as
    the parameters: it predicts the executed transitions better than the parameters alone, its force at the visited
    states follows the spring's, and its rollouts apply the force (they differ from the identified model's own)."""
    config = {"friction_geoms": ["foot_geom", "foot_left_geom"], "sensitivity": "planning", "warmup": 5}
    data = transitions("joint_spring", None, 120, seed=0)
    models = {"parameters": IdentifiedForward(nominal_model(), DT, config=IdentificationConfig(**config)),
              "joint_gp": IdentifiedForward(nominal_model(), DT, config=IdentificationConfig(
                  joint_gp_points=6, joint_gp_std=60.0, **config))}
    errors: dict[str, list[float]] = {name: [] for name in models}  # each transition's, predicted before it is learned
    for q, v, u, nv in data:
        for name, forward in models.items():
            forward.observe(q, v, u, nv)
            if forward.active and len(errors[name]) < len(forward.check):
                errors[name].append(forward.check._errors[-1][0])
    late = {name: np.mean(e[-60:]) for name, e in errors.items()}
    assert late["joint_gp"] < 0.7 * late["parameters"], late
    forward = models["joint_gp"]
    qpos, qvel = np.stack([d[0] for d in data]), np.stack([d[1] for d in data])
    spring = -50.0 * qpos[:, KNEE] - 5.0 * qvel[:, KNEE]  # the knee's added force at the visited states
    learned = forward.joint_gp.force(qpos, qvel)[:, KNEE]
    assert np.corrcoef(learned, spring)[0, 1] > 0.8 and ((learned - spring) ** 2).mean() < 0.6 * spring.var()
    forward.check.trusted = True
    cfg = SamplerConfig()
    state = np.concatenate(data[-1][:2])
    controls = np.random.default_rng(0).uniform(-1, 1, (3, cfg.horizon, 6))
    with_force = forward.rollout(state, controls)
    forward.joint_gp.set_weights(np.zeros(forward.joint_gp.size))
    assert np.abs(with_force - forward.rollout(state, controls)).max() > 1e-2


def test_with_no_force_the_stepwise_plan_is_the_identified_models_own() -> None:
    """With the joint GP in use but its weights at zero, the plan one step at a time (the force entering each step)
    is the identified planning model's whole-horizon rollout; with weights, only the actuated joints are pushed."""
    cfg = SamplerConfig()
    forward = IdentifiedForward(nominal_model(), DT, cfg.stride, cfg.integrator,
                                IdentificationConfig(warmup=1, joint_gp_points=6))
    forward.observed = forward.config.warmup  # built; the check trusts it before its first transitions
    state = np.concatenate([nominal_model().qpos0, np.zeros(9)])
    state[1] = 1.25
    controls = np.random.default_rng(0).uniform(-1, 1, (4, cfg.horizon, 6))
    stepwise = forward.rollout(state, controls)
    forward.joint_gp, gp = None, forward.joint_gp
    whole = forward.rollout(state, controls)
    np.testing.assert_allclose(stepwise, whole, atol=1e-6)
    forward.joint_gp = gp
    gp.set_weights(np.random.default_rng(1).standard_normal(gp.size))
    pushed = forward.rollout(state, controls)
    assert np.abs(pushed[:, 0, 9 + 3 :] - whole[:, 0, 9 + 3 :]).max() > 1e-3  # the joints' velocities after a step


def test_before_its_warmup_the_gp_stays_at_zero_and_the_parameters_are_those_without_it() -> None:
    base = {"friction_geoms": ["foot_geom", "foot_left_geom"], "sensitivity": "planning", "warmup": 5}
    plain = IdentifiedForward(nominal_model(), DT, config=IdentificationConfig(**base))
    waiting = IdentifiedForward(nominal_model(), DT, config=IdentificationConfig(
        joint_gp_points=6, joint_gp_warmup=12, **base))
    data = transitions("weak_motor", 0.3, 14, seed=3)
    for i, (q, v, u, nv) in enumerate(data):
        plain.observe(q, v, u, nv)
        waiting.observe(q, v, u, nv)
        if i < 10:
            np.testing.assert_allclose(waiting.theta, plain.theta, rtol=1e-9, atol=1e-12)
            assert not waiting.joint_gp.weights.any()
    assert waiting.joint_gp.weights.any()  # from its warm-up on, the GP's weights are estimated
