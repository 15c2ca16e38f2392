"""gpdyn.sim stage."""
