"""gpdyn.experiments stage."""
