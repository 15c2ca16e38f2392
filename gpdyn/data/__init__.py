"""Data stage: the episode store, regression problems, streams and dataset importers."""

from gpdyn.data.store import EpisodeStore, FieldSpec, StoreError, numbered_columns

__all__ = ["EpisodeStore", "FieldSpec", "StoreError", "numbered_columns"]
