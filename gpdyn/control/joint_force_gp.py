"""A GP of each actuated joint's own angle and velocity, as a force in the identified planning model's state.

The identified model (:mod:`gpdyn.control.identified_model`) learns the plant's masses, gears
and foot friction. A spring or a damper added at a joint is none of them: it is a torque of that
joint's own angle and velocity. This module models such a torque on each actuated joint ``j``
as an additive GP of the joint's own state,

    tau_j(q_j, qd_j) = g_j(q_j) + h_j(qd_j),    g_j, h_j ~ GP(0, (std^2 / 2) SE(l)),

each function through structured kernel interpolation on a regular grid of ``points`` values
(SKI, Wilson & Nickisch 2015), WISKI's additive structure with the projections fixed to the
joint's two axes (Stanton et al. 2021, Sec. 3.3; the basis is :class:`gpdyn.gp.angle_gp.AngleGPBasis`,
as the arms' GP of the angles). As a linear model ``tau_j = phi_j(q_j, qd_j)^T L_j v_j`` with
``v_j ~ N(0, I)`` (``L_j`` the Cholesky factor of the grid's prior covariance), so that
:class:`gpdyn.control.identified_model.IdentifiedForward` keeps ``v`` in its Bayesian regression
beside the physical parameters: one posterior over both, so that the parameters carry what they
can represent and the GP what they cannot, neither fitted to what the other leaves (a residual
learned against identified parameters chased them as they drifted to absorb a spring:
docs/results/walker-identified-residual).

Inputs are normalised to ``[-1, 1]``: an angle by its joint's range (``[-pi, pi]`` for an
unlimited hinge), a velocity by ``velocity_range``; outside they are clamped onto the edge, where
the force keeps its edge value. The planner evaluates the force at every planning step of every
sample, so it reads it off a table of each function on ``table_points`` inputs, interpolated
linearly (the table is made again after each update).
"""

from __future__ import annotations

import copy

import mujoco
import numpy as np
import torch

from gpdyn.errors import InputError
from gpdyn.gp.angle_gp import AngleGPBasis

#: the generalized force perturbation (N m or N) of a finite-difference sensitivity to a force on one coordinate
FORCE_STEP = 1.0


class JointForceGP:
    """The force GP of each actuated joint's own angle and velocity (module docs) on ``model``'s actuated hinge or
    slide joints: ``features`` for the regression, ``force`` for the planner, ``set_weights`` after an update."""

    def __init__(self, model: mujoco.MjModel, points: int, std: float, lengthscale: float,
                 velocity_range: float, table_points: int = 129) -> None:
        joints = sorted({int(j) for j in model.actuator_trnid[:, 0]})
        free = [model.joint(j).name or str(j) for j in joints
                if int(model.jnt_type[j]) not in (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))]
        if free:
            raise InputError(f"joint force GP: the actuated joints {free} are no hinge or slide joints")
        if not (points >= 4 and std > 0 and lengthscale > 0 and velocity_range > 0 and table_points >= 2):
            raise InputError(f"joint force GP: need points >= 4 and std, lengthscale, velocity_range > 0, got {points}, "
                             f"{std}, {lengthscale}, {velocity_range}")
        self.joints = len(joints)
        self.names = [model.joint(j).name or str(j) for j in joints]
        self.qpos_index = model.jnt_qposadr[joints].copy()
        self.dofs = model.jnt_dofadr[joints].copy()
        self.nv = model.nv
        limited = model.jnt_limited[joints].astype(bool)
        low = np.where(limited, model.jnt_range[joints, 0], -np.pi)
        high = np.where(limited, model.jnt_range[joints, 1], np.pi)
        # the columns: each joint's angle, then each joint's velocity
        self.center = np.concatenate([(low + high) / 2, np.zeros(self.joints)])
        self.half_width = np.concatenate([(high - low) / 2, np.full(self.joints, float(velocity_range))])
        columns = 2 * self.joints
        self.basis = AngleGPBasis(torch.tensor([[-1.0] * columns, [1.0] * columns], dtype=torch.float64), points,
                                  lengthscale, margin=0.0)
        prior = self.basis.prior().numpy()  # unit amplitude, one block per column
        self.points = int(points)
        # joint j's weights: its angle column's grid values, then its velocity column's
        self._blocks = [np.r_[j * points:(j + 1) * points, (self.joints + j) * points:(self.joints + j + 1) * points]
                        for j in range(self.joints)]
        block_prior = [std**2 / 2 * prior[np.ix_(b, b)] for b in self._blocks]
        self._factors = [np.linalg.cholesky(p + 1e-8 * std**2 * np.eye(len(p))) for p in block_prior]
        self.size = self.joints * 2 * self.points  # whitened weights v, joint by joint
        self.weights = np.zeros(self.size)
        self._table_inputs = np.linspace(-1.0, 1.0, table_points)
        rows = self.basis.rows(torch.tensor(np.repeat(self._table_inputs[:, None], columns, 1))).numpy()
        # the table's rows per column: [columns, table_points, points]
        self._table_rows = np.stack([rows[:, c * points:(c + 1) * points] for c in range(columns)])
        self._table = np.zeros((columns, table_points))  # each column's function at the table's inputs
        self._column_offsets = np.arange(columns) * table_points  # where each column's row starts in the flat table
        # the range of each normalised input the regression has seen (features): where the summary reads the force
        self._seen_low, self._seen_high = np.full(columns, np.inf), np.full(columns, -np.inf)

    def inputs(self, states: np.ndarray, nq: int) -> np.ndarray:
        """Normalised ``[angles, velocities] [..., 2 joints]`` of states ``[..., nq + nv]`` (``[qpos, qvel]``),
        clamped onto ``[-1, 1]``."""
        raw = states[..., np.concatenate([self.qpos_index, nq + self.dofs])]
        return np.clip((raw - self.center) / self.half_width, -1.0, 1.0)

    def features(self, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        """``[joints, 2 points]``: joint ``j``'s force at the state ``(qpos [nq], qvel [nv])`` is row ``j`` times its
        block of the whitened weights (``weights[j * 2 points : (j + 1) * 2 points]``)."""
        z = self.inputs(np.concatenate([qpos, qvel]), len(qpos))
        self._seen_low, self._seen_high = np.minimum(self._seen_low, z), np.maximum(self._seen_high, z)
        phi = self.basis.rows(torch.as_tensor(z)[None])[0].numpy()
        return np.stack([phi[b] @ f for b, f in zip(self._blocks, self._factors, strict=True)])

    def set_weights(self, weights: np.ndarray) -> None:
        """Take the whitened weights ``[size]`` (the regression's posterior mean) and make the planner's table."""
        self.weights = np.asarray(weights, dtype=float).copy()
        grid_values = np.zeros(2 * self.joints * self.points)
        for j, (block, factor) in enumerate(zip(self._blocks, self._factors, strict=True)):
            grid_values[block] = factor @ self.weights[j * 2 * self.points:(j + 1) * 2 * self.points]
        self._table = np.einsum("ctp,cp->ct", self._table_rows, grid_values.reshape(2 * self.joints, self.points))

    def force(self, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        """The generalized force ``[K, nv]`` at states ``qpos [K, nq], qvel [K, nv]`` (zero off the actuated joints)."""
        return self.force_of_states(np.concatenate([qpos, qvel], -1), qpos.shape[-1])

    def force_of_states(self, states: np.ndarray, nq: int) -> np.ndarray:
        """:meth:`force` of ``states [K, nq + nv]`` (``[qpos, qvel]``, e.g. a view of rollout states): the planner's
        per-step call, in few numpy operations."""
        last = len(self._table_inputs) - 1
        position = np.minimum((self.inputs(states, nq) + 1.0) * (last / 2), last - 1e-9)  # in table steps
        left = position.astype(np.intp)
        fraction = position - left
        flat = left + self._column_offsets
        table = self._table.ravel()
        values = table[flat] + (table[flat + 1] - table[flat]) * fraction
        out = np.zeros((states.shape[0], self.nv))
        out[:, self.dofs] = values[:, : self.joints] + values[:, self.joints :]
        return out

    def stiffness_damping(self) -> dict[str, float]:
        """Each joint's learned force summarised as a spring and a damper: minus the least-squares slope of its
        angle's function (``stiffness:<joint>``, N m/rad) and of its velocity's function (``damping:<joint>``,
        N m s/rad) over the inputs the regression has seen (the whole range before any). A spring-damper the plant
        gained shows as itself."""
        seen = self._seen_high > self._seen_low
        low, high = np.where(seen, self._seen_low, -1.0), np.where(seen, self._seen_high, 1.0)
        slopes = np.empty(len(low))
        for c, (a, b) in enumerate(zip(low, high, strict=True)):
            z = np.linspace(a, b, 33)
            values = np.interp(z, self._table_inputs, self._table[c])
            slopes[c] = np.polyfit(z, values, 1)[0] / self.half_width[c]
        out = {}
        for j, name in enumerate(self.names):
            out[f"stiffness:{name}"] = float(-slopes[j])
            out[f"damping:{name}"] = float(-slopes[self.joints + j])
        return out

    def copy(self) -> JointForceGP:
        """A copy whose weights and table are its own."""
        other = copy.copy(self)
        other.weights, other._table = self.weights.copy(), self._table.copy()
        other._seen_low, other._seen_high = self._seen_low.copy(), self._seen_high.copy()
        return other


__all__ = ["JointForceGP"]
