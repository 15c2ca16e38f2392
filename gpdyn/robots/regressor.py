"""The rigid-body regressor of an arm: joint torques as a linear function of its inertial parameters.

The inverse dynamics of a rigid-body chain is linear in each body's ten inertial
parameters, ``pi_b = (m, m c, I_O)`` (mass, first moment, the inertia about the body frame
origin), and in the joints' armature, viscous damping and dry friction (Khalil & Dombre,
*Modeling, Identification and Control of Robots*, 2002, Ch. 12; Atkeson, An & Hollerbach
1986)::

    tau(q, qd, qdd) = Y(q, qd, qdd) pi

:class:`InertialRegressor` computes ``Y`` from the arm's own MJCF model (its kinematics):
MuJoCo's forward kinematics and velocities at ``(q, qd)`` and its body accelerations at
``qdd`` (gravity included, ``mj_rnePostConstraint``), then each body's Newton-Euler
equations about its frame origin, linear in ``pi_b`` (the references above)::

    f = m a + alpha x (m c) + w x (w x (m c))
    n = I_O alpha + w x (I_O w) + (m c) x a

(``w``, ``alpha``: the body's angular velocity and acceleration, ``a``: the classical
acceleration of its origin, all in its frame), carried to the joints by the motion subspaces
of the joints that move it: ``tau_j = s_j . (n, f)``. The joint columns are ``qdd_j``
(armature) and ``qd_j`` (viscous damping); the dry friction column is MuJoCo's soft friction
at unit friction loss, ``mj_inverse`` with every joint's friction loss raised by one minus
``mj_inverse`` without (each joint's friction constraint acts on its own joint alone; soft, so
linear only to a close approximation). Bodies without mass (a payload mount) get a nominal
1 kg in the model these two calls run on. :meth:`InertialRegressor.by_differences` computes
``Y`` by its definition instead, column ``k`` as ``ID(pi + s e_k) - ID(pi)`` over ``s``.

The learned inverse-dynamics models use ``Y`` as features: a Gaussian prior on ``pi``
is a GP whose kernel is ``Y Sigma Y^T`` (the semiparametric GP of Nguyen-Tuong & Peters
2010), structurally linear in the accelerations, ``tau = M(q) qdd + h(q, qd)``.
"""

from __future__ import annotations

import copy
import functools

import mujoco
import numpy as np

from gpdyn.errors import InputError

BODY_TERMS = ("m", "mcx", "mcy", "mcz", "Ixx", "Iyy", "Izz", "Ixy", "Ixz", "Iyz")
JOINT_TERMS = ("armature", "damping", "frictionloss")
# (row, col) of each inertia term in the 3 x 3 tensor
_INERTIA_INDEX = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))
# the symmetric 3 x 3 tensor of each inertia term: I_O = sum_k pi_k E_k
_INERTIA_BASIS = np.zeros((6, 3, 3))
for _k, (_i, _j) in enumerate(_INERTIA_INDEX):
    _INERTIA_BASIS[_k, _i, _j] = _INERTIA_BASIS[_k, _j, _i] = 1.0
# [3 * 6, 3]: times a vector v [3, 1], the columns E_k v side by side, [3, 6] after a reshape
_INERTIA_ROWS = _INERTIA_BASIS.transpose(1, 0, 2).reshape(3 * 6, 3)


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a x b`` over the last axis (``np.cross`` costs ~50 us of checks on arrays this small)."""
    a0, a1, a2, b0, b1, b2 = a[..., 0], a[..., 1], a[..., 2], b[..., 0], b[..., 1], b[..., 2]
    return np.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=-1)


def _skew(v: np.ndarray) -> np.ndarray:
    """``[..., 3, 3]`` cross-product matrices of ``v [..., 3]``: ``_skew(a) @ b = a x b``."""
    out = np.zeros((*v.shape[:-1], 3, 3))
    out[..., 0, 1], out[..., 0, 2], out[..., 1, 2] = -v[..., 2], v[..., 1], -v[..., 0]
    out[..., 1, 0], out[..., 2, 0], out[..., 2, 1] = v[..., 2], -v[..., 1], v[..., 0]
    return out


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

    ``model``: the arm's MuJoCo model (its kinematics and joint list are used; its inertial
    values enter only the dry friction's columns, whose softness depends on them). Columns: ten per moving
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
        # a massless mount gets a 1 kg base: a body to move along every direction (by_differences), and an
        # inertia for the friction's softness
        for body in self.bodies:
            if base.body_mass[body] < 1e-6:
                set_body_linear(base, body, np.concatenate([[1.0], np.zeros(3), [1e-3, 1e-3, 1e-3, 0, 0, 0]]))
        self.names: list[str] = []
        for body in self.bodies:
            name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, body) or f"body{body}"
            self.names += [f"{name}.{term}" for term in BODY_TERMS]
        for joint in range(self.n):
            name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, joint) or f"joint{joint}"
            self.names += [f"{name}.{term}" for term in JOINT_TERMS]
        self.p = len(self.names)
        self._base = base
        self._friction = copy.deepcopy(base)  # every joint's friction loss one higher: the friction columns
        self._friction.dof_frictionloss[:] += 1.0
        self._data = mujoco.MjData(base)
        bodies = np.asarray(self.bodies)
        # moves[b, j]: dof j is on body b's path to the world (its motion moves b)
        self._moves = np.zeros((len(bodies), self.n), dtype=bool)
        for row, body in enumerate(self.bodies):
            b = body
            while b > 0:
                start = model.body_dofadr[b]
                self._moves[row, start : start + model.body_dofnum[b]] = True
                b = model.body_parentid[b]
        self._roots = np.asarray(model.body_rootid)[bodies]
        self._body_index = bodies
        # gravity compensation (MuJoCo's body gravcomp, a passive force the inverse dynamics leaves out): the
        # compensated fraction of each body's weight, taken off the gravity in its acceleration below
        gravity = np.zeros(3) if model.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_GRAVITY else np.array(model.opt.gravity)
        self._compensated_gravity = np.asarray(model.body_gravcomp)[bodies, None] * gravity if model.ngravcomp else None
        if self._compensated_gravity is not None and np.asarray(model.jnt_actgravcomp).any():
            joints = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j) or f"joint{j}"
                      for j in np.flatnonzero(model.jnt_actgravcomp)]
            raise InputError(f"InertialRegressor: joints {', '.join(joints)} take gravity compensation through their "
                             "actuators (actuatorgravcomp); only the passive gravcomp of a body is supported")

    def __call__(self, q: np.ndarray, qd: np.ndarray, qdd: np.ndarray) -> np.ndarray:
        """``Y [N, n, p]`` at the rows of ``q, qd, qdd [N, n]`` (or one row ``[n]``: ``[n, p]``)."""
        arrays = [np.asarray(a, dtype=np.float64) for a in (q, qd, qdd)]
        single = arrays[0].ndim == 1
        q, qd, qdd = (np.atleast_2d(a) for a in arrays)
        if not (q.shape == qd.shape == qdd.shape and q.shape[1] == self.n):
            raise InputError(f"InertialRegressor: q, qd, qdd must be [N, {self.n}] alike, got {q.shape}, {qd.shape}, {qdd.shape}")
        if not (np.isfinite(q).all() and np.isfinite(qd).all() and np.isfinite(qdd).all()):
            raise InputError("InertialRegressor: q, qd, qdd must be finite")
        rows, b = q.shape[0], len(self.bodies)
        data, inverse, bodies, roots = self._data, mujoco.mj_inverse, self._body_index, self._roots
        # MuJoCo's com-based quantities of each row: [rot; lin] about the tree's centre of mass, world axes
        vel, acc, dofs = np.empty((rows, b, 6)), np.empty((rows, b, 6)), np.empty((rows, self.n, 6))
        arm = np.empty((rows, b, 3))  # each body's frame origin from its tree's centre of mass
        rot = np.empty((rows, b, 3, 3))
        friction = np.empty((rows, self.n))
        for row in range(rows):
            data.qpos[:], data.qvel[:], data.qacc[:] = q[row], qd[row], qdd[row]
            inverse(self._friction, data)
            friction[row] = data.qfrc_inverse
            inverse(self._base, data)  # kinematics, com velocities and motion subspaces of this state
            friction[row] -= data.qfrc_inverse
            mujoco.mj_rnePostConstraint(self._base, data)  # body accelerations (gravity as the world's)
            vel[row], acc[row], dofs[row] = data.cvel[bodies], data.cacc[bodies], data.cdof
            arm[row] = data.xpos[bodies] - data.subtree_com[roots]
            rot[row] = data.xmat[bodies].reshape(b, 3, 3)
        w, v_lin = vel[..., :3], vel[..., 3:] + _cross(vel[..., :3], arm)  # at the frame origin
        alpha = acc[..., :3]
        a_lin = acc[..., 3:] + _cross(alpha, arm) + _cross(w, v_lin)  # classical, at the frame origin
        if self._compensated_gravity is not None:  # MuJoCo's acceleration carries -g; the weight is (1 - gc) m g
            a_lin = a_lin + self._compensated_gravity
        to_body = rot.swapaxes(-1, -2)
        w, alpha, a_lin = (to_body @ x[..., None] for x in (w, alpha, a_lin))  # [rows, b, 3, 1], body axes
        skew_w = _skew(w[..., 0])
        force, moment = np.zeros((rows, b, 3, 10)), np.zeros((rows, b, 3, 10))
        force[..., :1] = a_lin
        force[..., 1:4] = _skew(alpha[..., 0]) + skew_w @ skew_w
        moment[..., 1:4] = -_skew(a_lin[..., 0])
        columns = (rows, b, 3, 6)
        moment[..., 4:] = (_INERTIA_ROWS @ alpha).reshape(columns) + skew_w @ (_INERTIA_ROWS @ w).reshape(columns)
        force, moment = rot @ force, rot @ moment  # world axes
        moment += _skew(arm) @ force  # about the tree's centre of mass
        # tau_j = s_j . (n, f) over the bodies dof j moves
        torque = (np.einsum("rjk,rbkc->rbjc", dofs[..., :3], moment) + np.einsum("rjk,rbkc->rbjc", dofs[..., 3:], force))
        torque *= self._moves[None, :, :, None]
        out = np.zeros((rows, self.n, self.p))
        out[..., : 10 * b] = torque.transpose(0, 2, 1, 3).reshape(rows, self.n, 10 * b)
        joint = np.arange(self.n)  # each joint's terms act on its own torque alone
        first = 10 * b + len(JOINT_TERMS) * joint
        out[:, joint, first], out[:, joint, first + 1], out[:, joint, first + 2] = qdd, qd, friction
        return out[0] if single else out

    def by_differences(self, q: np.ndarray, qd: np.ndarray, qdd: np.ndarray) -> np.ndarray:
        """``Y [N, n, p]`` by its definition, the reference :meth:`__call__` is tested against: column ``k`` is
        ``mj_inverse`` of the model moved along parameter ``k`` minus the model's, over the move (exact: the
        inverse dynamics is linear in the parameters). One ``mj_inverse`` per column and row, ~4x slower."""
        q, qd, qdd = (np.atleast_2d(np.asarray(a, dtype=np.float64)) for a in (q, qd, qdd))
        data = mujoco.MjData(self._base)
        out = np.empty((q.shape[0], self.n, self.p))
        for row in range(q.shape[0]):
            data.qpos[:], data.qvel[:], data.qacc[:] = q[row], qd[row], qdd[row]
            mujoco.mj_inverse(self._base, data)
            base = data.qfrc_inverse.copy()
            for k, (model, step) in enumerate(self._moved_models):
                mujoco.mj_inverse(model, data)
                out[row, :, k] = (data.qfrc_inverse - base) / step
        return out

    @functools.cached_property
    def _moved_models(self) -> list[tuple[mujoco.MjModel, float]]:
        """For :meth:`by_differences`: a copy of the model moved along each parameter, and the move."""
        moved: list[tuple[mujoco.MjModel, float]] = []
        for body in self.bodies:
            pi = body_linear(self._base, body)
            for k in range(len(BODY_TERMS)):
                # a move that keeps the body physical: 10% of its mass, 1 cm of moment arm, 10% of its inertia
                step = 0.1 * pi[0] if k == 0 else 0.01 * pi[0] if k < 4 else 0.1 * max(pi[4:7].min(), 1e-4)
                model = copy.deepcopy(self._base)
                set_body_linear(model, body, pi + step * np.eye(10)[k])
                moved.append((model, step))
        for joint in range(self.n):
            for array in ("dof_armature", "dof_damping", "dof_frictionloss"):
                model = copy.deepcopy(self._base)
                getattr(model, array)[self._base.jnt_dofadr[joint]] += 1.0
                moved.append((model, 1.0))
        return moved

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
