"""The identified planning model: the nominal MuJoCo plant with its physical parameters learned online."""

from __future__ import annotations

import copy

import mujoco
import numpy as np
import pytest
from walker_transitions import transitions

from gpdyn.control.hybrid_model import HybridSamplingController
from gpdyn.control.identified_model import IdentificationConfig, IdentifiedForward, PlantParameters
from gpdyn.control.online_check import GATE_MIN
from gpdyn.control.spline_sampling import MujocoForward, SamplerConfig
from gpdyn.errors import InputError
from gpdyn.experiments.walk_learned_model import WalkLearnedConfig, nominal_model, plant
from gpdyn.recipes import load_recipe
from gpdyn.robots.walker import DT, WALKER
from gpdyn.robots.legged import WalkingCost

FEET = ["foot_geom", "foot_left_geom"]


def _learn(change: str, factor: float | None, steps: int, seed: int = 0, **options: object) -> IdentifiedForward:
    forward = IdentifiedForward(nominal_model(), DT, config=IdentificationConfig(friction_geoms=FEET, **options))
    for q, v, u, nv in transitions(change, factor, steps, seed):
        forward.observe(q, v, u, nv)
    return forward


def test_parameters_name_every_body_gear_and_geom_and_apply_relative_changes() -> None:
    model = nominal_model()
    params = PlantParameters(model, IdentificationConfig(friction_geoms=FEET))
    assert params.names[:2] == ["mass:torso", "mass:thigh"] and "gear:thigh_joint" in params.names
    assert params.names[-2:] == ["friction:foot_geom", "friction:foot_left_geom"] and params.size == 7 + 6 + 2
    theta = np.zeros(params.size)
    theta[params.names.index("mass:torso")] = 0.3
    theta[params.names.index("gear:thigh_joint")] = -0.7
    theta[params.names.index("friction:foot_geom")] = -0.5
    changed = params.model(theta)
    expected = copy.deepcopy(model)
    WALKER.apply_plant_change(expected, "torso_mass", 1.3)
    WALKER.apply_plant_change(expected, "weak_motor", 0.3)
    expected.geom_friction[model.geom("foot_geom").id, 0] *= 0.5
    for name in ("body_mass", "body_inertia", "actuator_gear", "geom_friction"):
        np.testing.assert_allclose(getattr(changed, name), getattr(expected, name), rtol=1e-12)
    np.testing.assert_array_equal(model.body_mass, params.nominal.body_mass)  # the nominal is never touched


def test_identified_plan_is_the_true_models_plan_when_the_parameters_are_right() -> None:
    changed = nominal_model()
    WALKER.apply_plant_change(changed, "torso_mass", 1.3)
    cfg = SamplerConfig()
    truth = MujocoForward(changed, DT, cfg.stride, cfg.integrator)
    forward = IdentifiedForward(nominal_model(), DT, cfg.stride, cfg.integrator, IdentificationConfig(warmup=1))
    env, _ = plant("none", None)
    env.reset(seed=3)
    state = np.concatenate([env.unwrapped.data.qpos, env.unwrapped.data.qvel])
    env.close()
    controls = np.random.default_rng(0).uniform(-1, 1, (4, cfg.horizon, 6))
    nominal = forward.rollout(state, controls)  # nothing observed: the nominal planning model
    assert not forward.in_use
    forward.observed = forward.config.warmup
    forward.theta[forward.parameters.names.index("mass:torso")] = 0.3
    forward.parameters.apply(forward.identified_plan, forward.theta)
    want = truth.rollout(state, controls)
    np.testing.assert_array_equal(forward.rollout(state, controls), want)
    assert np.abs(nominal - want).max() > 1e-3


@pytest.mark.parametrize(("change", "factor", "parameter"), [("torso_mass", 1.3, "mass:torso"),
                                                              ("weak_motor", 0.3, "gear:thigh_joint"),
                                                              ("foot_friction", 0.5, "friction:foot_geom")])
@pytest.mark.slow
def test_identifies_each_plant_change_and_leaves_the_rest_near_nominal(change: str, factor: float, parameter: str) -> None:
    forward = _learn(change, factor, 80)
    factors = forward.factors()
    assert factors[parameter] == pytest.approx(factor, abs=0.06)
    others = [abs(f - 1) for name, f in factors.items() if name != parameter and not
              (change == "foot_friction" and name.startswith("friction:"))]  # the left foot's may not have slipped
    assert max(others) < 0.2
    assert forward.in_use


@pytest.mark.slow
def test_planning_model_sensitivities_find_the_changed_parameter_with_a_bias() -> None:
    """sensitivity="planning": the Jacobian of one coarse planning step (16 ms, implicit) instead of the plant's
    (RK4 at 2 ms) finds the weakened gear and the heavier torso as the plant's does, and moves the halved foot
    friction the right way but not all of it (the coarse step's contacts differ)."""
    for change, factor, parameter, tolerance in (("weak_motor", 0.3, "gear:thigh_joint", 0.06),
                                                 ("torso_mass", 1.3, "mass:torso", 0.06),
                                                 ("foot_friction", 0.5, "friction:foot_geom", 0.25)):
        factors = _learn(change, factor, 80, sensitivity="planning").factors()
        assert factors[parameter] == pytest.approx(factor, abs=tolerance), (change, factors[parameter])
        assert abs(factors[parameter] - 1) > 0.25  # it moved away from the nominal value


def test_nominal_plant_is_identified_as_nominal_and_the_check_switches_off_what_does_not_help() -> None:
    forward = _learn("none", None, 60)
    assert max(abs(f - 1) for f in forward.factors().values()) < 0.03
    # the nominal plant: the identified parameters predict no better than the nominal ones, so they are not used
    assert len(forward.check) >= GATE_MIN and not forward.check.trusted and forward.distrusted_steps > 0
    assert _learn("none", None, 60, gate_window=0).in_use  # without the check: always used after warm-up


def test_snapshot_is_frozen_and_rollouts_need_no_learning() -> None:
    forward = _learn("torso_mass", 1.3, 25, warmup=5)
    snap = forward.snapshot()
    before = snap.factors()
    for q, v, u, nv in transitions("torso_mass", 1.3, 15, seed=4):
        forward.observe(q, v, u, nv)
    assert snap.factors() == before and forward.factors() != before
    assert snap.observed == 25 and forward.observed == 40


def test_window_forgets_old_transitions() -> None:
    """After a plant change the estimate follows the new plant once the window holds only its transitions."""
    forward = _learn("torso_mass", 1.3, 30, window=30)
    for q, v, u, nv in transitions("none", None, 30, seed=1):
        forward.observe(q, v, u, nv)
    assert forward.factors()["mass:torso"] == pytest.approx(1.0, abs=0.03)


@pytest.mark.parametrize("bad", [{"prior_std": 0.0}, {"noise_std": float("nan")}, {"window": 0}, {"warmup": 0},
                                 {"fd_step": -1.0}, {"min_factor": 1.5}, {"max_factor": 0.9}, {"gate_margin": 1.5},
                                 {"gate_window": -1}, {"friction_geoms": ["foot_geom", "foot_geom"]},
                                 {"sensitivity": "analytic"},
                                 {"bodies": False, "actuators": False}])
def test_impossible_options_are_refused_naming_the_option(bad: dict[str, object]) -> None:
    with pytest.raises(InputError, match="identification: option " + next(iter(bad))
                       if "bodies" not in bad else "nothing to identify"):
        IdentificationConfig(**bad).validate()


def test_bad_input_is_refused() -> None:
    with pytest.raises(InputError, match="no geom"):
        IdentifiedForward(nominal_model(), DT, config=IdentificationConfig(friction_geoms=["hand"]))
    with pytest.raises(InputError, match="multiple"):
        IdentifiedForward(nominal_model(), 0.003)
    forward = IdentifiedForward(nominal_model(), DT)
    q, v, u, nv = transitions("none", None, 1, seed=0)[0]
    with pytest.raises(InputError, match="sizes"):
        forward.observe(q, v, u[:1], nv)
    with pytest.raises(InputError, match="non-finite"):
        forward.observe(q, v * np.nan, u, nv)
    assert forward.observed == 0


def test_controller_and_experiment_take_the_identified_model() -> None:
    model = nominal_model()
    controller = HybridSamplingController(WalkingCost(), DT, model, learned=IdentificationConfig())
    assert isinstance(controller.forward, IdentifiedForward)
    assert controller.summary()["online_learner"] == "parameters"  # what its records name as learnt online
    with pytest.raises(InputError, match="model must be one of"):
        WalkLearnedConfig(model="gp").validate()
    recipe = load_recipe("walker-learned-parameters", "walker-learned")
    config = recipe.build("run", identification=recipe.build("identification"))
    config.validate()
    assert config.model == "parameters" and config.learned.friction_geoms == FEET
    assert load_recipe("walker-learned-hip", "walker-learned").build("run").model == "residual"
    assert mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, FEET[0]) >= 0
