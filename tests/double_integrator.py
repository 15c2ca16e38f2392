"""The double integrator the planner tests drive to a goal: an exact linear model (float64)."""

from __future__ import annotations

import torch

DT = 0.1
GOAL = torch.tensor([1.0, 0.0], dtype=torch.float64)
A = torch.tensor([[1.0, DT], [0.0, 1.0]], dtype=torch.float64)
B = torch.tensor([[0.5 * DT**2], [DT]], dtype=torch.float64)


def linear(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Exact double-integrator step under a constant acceleration ``u`` for ``DT``."""
    return x @ A.T + u @ B.T
