"""gpdyn.control stage."""
