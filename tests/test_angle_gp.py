"""The GP of the joint angles (an additive SKI basis) and the rigid-body filter that carries it in its state."""

import mujoco
import numpy as np
import pytest
import torch

from gpdyn.errors import InputError
from gpdyn.gp.angle_gp import AngleGPBasis
from gpdyn.gp.base import LearnerError
from gpdyn.robots.arm import inverse_dynamics
from test_rigid_body import N, arm, make_gp, regressor, states, tensor, torques  # noqa: F401 (fixtures)


def test_the_basis_interpolates_each_angle_on_its_own_grid_and_its_prior_is_the_se_kernel_there():
    torch.manual_seed(0)
    reference = torch.randn(50, 3, dtype=torch.float64)
    basis = AngleGPBasis(reference, points=8, lengthscale=0.7)
    assert basis.size == 24
    q = torch.randn(20, 3, dtype=torch.float64).clamp(-1.5, 1.5)
    phi = basis.rows(q)
    # four cubic weights per angle in that angle's block, summing to one
    blocks = phi.reshape(20, 3, 8)
    assert ((blocks != 0).sum(-1) <= 4).all()
    torch.testing.assert_close(blocks.sum(-1), torch.ones(20, 3, dtype=torch.float64))
    # a sum of cubics in each angle, given at the grid points, is reproduced exactly between them
    axes = basis.grid.lower + basis.grid.spacing * torch.arange(8, dtype=torch.float64)[:, None]  # [8, 3]
    cubic = lambda z: 0.3 * z**3 - z**2 + 2 * z - 1  # noqa: E731
    u = cubic(axes).T.reshape(-1)
    torch.testing.assert_close(phi @ u, cubic(q).sum(-1))
    # the prior: the SE kernel on each angle's grid, no covariance between angles
    prior = basis.prior()
    gap = (axes[:, 1, None] - axes[None, :, 1]) / 0.7
    torch.testing.assert_close(prior[8:16, 8:16], torch.exp(-0.5 * gap**2))
    assert torch.equal(prior[:8, 8:], torch.zeros(8, 16, dtype=torch.float64))


def test_the_basis_refuses_what_it_cannot_interpolate():
    reference = torch.randn(10, 3, dtype=torch.float64)
    with pytest.raises(LearnerError, match=">= 4 points"):
        AngleGPBasis(reference, points=3)
    with pytest.raises(LearnerError, match="NaN"):
        AngleGPBasis(reference * float("nan"))
    with pytest.raises(LearnerError, match="lengthscale"):
        AngleGPBasis(reference, lengthscale=0.0)


def tracked_path(arm, steps, seed):
    """A rhythmic path inside the joint ranges, one sample per 10 ms control step."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)[:, None] * 0.01
    amp, w, phase = rng.uniform(0.2, 0.5, N), rng.uniform(1, 3, N), rng.uniform(0, 2 * np.pi, N)
    q0 = 0.5 * np.mean(arm.model.jnt_range[:N], axis=1)
    return q0 + amp * np.sin(w * t + phase), amp * w * np.cos(w * t + phase), -amp * w**2 * np.sin(w * t + phase)


def test_the_filter_with_the_angle_gp_is_the_bayesian_posterior_of_its_joint_design(arm, regressor):
    """The Kalman updates of the joint state (rigid-body parameters, gains, the GP's weights), with the change test
    kept out of the way, are the closed-form Gaussian posterior of that linear model given every torque."""
    q, qd, qdd = states(arm, 30, seed=20)
    x, y = tensor(q, qd, qdd), torch.as_tensor(torques(arm, 0.0, q, qd, qdd))
    gp = make_gp(regressor, x, angle_gp_points=5, change_threshold=1e12)
    theta0, sigma0 = gp.theta.clone(), gp.covariance.clone()
    assert theta0.shape == (regressor.p + N + N * N * 5,)
    h = gp._design(x).reshape(-1, theta0.shape[0])
    information = torch.linalg.inv(sigma0) + h.T @ h / gp.noise_var
    expected = torch.linalg.solve(information, torch.linalg.solve(sigma0, theta0) + h.T @ y.reshape(-1) / gp.noise_var)
    for row in range(30):
        gp.observe(x[row : row + 1], y[row : row + 1])
    torch.testing.assert_close(gp.theta, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gp.covariance, torch.linalg.inv(information), rtol=1e-6, atol=1e-6)  # prior variances 100


def test_a_spring_at_every_joint_goes_into_the_gp_of_the_angles(arm, regressor):
    """A torsion spring at each joint (0.1 of the torque limit per rad, at rest where the arm is at the change, as
    `--change joint-spring`) is a torque of the configuration that no rigid-body column has. On a tracked path, one
    sample per control step, each predicted before it is learnt: with the GP of the angles the one-step-ahead error
    over the last 150 samples is well below the filter's alone, whose parameters chase the spring along the path
    (0.13 against 0.32 N m RMS here; the spring's torque is 5.3 N m RMS, the noise 0.1), and the GP's own term
    carries a good part of the spring's torque (40 % of its variance here)."""
    q, qd, qdd = states(arm, 60, seed=21)
    x = tensor(q, qd, qdd)
    path = tracked_path(arm, 500, seed=22)
    stiffness = 0.1 * np.abs(arm.limits.torque).max(axis=1)
    spring = -stiffness * (path[0] - path[0][200])
    model = arm.torque_model(0.0)
    measured = torch.as_tensor(inverse_dynamics(model, mujoco.MjData(model), *path) - np.where(
        np.arange(500)[:, None] >= 200, spring, 0.0))
    measured += 0.1 * torch.as_tensor(np.random.default_rng(23).standard_normal(measured.shape))
    xs = tensor(*path)
    errors = {}
    for points in (0, 6):
        gp = make_gp(regressor, xs, change_bodies=[arm.payload_body], change_window=10, change_friction_std=3.0,
                     angle_gp_points=points)
        gp.observe(x, torch.as_tensor(torques(arm, 0.0, q, qd, qdd)))  # the arm, from states all over its range
        predicted = []
        for row in range(500):
            predicted.append(gp.predict_mean(xs[row : row + 1]))
            gp.observe(xs[row : row + 1], measured[row : row + 1])
        assert gp.resets >= 1
        errors[points] = float((torch.cat(predicted)[350:] - measured[350:]).pow(2).mean().sqrt())
    assert errors[6] < 0.6 * errors[0], errors
    k = regressor.p + N  # the GP's weights follow the rigid-body parameters and the gains
    gp_term = (gp._design(xs[400:])[..., k:] @ gp.theta[k:]).numpy()
    added = -spring[400:]  # the torque the spring asks of the motors
    assert ((gp_term - added) ** 2).sum() < 0.75 * (added**2).sum()


def test_a_payload_is_still_learnt_by_the_mount_with_the_angle_gp_beside_it(arm, regressor):
    """The mount's terms, re-opened far wider than the GP of the angles, take a payload: its torques on held-out
    states (other velocities and accelerations, where a GP of the angles would not carry it) are predicted."""
    q, qd, qdd = states(arm, 70, seed=5)
    x = tensor(q, qd, qdd)
    held = tensor(*states(arm, 20, seed=6)).numpy()
    truth = torch.as_tensor(torques(arm, 3.0, held[:, :N], held[:, N:2 * N], held[:, 2 * N:]))
    gp = make_gp(regressor, x, change_bodies=[arm.payload_body], angle_gp_points=6)
    gp.observe(x[:60], torch.as_tensor(torques(arm, 0.0, q[:60], qd[:60], qdd[:60])))
    gp.observe(x[60:], torch.as_tensor(torques(arm, 3.0, q[60:], qd[60:], qdd[60:])))
    assert gp.resets >= 1
    assert (gp.predict_mean(torch.as_tensor(held)) - truth).abs().max() < 0.02 * truth.abs().max()


def test_the_angle_gps_grid_comes_with_the_state_and_bad_settings_are_refused(arm, regressor):
    q, qd, qdd = states(arm, 8, seed=7)
    x, y = tensor(q, qd, qdd), torch.as_tensor(torques(arm, 0.0, q, qd, qdd))
    gp = make_gp(regressor, x, angle_gp_points=5)
    gp.observe(x, y)
    restored = make_gp(regressor, tensor(*states(arm, 8, seed=8)), angle_gp_points=5)
    assert not torch.equal(restored.angle_gp.grid.lower, gp.angle_gp.grid.lower)
    restored.load_state_dict(gp.state_dict())
    assert torch.equal(restored.predict_mean(x), gp.predict_mean(x))
    with pytest.raises(LearnerError, match="angle_gp"):
        make_gp(regressor, x).load_state_dict(gp.state_dict())  # a filter without the GP cannot take its state
    with pytest.raises(LearnerError, match=">= 4 points"):
        make_gp(regressor, x, angle_gp_points=2)
    with pytest.raises(LearnerError, match="angle_gp_std"):
        make_gp(regressor, x, angle_gp_points=6, angle_gp_std=float("nan"))
    from gpdyn.experiments.arm_config import ArmRunConfig

    with pytest.raises(InputError, match="--angle-gp-points must be 0"):
        ArmRunConfig.of(angle_gp_points=2, progress=False).validate()
