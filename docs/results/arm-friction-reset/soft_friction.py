"""MuJoCo's dry friction against the rigid-body regressor's friction column, on the shipped KUKA.

The regressor's friction column of a joint is MuJoCo's inverse-dynamics friction force at a friction loss one
N m higher than the arm's, minus the arm's (gpdyn.robots.regressor.InertialRegressor): a model linear in the
friction loss F. MuJoCo's friction loss is a soft constraint, linear in the velocity near zero and saturated at
+-F beyond, and its linear zone widens with F. This prints, for the base joint at a fixed configuration and
acceleration, the column (F = 1) beside the force at F = 16 N m (the added friction of --change joint-friction
on the base joint: 5 % of its 320 N m limit) divided by 16: where they differ, F times the column misstates
the friction.

    python docs/results/arm-friction-reset/soft_friction.py
"""

import copy

import mujoco
import numpy as np

from gpdyn.robots.kuka import model_path

ADDED = 16.0  # N m: the base joint's added dry friction under --change joint-friction


def friction_force(model: mujoco.MjModel, added: float, q: np.ndarray, qd: np.ndarray, qdd: np.ndarray) -> float:
    """The base joint's inverse-dynamics force with ``added`` N m more friction loss on every joint, minus without."""
    moved = copy.deepcopy(model)
    moved.dof_frictionloss[:] += added
    forces = []
    for m in (moved, model):
        data = mujoco.MjData(m)
        data.qpos[:], data.qvel[:], data.qacc[:] = q, qd, qdd
        mujoco.mj_inverse(m, data)
        forces.append(data.qfrc_inverse[0])
    return forces[0] - forces[1]


def main() -> None:
    model = mujoco.MjModel.from_xml_path(str(model_path()))
    rng = np.random.default_rng(0)
    q, qdd = 0.5 * rng.uniform(-1, 1, model.nv), rng.uniform(-2, 2, model.nv)
    print("| base joint velocity [rad/s] | column (F = 1) | force at F = 16, / 16 |")
    print("|---|---|---|")
    for velocity in (0.3, 0.1, 0.05, 0.01, 0.003, 0.0, -0.003, -0.01, -0.05, -0.1, -0.3):
        qd = np.full(model.nv, 0.3)
        qd[0] = velocity
        column = friction_force(model, 1.0, q, qd, qdd)
        scaled = friction_force(model, ADDED, q, qd, qdd) / ADDED
        print(f"| {velocity:+.3f} | {column:+.3f} | {scaled:+.3f} |")


if __name__ == "__main__":
    main()
