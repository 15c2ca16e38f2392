"""The hybrid planning model (nominal MuJoCo + online GP residual) and the walk_learned_model experiment."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpdyn.control.hybrid_model import HybridForward, HybridSamplingController, ResidualConfig
from gpdyn.control.identified_model import IdentificationConfig
from gpdyn.control.spline_sampling import SamplerConfig, SplineSampler
from gpdyn.errors import InputError
from gpdyn.experiments.walk_learned_model import WalkLearnedConfig, episode, nominal_model, plant
from gpdyn.robots.walker import DT
from gpdyn.robots.legged import WalkingCost
from walker_transitions import transitions as _transitions

torch.set_num_threads(1)


def test_zero_residual_is_the_planning_model() -> None:
    model = nominal_model()
    cfg = SamplerConfig()
    sampler = SplineSampler(model, WalkingCost(), DT, -1.0, 1.0, cfg)
    forward = HybridForward(model, DT, cfg.stride, cfg.integrator)
    env, _ = plant("none", None)
    env.reset(seed=3)
    state = np.concatenate([env.unwrapped.data.qpos, env.unwrapped.data.qvel])
    controls = np.random.default_rng(0).uniform(-1, 1, (5, cfg.horizon, 6))
    expected = sampler.rollout(state, controls)
    np.testing.assert_array_equal(forward.rollout(state, controls), expected)
    # a built residual GP fitted to zero residuals (the nominal plant): its stepwise rollout is the same paths
    for space in ("velocity", "force"):  # stepwise with a velocity residual; one call with an applied force
        zero = HybridForward(model, DT, cfg.stride, cfg.integrator, ResidualConfig(warmup=4, space=space))
        for q0, v0, u, nv in _transitions("none", None, 6, seed=1):
            zero.observe(q0, v0, u, nv)
        assert zero.active
        np.testing.assert_allclose(zero.rollout(state, controls), expected, atol=1e-9)
    env.close()


def test_residual_target_is_zero_on_the_nominal_plant_and_not_on_a_changed_one() -> None:
    forward = HybridForward(nominal_model(), DT)
    for change, factor, zero in (("none", None, True), ("weak_motor", 0.1, False)):
        q, v, u, nv = (np.stack(a) for a in zip(*_transitions(change, factor, 10, seed=2), strict=True))
        r = forward.target(q, v, u, nv)
        assert (np.abs(r).max() < 1e-9) == zero, (change, np.abs(r).max())


def test_online_residual_reduces_held_out_error_on_a_changed_plant() -> None:
    data = _transitions("weak_motor", 0.1, 100, seed=4)
    train, test = data[:80], data[80:]  # held out: the 20 planning steps after the ones it learned from
    forward = HybridForward(nominal_model(), DT, config=ResidualConfig(warmup=20, space="velocity"))  # linear in the action
    for q, v, u, nv in train:
        forward.observe(q, v, u, nv)
    q, v, u, nv = (np.stack(a) for a in zip(*test, strict=True))
    r = forward.target(q, v, u, nv)
    pred = forward.residual(q, v, u.mean(1))
    assert ((r - pred) ** 2).sum() < 0.5 * (r**2).sum()  # the frozen (zero) residual's error is (r**2).sum()


@pytest.mark.parametrize("model", ["residual", "parameters"])
@pytest.mark.slow
def test_short_online_run_learns_and_reports(model: str) -> None:
    config = WalkLearnedConfig(seeds=[0], steps=60, eval_every=30, eval_horizon=8, model=model,
                               residual=ResidualConfig(warmup=20))
    record, diagnostics = episode("online", "weak_motor", 0, config, WalkingCost(), nominal_model())
    assert record["length"] >= 30 and record["residual_points"] >= 20 and record["residual_active"]
    assert ("identified" in record) == (model == "parameters")
    assert record["cpu_ms_per_step"] > 0 and np.isfinite(record["return"])
    assert diagnostics and all(-1 <= d["spearman_online"] <= 1 for d in diagnostics)


@pytest.mark.parametrize("bad", [{"seeds": []}, {"steps": 0}, {"changes": ["gravity"]}, {"controllers": ["oracle"]},
                                 {"explore_std": -1.0}, {"factors": {"weak_motor": 0.0}}])
def test_bad_config_is_an_input_error(bad: dict) -> None:
    with pytest.raises(InputError):
        WalkLearnedConfig(**bad).validate()


def test_bad_residual_config_is_an_input_error() -> None:
    with pytest.raises(InputError, match="kernel"):
        ResidualConfig(kernel="rbf").validate()
    with pytest.raises(InputError, match="warmup"):
        ResidualConfig(warmup=1).validate()


@pytest.mark.parametrize("residual", [ResidualConfig(warmup=10, space="velocity"),
                                      ResidualConfig(kernel="linear", linear_inputs="all", warmup=10, space="velocity"),
                                      ResidualConfig(learner="wiski", warmup=10, space="velocity",
                                                     learner_options={"incremental_rows": 100})])
def test_hybrid_rollout_is_nominal_step_plus_residual(residual: ResidualConfig) -> None:
    """The batched rollout (residual of the action predicted ahead for all K x H, or per step from the state)
    equals stepping the nominal planning model one step at a time and adding the residual to qvel and dt * it to qpos."""
    forward = HybridForward(nominal_model(), DT, config=residual)
    data = _transitions("weak_motor", 0.1, 12, seed=5)
    for q, v, u, nv in data:
        forward.observe(q, v, u, nv)
    q, v = data[0][0], data[0][1]
    controls = np.random.default_rng(1).uniform(-1, 1, (4, 6, 6))
    paths = forward.rollout(np.concatenate([q, v]), controls)
    got_q, got_v = paths[..., : q.size], paths[..., q.size :]
    qs, vs = np.repeat(q[None], 4, 0), np.repeat(v[None], 4, 0)
    for t in range(6):
        r = forward.residual(qs, vs, controls[:, t])
        assert np.abs(r).max() > 1e-3  # the residual is on
        qs, vs = forward.nominal_step(qs, vs, controls[:, t])
        qs, vs = qs + forward.dt * r, vs + r
        np.testing.assert_allclose(got_q[:, t], qs, atol=1e-8)
        np.testing.assert_allclose(got_v[:, t], vs, atol=1e-8)


@pytest.mark.slow
def test_force_residual_enters_the_rollout_as_applied_force_and_helps_a_weak_motor() -> None:
    """space="force": the residual is a generalized force of the action alone, applied inside each MuJoCo step;
    the rollout equals the planning model with that force in qfrc_applied, and on held-out transitions of the
    weak hip it predicts the velocity better than the nominal model."""
    import mujoco

    forward = HybridForward(nominal_model(), DT, config=ResidualConfig(space="force", warmup=20))
    data = _transitions("weak_motor", 0.1, 100, seed=4)
    for q, v, u, nv in data[:80]:
        forward.observe(q, v, u, nv)
    q, v, u, nv = (np.stack(a) for a in zip(*data[80:], strict=True))
    hybrid = forward.predict_mean(np.concatenate([q, v], 1), u.mean(1))[:, q.shape[1] :]
    nominal = np.stack([forward.nominal_step(q[i : i + 1], v[i : i + 1], u[i : i + 1].mean(1))[1][0] for i in range(len(q))])
    assert ((hybrid - nv) ** 2).sum() < 0.8 * ((nominal - nv) ** 2).sum()
    # the same step by hand: the predicted force in qfrc_applied of the planning model
    force = forward.residual(q[:1], v[:1], u[:1].mean(1))[0]
    data_ = mujoco.MjData(forward.model)
    data_.qpos[:], data_.qvel[:], data_.ctrl[:], data_.qfrc_applied[:] = q[0], v[0], u[0].mean(0), force
    mujoco.mj_step(forward.model, data_)
    np.testing.assert_allclose(hybrid[0], data_.qvel, atol=1e-8)


def test_contact_force_target_recovers_a_weak_hip_where_the_inertia_inversion_spreads_it() -> None:
    """A weakened hip is the force -(1 - f) gear u on its own joint. The contact target finds that force
    (close on the hip, near zero elsewhere) and reproduces the observed velocity through the nominal
    plant; the inertia inversion M dv / dt, blind to the ground, misses it while a foot is down."""
    data = _transitions("weak_motor", 0.3, 40, seed=5)[10:]  # after the drop onto the ground
    q, v, u, nv = (np.stack(a) for a in zip(*data, strict=True))
    truth = np.zeros_like(v)
    truth[:, 3] = -0.7 * 100.0 * u[:, :, 0].mean(1)  # actuator 0 (gear 100) drives dof 3, the right thigh
    contact = HybridForward(nominal_model(), DT, config=ResidualConfig(force_target="contact"))
    inertia = HybridForward(nominal_model(), DT, config=ResidualConfig(force_target="inertia"))
    got, blind = contact.target(q, v, u, nv), inertia.target(q, v, u, nv)
    err, blind_err = np.sqrt(((got - truth) ** 2).mean()), np.sqrt(((blind - truth) ** 2).mean())
    assert err < 0.5 * blind_err, (err, blind_err)
    # it reproduces the data to 2 % of what the nominal plant misses (a constant force over the planning step
    # stands for one that changes with the action between its two control steps)
    missed = np.abs(contact.nominal_plant(q, v, u) - nv).max()
    assert np.abs(contact.nominal_plant(q, v, u, got) - nv).max() < 0.02 * missed
    # on the actuated joints alone: the floating base gets no force, the hip keeps its estimate
    actuated = HybridForward(nominal_model(), DT, config=ResidualConfig(force_dofs="actuated"))
    np.testing.assert_array_equal(actuated.force_dofs, np.arange(3, 9))
    on_joints = actuated.target(q, v, u, nv)
    assert not on_joints[:, :3].any()
    assert np.sqrt(((on_joints - truth) ** 2).mean()) < 0.5 * blind_err
    for bad in ({"force_target": "exact"}, {"force_dofs": "root"}):
        with pytest.raises(InputError, match=next(iter(bad))):
            ResidualConfig(**bad).validate()


@pytest.mark.slow
def test_online_check_keeps_a_residual_that_predicts_and_drops_one_that_does_not() -> None:
    """Each transition is predicted before it is learned: on a weak hip the residual beats the nominal plant
    and stays in use; on transitions whose difference from the nominal plant is noise no force of the action
    explains, it predicts worse than none, and the planning model goes back to the nominal one."""
    cfg = ResidualConfig(warmup=10, gate_window=40)
    weak = HybridForward(nominal_model(), DT, config=cfg)
    for q, v, u, nv in _transitions("weak_motor", 0.1, 60, seed=6):
        weak.observe(q, v, u, nv)
    assert weak.in_use and weak.distrusted_steps < 25  # of the 50 checked: off only while its first fits are poor
    noisy = HybridForward(nominal_model(), DT, config=cfg)
    rng = np.random.default_rng(0)
    data = _transitions("none", None, 80, seed=7)
    for q, v, u, _ in data:
        nominal = noisy.nominal_plant(q[None], v[None], u[None])[0]
        noisy.observe(q, v, u, nominal + 0.5 * rng.standard_normal(nominal.shape))
    assert noisy.active and not noisy.in_use and noisy.distrusted_steps > 0
    q, v, u, _ = data[-1]
    assert not noisy.residual(q[None], v[None], u[:1]).any()
    controls = rng.uniform(-1, 1, (3, 8, 6))
    plain = HybridForward(nominal_model(), DT)
    state = np.concatenate([q, v])
    np.testing.assert_array_equal(noisy.rollout(state, controls), plain.rollout(state, controls))


@pytest.mark.slow
def test_online_check_margin_asks_the_residual_to_explain_a_share_of_the_error() -> None:
    """gate_margin: the residual stays in use only while its windowed error is below that share of the
    nominal plant's; a margin no residual can meet turns it off once the check has its first transitions."""
    from gpdyn.control.online_check import GATE_MIN

    data = _transitions("weak_motor", 0.1, 60, seed=6)
    verdicts = {}
    for margin in (1.0, 1e-6):
        model = HybridForward(nominal_model(), DT, config=ResidualConfig(warmup=10, gate_window=40, gate_margin=margin))
        for q, v, u, nv in data:
            model.observe(q, v, u, nv)
        verdicts[margin] = (model.in_use, model.distrusted_steps)
    assert verdicts[1.0][0] and not verdicts[1e-6][0]
    assert verdicts[1e-6][1] == 50 - (GATE_MIN - 1)  # every checked transition after the first GATE_MIN - 1
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(InputError, match="gate_margin"):
            ResidualConfig(gate_margin=bad).validate()


def test_force_space_needs_the_action_only_linear_kernel() -> None:
    with pytest.raises(InputError, match="space"):
        ResidualConfig(space="force", kernel="se").validate()
    with pytest.raises(InputError, match="space='force'.*needs target='plant'"):
        ResidualConfig(space="force", learner="wiski", target="planning").validate()
    ResidualConfig(space="force", learner="wiski").validate()  # a force of the state and the action
    with pytest.raises(InputError, match="learner='gp'"):
        ResidualConfig(space="velocity", learner="gp").validate()


def test_a_force_of_the_state_enters_each_planning_step_inside_mujoco() -> None:
    """A registered learner as the force residual: each planning step applies the force predicted from that
    step's own state and action (qfrc_applied), so the rollout equals stepping the planning model by hand."""
    import mujoco

    forward = HybridForward(nominal_model(), DT, config=ResidualConfig(learner="wiski", space="force", warmup=10))
    data = _transitions("joint_spring", None, 14, seed=5)
    for q, v, u, nv in data:
        forward.observe(q, v, u, nv)
    assert not forward.action_only and forward.in_use
    q, v = data[0][0], data[0][1]
    controls = np.random.default_rng(1).uniform(-1, 1, (3, 4, 6))
    paths = forward.rollout(np.concatenate([q, v]), controls)
    step = mujoco.MjData(forward.model)
    for k in range(3):
        step.qpos[:], step.qvel[:] = q, v
        for t in range(4):
            force = forward.residual(step.qpos[None].copy(), step.qvel[None].copy(), controls[k : k + 1, t])[0]
            assert np.abs(force).max() > 1e-6  # the residual is on
            step.ctrl[:], step.qfrc_applied[:] = controls[k, t], force
            mujoco.mj_step(forward.model, step)
            np.testing.assert_allclose(paths[k, t], np.concatenate([step.qpos, step.qvel]), atol=1e-8)


def test_a_registered_learner_as_the_residual_learns_online_and_names_itself() -> None:
    """WISKI as the velocity residual: built on the warm-up transitions, then one exact posterior update per
    transition (no optimiser steps by default); it predicts the held-out transitions of a knee spring, which no
    residual linear in the action can express, better than the zero residual."""
    from gpdyn.control.hybrid_model import HybridSamplingController
    from gpdyn.gp.wiski import CONTROL_INCREMENTAL_ROWS

    config = ResidualConfig(learner="wiski", warmup=20, space="velocity", gate_window=0)
    controller = HybridSamplingController(WalkingCost(), DT, nominal_model(), learned=config)
    forward = controller.forward
    data = _transitions("joint_spring", None, 80, seed=4)
    for q, v, u, nv in data[:60]:
        forward.observe(q, v, u, nv)
    assert type(forward.learner).name == "wiski" and forward.learner.incremental_rows == CONTROL_INCREMENTAL_ROWS
    q, v, u, nv = (np.stack(a) for a in zip(*data[60:], strict=True))
    r = forward.target(q, v, u, nv)
    assert ((r - forward.residual(q, v, u.mean(1))) ** 2).sum() < 0.9 * (r**2).sum()
    assert controller.summary()["online_learner"] == "wiski" and controller.summary()["gp_updates"] == 60


def test_summary_recovery_fraction() -> None:
    from gpdyn.experiments.walk_learned_model import summary

    def rec(c: str, seed: int, ret: float, length: int = 100) -> dict:
        return {"change": "weak_motor", "plant": "hip x0.1", "controller": c, "seed": seed, "return": ret,
                "length": length, "fell": length < 100, "speed_m_s": 1.0, "cpu_ms_per_step": 1.0}

    records = [rec("true", 0, 200), rec("true", 1, 200), rec("frozen", 0, 100, 50), rec("frozen", 1, 100, 50),
               rec("online", 0, 150), rec("online", 1, 190), rec("variant", 0, 100), rec("variant", 1, 100)]
    rows = {r["controller"]: r for r in summary(records, 100)}
    assert rows["online"]["recovery"] == pytest.approx(0.7) and rows["variant"]["recovery"] == pytest.approx(0.0)
    assert rows["frozen"]["falls"] == 2 and rows["online"]["walked_all"] == 2 and np.isnan(rows["true"]["recovery"])


def test_paired_statistics_pair_by_seed_and_bound_the_recovery() -> None:
    from gpdyn.experiments.walk_learned_model import paired, tables

    def rec(c: str, seed: int, ret: float, fell: bool = False) -> dict:
        return {"change": "weak_motor", "plant": "hip x0.1", "controller": c, "seed": seed, "return": ret,
                "length": 100, "fell": fell, "speed_m_s": 1.0, "cpu_ms_per_step": 1.0}

    true, frozen, online = [200.0, 220.0, 180.0, 210.0], [100.0, 150.0, 60.0, 90.0], [180.0, 200.0, 140.0, 170.0]
    records = [rec(c, s, r[s], fell=(c == "frozen" and s == 2)) for c, r in
               (("true", true), ("frozen", frozen), ("online", online)) for s in range(4)]
    records.append(rec("online", 9, 0.0))  # a seed without true and frozen runs is not paired
    (p,) = paired(records, resamples=2000)
    assert p["seeds"] == 4 and p["seed_list"] == [0, 1, 2, 3] and p["falls_frozen"] == 1
    gained = np.subtract(online, frozen)
    assert p["learner_minus_frozen"][0] == pytest.approx(gained.mean())
    assert p["learner_minus_frozen"][1] == pytest.approx(gained.std(ddof=1) / 2)
    assert p["recovery"] == pytest.approx(gained.mean() / np.subtract(true, frozen).mean())
    assert p["recovery_5"] <= p["recovery"] <= p["recovery_95"] and p["recovery_95"] < 1.0
    assert "Paired over seeds" in tables([], records, 100)


@pytest.mark.parametrize("every", [1, 2, 4])
def test_the_controller_learns_every_nth_transition_its_update_in_pieces(every: int) -> None:
    """update_every=1 learns at every control step the planning step ending there (s_0 -> s_2, s_1 -> s_3, ...);
    n > 1 the one ending at every n-th control step (n = 2: s_0 -> s_2, s_2 -> s_4, ..., none overlapping; n = 4:
    s_2 -> s_4, s_6 -> s_8, ...), its update in n pieces over n control steps, and checks every one. The model
    and the check equal those of a model that observed and checked those transitions at those steps, and each
    piece runs about 1/n of the plant simulation."""
    from gpdyn.control.hybrid_model import HybridSamplingController
    from gpdyn.robots.legged import state_rows
    from gpdyn.sim.loop import run_episode

    sampler = SamplerConfig(samples=4, horizon=8, knots=3)
    controller = HybridSamplingController(WalkingCost(), DT, nominal_model(), sampler,
                                          ResidualConfig(warmup=4, update_every=every), seed=0)
    env, _ = plant("weak_motor", 0.3)
    rows = run_episode(env, controller, steps=33, reset_seed=3, rows=state_rows, next_rows=("qpos", "qvel")).rows
    env.close()
    assert len(rows["action"]) == 33  # it did not fall
    # at control step tau the planning step s_{tau-1} -> s_{tau+1} ends; an update begun at tau (every n-th) ends
    # with its last piece at tau + n - 1, before that step's check
    reference = HybridForward(nominal_model(), DT, sampler.stride, sampler.integrator, ResidualConfig(warmup=4))
    begun: dict[int, tuple] = {}
    for tau in range(1, 33):
        args = (rows["qpos"][tau - 1], rows["qvel"][tau - 1], rows["action"][tau - 1 : tau + 1], rows["next_qvel"][tau])
        if every == 1:
            reference.observe(*args)
            continue
        if tau - (every - 1) in begun:
            for _ in reference.observe_in_pieces(*begun.pop(tau - (every - 1)), 1, check=False):
                pass
        reference.check_transition(*args)
        if (tau + 1) % every == 0:
            begun[tau] = args
    assert controller.forward.observed == reference.observed == {1: 32, 2: 16, 4: 7}[every]
    assert (controller._unfinished is not None) == bool(begun)  # n = 4: the one begun at step 31
    q, v = rows["qpos"][:5], rows["qvel"][:5]
    u = np.random.default_rng(2).uniform(-1, 1, (5, 6))
    assert np.abs(reference._learned(q, v, u)).max() > 1e-3
    np.testing.assert_allclose(controller.forward._learned(q, v, u), reference._learned(q, v, u), rtol=1e-12, atol=1e-12)
    # the check saw every transition after the warm-up, however many it learned
    checked = np.array(list(controller.forward.check._errors))
    assert len(checked) == 32 - {1: 4, 2: 7, 4: 17}[every]  # from the step the warm-up ends
    np.testing.assert_allclose(checked, np.array(list(reference.check._errors)), rtol=1e-12)
    # the pieces: 15 plant rows (the nominal step, 10 Jacobian rows, 3 iterations, the check) in n parts
    pieces, counted = reference.observe_in_pieces(rows["qpos"][0], rows["qvel"][0], rows["action"][:2],
                                                  rows["next_qvel"][1], every), []
    plant_rows = reference.nominal_plant

    def counting(qpos, *rest):
        counted[-1] += len(qpos)
        return plant_rows(qpos, *rest)

    reference.nominal_plant, counted = counting, [0]
    for _ in pieces:
        counted.append(0)
    assert len(counted) <= every and max(counted) <= -(-15 // every), counted
    with pytest.raises(InputError, match="update_every"):
        ResidualConfig(update_every=0).validate()


def test_a_residual_on_the_identified_parameters_learns_against_them() -> None:
    """``identification=``: the parameters identified under the residual take a weak hip, the residual's targets are
    against the identified plant (what the parameters leave: here little) and its rollouts add to the identified
    planning model."""
    data = _transitions("weak_motor", 0.3, 80, seed=5)
    identification = IdentificationConfig(warmup=10, gate_window=0)
    both = HybridForward(nominal_model(), DT, config=ResidualConfig(warmup=20), identification=identification)
    plain = HybridForward(nominal_model(), DT, config=ResidualConfig(warmup=20))
    unbuilt = HybridForward(nominal_model(), DT, config=ResidualConfig(warmup=100), identification=identification)
    for q, v, u, nv in data[:60]:
        for forward in (both, plain, unbuilt):
            forward.observe(q, v, u, nv)
    assert both.identified is not None and both.identified.in_use and both.active
    assert both.identified.factors()["gear:thigh_joint"] == pytest.approx(0.3, abs=0.1)
    assert both.reference_plant is both.identified.identified_plant
    assert both.planning_model is both.identified.identified_plan
    q, v, u, nv = (np.stack(a) for a in zip(*data[60:], strict=True))
    on_parameters, on_nominal = both.target(q, v, u, nv), plain.target(q, v, u, nv)
    assert (on_parameters**2).sum() < 0.1 * (on_nominal**2).sum()
    # with no residual built yet the rollout is the identified planning model's, not the nominal one's
    state = np.concatenate([data[60][0], data[60][1]])
    controls = np.random.default_rng(1).uniform(-1, 1, (3, 16, 6))
    assert not unbuilt.active and unbuilt.identified.in_use
    identified = unbuilt.identified.rollout(state, controls)
    np.testing.assert_array_equal(unbuilt.rollout(state, controls), identified)
    assert np.abs(identified - HybridForward(nominal_model(), DT).rollout(state, controls)).max() > 1e-3
    # a snapshot keeps the identified parameters as they were
    snap = both.snapshot()
    for q0, v0, u0, nv0 in data[60:]:
        both.observe(q0, v0, u0, nv0)
    assert snap.identified.observed == 60 and both.identified.observed == 80


def test_the_walker_config_and_controller_take_a_residual_on_the_parameters() -> None:
    config = WalkLearnedConfig(model="parameters+residual")
    config.validate()
    assert config.learned is config.residual and config.identification_under_residual is config.identification
    assert WalkLearnedConfig(model="residual").identification_under_residual is None
    controller = HybridSamplingController(WalkingCost(), DT, nominal_model(), learned=ResidualConfig(),
                                          identification=IdentificationConfig())
    assert controller.forward.identified is not None and controller.summary()["online_learner"] == "residual"
    with pytest.raises(InputError, match="identification under a residual"):
        HybridSamplingController(WalkingCost(), DT, nominal_model(), learned=IdentificationConfig(),
                                 identification=IdentificationConfig())
