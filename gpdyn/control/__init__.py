"""Control with learned models: :mod:`~gpdyn.control.dynamics` (the learned-model wrapper and
forward dynamics), :mod:`~gpdyn.sim.loop` (the one episode loop and the controller
protocol), :mod:`~gpdyn.control.controllers` (policy and MPC controllers),
:mod:`~gpdyn.control.computed_torque` (arm tracking) and :mod:`~gpdyn.control.mpc` (the
MPPI and CEM planners)."""
