"""Run folders: ``logs/<job>-<time>/`` with ``config.json`` and ``metrics.jsonl``."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gpdyn.errors import InputError


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if hasattr(value, "tolist"):  # torch tensors, without importing torch here
        return value.tolist()
    return value


class RunDir:
    """One run's folder. ``metrics.jsonl`` gets one JSON object per :meth:`log` call."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, job: str, config: Mapping[str, Any], out: str | Path | None = None, logs: str | Path = "logs") -> RunDir:
        """Make the folder (``out`` or ``logs/<job>-<time>``) and write ``config.json``."""
        if out is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            path = Path(logs) / f"{job}-{stamp}"
            suffix = 1
            while path.exists():  # two runs in one second
                suffix += 1
                path = Path(logs) / f"{job}-{stamp}-{suffix}"
        else:
            path = Path(out)
            if path.exists() and (not path.is_dir() or any(path.iterdir())):
                # appending to another run's metrics.jsonl would mix two runs under one config
                raise InputError(f"{path}: already exists and is not empty; choose another --out")
        path.mkdir(parents=True, exist_ok=True)
        run = cls(path)
        run.write_json("config.json", {"job": job, **config})
        return run

    def write_json(self, name: str, obj: Any) -> Path:
        target = self.path / name
        target.write_text(json.dumps(_jsonable(obj), indent=2, sort_keys=False) + "\n")
        return target

    def log(self, **metrics: Any) -> None:
        """Append one record to ``metrics.jsonl`` (flushed at once, so a crash keeps it)."""
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(_jsonable({"time": time.time(), **metrics})) + "\n")

    def metrics(self) -> list[dict[str, Any]]:
        file = self.path / "metrics.jsonl"
        if not file.exists():
            return []
        return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]

    def config(self) -> dict[str, Any]:
        return json.loads((self.path / "config.json").read_text())

    def summary(self) -> dict[str, Any]:
        """What ``gpdyn inspect`` shows: the config, the number of metric records, the last one, the files."""
        metrics = self.metrics()
        return {
            "run": str(self.path),
            "config": self.config(),
            "metric_records": len(metrics),
            "last_metrics": metrics[-1] if metrics else None,
            "files": sorted(p.name for p in self.path.iterdir()),
        }


def is_run_dir(path: str | Path) -> bool:
    return (Path(path) / "config.json").is_file()
