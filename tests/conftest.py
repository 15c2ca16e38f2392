"""Shared fixtures; CUDA tests are skipped without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from synthetic import make_kuka_store, make_walker_store

from gpdyn.data.store import EpisodeStore

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _run_folders_in_tmp(tmp_path, monkeypatch):
    """Jobs run without --out write logs/<job>-<time>/ under the working directory: keep it in tmp."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def walker_store(tmp_path: Path) -> EpisodeStore:
    return make_walker_store(tmp_path / "walker.zarr", [30, 25, 40, 12, 33])


@pytest.fixture
def kuka_store(tmp_path: Path) -> EpisodeStore:
    return make_kuka_store(tmp_path / "kuka.zarr", offline=[50], online=[80, 70])


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
