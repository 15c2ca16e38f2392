"""The rigid-body regressor of an arm: joint torques as a linear function of its inertial parameters.

The inverse dynamics of a rigid-body chain is linear in each body's ten inertial
parameters, ``pi_b = (m, m c, I_O)`` (mass, first moment, the inertia about the body frame
origin), and in the joints' armature, viscous damping and dry friction (Khalil & Dombre,
*Modeling, Identification and Control of Robots*, 2002, Ch. 12; Atkeson, An & Hollerbach
1986)::

    tau(q, qd, qdd) = Y(q, qd, qdd) pi

:class:`InertialRegressor` computes ``Y`` from the arm's own MJCF model (its kinematics)
with MuJoCo's ``mj_inverse``: column ``k`` is ``ID(pi_b + e_k) - ID(pi_b)`` on a copy of the
model whose parameters are moved by one unit (scaled) along ``k`` in the linear
coordinates. The inverse dynamics being exactly linear in ``pi``, the difference is exact
(to rounding), whatever the base point; bodies without mass (a payload mount) get a
nominal 1 kg base so that every direction can be represented in MuJoCo's own terms (mass,
centre of mass, principal inertia and axes). The dry friction column is MuJoCo's soft
friction at unit friction loss (soft, so linear only to a close approximation).

The learned inverse-dynamics models use ``Y`` as features: a Gaussian prior on ``pi``
is a GP whose kernel is ``Y Sigma Y^T`` (the semiparametric GP of Nguyen-Tuong & Peters
2010), structurally linear in the accelerations, ``tau = M(q) qdd + h(q, qd)``.
"""

from __future__ import annotations

import copy

import mujoco
import numpy as np

from gpdyn.errors import InputError

BODY_TERMS = ("m", "mcx", "mcy", "mcz", "Ixx", "Iyy", "Izz", "Ixy", "Ixz", "Iyz")
JOINT_TERMS = ("armature", "damping", "frictionloss")
# (row, col) of each inertia term in the 3 x 3 tensor
_INERTIA_INDEX = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))


def body_linear(model: mujoco.MjModel, body: int) -> np.ndarray:
    """``(m, m c, I_O)`` of one body in its own frame (I_O: the inertia about the frame origin)."""
    m, c = float(model.body_mass[body]), np.array(model.body_ipos[body])
    rot = np.zeros(9)
    mujoco.mju_quat2Mat(rot, model.body_iquat[body])
    rot = rot.reshape(3, 3)
    inertia_com = rot @ np.diag(model.body_inertia[body]) @ rot.T
    inertia_origin = inertia_com + m * (c @ c * np.eye(3) - np.outer(c, c))
    return np.concatenate([[m], m * c, [inertia_origin[i, j] for i, j in _INERTIA_INDEX]])


def set_body_linear(model: mujoco.MjModel, body: int, pi: np.ndarray) -> None:
    """Write ``(m, m c, I_O)`` into MuJoCo's mass, centre of mass, principal inertia and axes."""
    m = float(pi[0])
    c = pi[1:4] / m
    inertia_origin = np.zeros((3, 3))
    for value, (i, j) in zip(pi[4:], _INERTIA_INDEX):
        inertia_origin[i, j] = inertia_origin[j, i] = value
    inertia_com = inertia_origin - m * (c @ c * np.eye(3) - np.outer(c, c))
    moments, axes = np.linalg.eigh(inertia_com)
    if np.linalg.det(axes) < 0:
        axes[:, 0] *= -1
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, axes.reshape(-1))
    model.body_mass[body] = m
    model.body_ipos[body] = c
    model.body_iquat[body] = quat
    model.body_inertia[body] = moments
    model.body_sameframe[body] = mujoco.mjtSameFrame.mjSAMEFRAME_NONE


def moving_bodies(model: mujoco.MjModel) -> list[int]:
    """Bodies that some joint moves (their inertia enters the torques): those with a jointed ancestor."""
    out = []
    for body in range(1, model.nbody):
        b = body
        while b > 0 and model.body_jntnum[b] == 0:
            b = model.body_parentid[b]
        if b > 0:
            out.append(body)
    return out


class InertialRegressor:
    """``Y(q, qd, qdd)`` of a hinge/slide-jointed arm (see the module notes): ``[N, n, p]``.

    ``model``: the arm's MuJoCo model (its kinematics and joint list are used; its
    inertial values only set the base point of the differences). Columns: ten per moving
    body (:data:`BODY_TERMS`), then per joint :data:`JOINT_TERMS`; ``names`` lists them.
    ``parameters(model)`` is the vector ``pi`` of a model with the same kinematics, such
    that ``Y pi`` is its inverse dynamics.
    """

    def __init__(self, model: mujoco.MjModel) -> None:
        if model.nq != model.nv or model.nv == 0:
            raise InputError(f"InertialRegressor: needs an arm of hinge/slide joints (nq = nv > 0), got nq={model.nq}, nv={model.nv}")
        self.n = model.nv
        self.bodies = moving_bodies(model)
        base = copy.deepcopy(model)
        for body in self.bodies:  # a massless mount gets a 1 kg base: every direction is then a valid body
            if base.body_mass[body] < 1e-6:
                set_body_linear(base, body, np.concatenate([[1.0], np.zeros(3), [1e-3, 1e-3, 1e-3, 0, 0, 0]]))
        self.names: list[str] = []
        # the base model first, then one model moved along each parameter, with the size of its move
        self._models: list[mujoco.MjModel] = [base]
        steps: list[float] = []
        for body in self.bodies:
            pi = body_linear(base, body)
            name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, body) or f"body{body}"
            for k, term in enumerate(BODY_TERMS):
                # a step that keeps the body physical: 10% of its mass, 1 cm of moment arm, 10% of its inertia
                step = (0.1 * pi[0] if k == 0 else 0.01 * pi[0] if k < 4 else 0.1 * max(pi[4:7].min(), 1e-4))
                moved = copy.deepcopy(base)
                set_body_linear(moved, body, pi + step * np.eye(10)[k])
                self.names.append(f"{name}.{term}")
                self._models.append(moved)
                steps.append(step)
        for joint in range(self.n):
            dof = model.jnt_dofadr[joint]
            name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, joint) or f"joint{joint}"
            for term, array in (("armature", "dof_armature"), ("damping", "dof_damping"), ("frictionloss", "dof_frictionloss")):
                moved = copy.deepcopy(base)
                getattr(moved, array)[dof] += 1.0
                self.names.append(f"{name}.{term}")
                self._models.append(moved)
                steps.append(1.0)
        self.p = len(self.names)
        self._steps = np.asarray(steps)
        self._data = mujoco.MjData(base)

    def __call__(self, q: np.ndarray, qd: np.ndarray, qdd: np.ndarray) -> np.ndarray:
        """``Y [N, n, p]`` at the rows of ``q, qd, qdd [N, n]`` (or one row ``[n]``: ``[n, p]``)."""
        arrays = [np.asarray(a, dtype=np.float64) for a in (q, qd, qdd)]
        single = arrays[0].ndim == 1
        q, qd, qdd = (np.atleast_2d(a) for a in arrays)
        if not (q.shape == qd.shape == qdd.shape and q.shape[1] == self.n):
            raise InputError(f"InertialRegressor: q, qd, qdd must be [N, {self.n}] alike, got {q.shape}, {qd.shape}, {qdd.shape}")
        if not (np.isfinite(q).all() and np.isfinite(qd).all() and np.isfinite(qdd).all()):
            raise InputError("InertialRegressor: q, qd, qdd must be finite")
        data, inverse = self._data, mujoco.mj_inverse
        qfrc_inverse = data.qfrc_inverse  # a view of the data's buffer, read after each call
        torques = np.empty((q.shape[0], self.p + 1, self.n))  # the base model's, then each moved model's
        for row in range(q.shape[0]):
            # mj_inverse reads the state and writes qfrc_inverse: one state serves every model
            data.qpos[:], data.qvel[:], data.qacc[:] = q[row], qd[row], qdd[row]
            out_row = torques[row]
            for k, model in enumerate(self._models):
                inverse(model, data)
                out_row[k] = qfrc_inverse
        out = ((torques[:, 1:] - torques[:, :1]) / self._steps[:, None]).transpose(0, 2, 1)
        return out[0] if single else out

    def parameters(self, model: mujoco.MjModel) -> np.ndarray:
        """``pi [p]`` of ``model`` (same kinematics and joints as this regressor's)."""
        if model.nv != self.n or model.nbody <= max(self.bodies):
            raise InputError(f"InertialRegressor.parameters: the model has {model.nv} joints and {model.nbody} bodies, "
                             f"this regressor {self.n} joints")
        parts = [body_linear(model, body) for body in self.bodies]
        for joint in range(self.n):
            dof = model.jnt_dofadr[joint]
            parts.append(np.array([model.dof_armature[dof], model.dof_damping[dof], model.dof_frictionloss[dof]]))
        return np.concatenate(parts)


__all__ = ["BODY_TERMS", "JOINT_TERMS", "InertialRegressor", "body_linear", "moving_bodies", "set_body_linear"]
