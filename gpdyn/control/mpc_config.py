"""The settings of the sampling planners (:mod:`gpdyn.control.mpc`): a section of a config tree
(:mod:`gpdyn.config`), each setting declared once with its help and range. No torch at import:
the command line builds its options from here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpdyn.config import check, setting
from gpdyn.errors import InputError

if TYPE_CHECKING:
    import torch

#: how a planner uses the model's predictive variance: not at all, as a cost, or by sampling predictions
UNCERTAINTY = ("mean", "penalty", "sample")


class MPCConfigError(InputError):
    """An impossible planner setting; the message names the option."""


@dataclass
class MPCConfig:
    """Planner settings (sizes, noise, temperature, uncertainty handling)."""

    horizon: int = setting(30, low=1, metavar="H", help="planning steps H")
    samples: int = setting(1000, low=2, metavar="K", help="sampled action sequences K")
    noise_std: float | list[float] = setting(0.3, low=0, open_low=True, metavar="STD",
                                             help="sampling noise, action units: one value, or one per action")
    temperature: float = setting(1.0, low=0, open_low=True,
                                 help="MPPI temperature lambda, cost units: the larger, the more samples the plan "
                                      "averages (small against the cost spread makes the plan one sample)")
    control_cost: float = setting(0.0, low=0, high=1, metavar="WEIGHT",
                                  help="weight in [0, 1] on MPPI's control cost lambda u'Sigma^-1 eps: 1 keeps the "
                                       "plan a KL-regularised improvement of the proposal instead of drifting from it")
    iterations: int = setting(3, low=1, metavar="N", help="CEM refits (MPPI plans once)")
    elite_fraction: float = setting(0.1, low=0, high=1, open_low=True, metavar="F",
                                    help="CEM: the fraction of samples the refit follows")
    cem_alpha: float = setting(0.1, low=0, high=1, metavar="A",
                               help="CEM: weight of the old mean and std in the refit, below 1")
    gamma: float = setting(1.0, low=0, high=1, open_low=True, help="discount per planning step")
    terminal_cost: float = setting(0.0, metavar="W", help="weight of the terminal cost after the horizon")
    uncertainty: str = setting("mean", choices=UNCERTAINTY,
                               help="use of the predictive variance: none (mean), a cost on it (penalty) or "
                                    "sampled predictions (sample)")
    var_weight: float = setting(0.0, low=0, metavar="W", help="weight of the variance penalty")
    proposal_fraction: float = setting(0.5, low=0, high=1, metavar="F",
                                       help="fraction of the samples drawn around the proposal policy's rollout")
    relative_to_proposal: bool = setting(False, help="plan offsets to the proposal's closed-loop actions, the zero "
                                                     "offset being the proposal (needs a proposal)")
    proposal_tail: int = setting(0, low=0, metavar="N",
                                 help="steps the proposal alone runs through the model after the horizon, before "
                                      "the terminal value")
    keep_nominal: bool = setting(True, help="sample 0 replays the nominal plan unperturbed")
    warm_start: bool = setting(True, help="start each plan from the previous one shifted, instead of afresh from the "
                                          "proposal (zero offsets with relative_to_proposal)")
    compiled: bool = setting(False, help="run the cost and the proposal as compiled programs where they declare "
                                         "themselves traceable (needs a C++ compiler)")

    def validate(self) -> None:
        """Raise :class:`MPCConfigError` naming the first bad option."""
        try:
            check(self, "MPC option", sections=False)
        except MPCConfigError:
            raise
        except InputError as err:
            raise MPCConfigError(str(err)) from None
        if not self.cem_alpha < 1:
            raise MPCConfigError(f"MPC option cem_alpha={self.cem_alpha!r} must be below 1")

    def uses_variance(self) -> bool:
        """Whether the cost uses the model's predictive variance: ``"sample"``, or ``"penalty"``
        with ``var_weight > 0``. If not, the planner asks a model that offers it for the mean alone."""
        return self.uncertainty == "sample" or (self.uncertainty == "penalty" and self.var_weight > 0)

    def memory_bytes(self, nx: int, nu: int, itemsize: int = 8) -> int:
        """Bytes a plan holds at once: the ``[K, H, nu]`` noise, actions and their weighted
        copies (about six such arrays) and the ``[K, nx]`` states, predictions and variances
        of one step (about eight), for states of ``nx`` and actions of ``nu`` numbers."""
        k, h = self.samples, self.horizon
        return int(k * (6 * h * nu + 8 * (nx + nu)) * itemsize)

    def check_memory(self, nx: int, nu: int, dtype: torch.dtype, device: str = "cpu") -> None:
        """InputError (naming ``samples`` and ``horizon``) when a plan would not fit in memory
        (:func:`gpdyn.device.check_memory`): refused before any work, not by the allocator."""
        from gpdyn.device import check_memory

        check_memory(self.memory_bytes(nx, nu, dtype.itemsize), f"MPC samples={self.samples} x horizon={self.horizon}",
                     device)


__all__ = ["MPCConfig", "MPCConfigError", "UNCERTAINTY"]
