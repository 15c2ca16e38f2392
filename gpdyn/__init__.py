"""gpdyn: online Gaussian-process dynamics learning and control for MuJoCo robots."""

__version__ = "0.1.0"
