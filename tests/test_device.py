"""gpdyn.device, the one device/dtype/threads policy, and the command line's use of it."""

from __future__ import annotations

import pytest
import torch

from gpdyn.cli import main
from gpdyn.device import MAX_THREADS, dtype_name, resolve_device, resolve_dtype, set_threads, sync
from gpdyn.errors import InputError

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA (checks the refusal)")


def test_cpu_and_float64_by_default():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype(None) is torch.float64
    assert resolve_dtype(None, "cpu") is torch.float64
    # the dtype default follows the device type; no GPU is needed to ask
    assert resolve_dtype(None, "cuda") is torch.float32
    assert resolve_dtype("float32", "cpu") is torch.float32 and resolve_dtype(torch.float64, "cuda") is torch.float64
    assert dtype_name(torch.float32) == "float32" and dtype_name(resolve_dtype(None)) == "float64"
    sync("cpu")  # nothing queued on the CPU: returns at once


@pytest.mark.gpu
def test_cuda_is_pinned_and_float32():
    device = resolve_device("cuda")
    assert device.type == "cuda" and device.index == torch.cuda.current_device()
    assert resolve_dtype(None, device) is torch.float32
    sync(device)
    with pytest.raises(InputError, match="CUDA device"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


@pytest.mark.parametrize(
    ("name", "match"),
    [("meta", "runs on cpu or cuda, not 'meta'"), ("gpu", "not a torch device"), ("cuda:x", "not a torch device"), ("", "not a torch device")],
)
def test_devices_gpdyn_cannot_run_on_are_refused(name, match):
    with pytest.raises(InputError, match=match) as err:
        resolve_device(name)
    assert str(err.value).startswith("--device")
    with pytest.raises(InputError, match="^--learn-device"):
        resolve_device(name, option="--learn-device")


@no_cuda
def test_cuda_without_cuda_is_refused():
    with pytest.raises(InputError, match="--device cuda: CUDA is not available on this machine"):
        resolve_device("cuda")
    with pytest.raises(InputError, match="CUDA is not available"):
        resolve_device(torch.device("cuda", 0))


def test_bad_dtypes_and_thread_counts_are_refused():
    for bad in ("float16", "double", torch.float16):
        with pytest.raises(InputError, match="--dtype .*choose one of float32, float64"):
            resolve_dtype(bad)
    before = torch.get_num_threads()
    try:
        for bad in (0, -1, MAX_THREADS + 1, 100_000):
            with pytest.raises(InputError, match=f"--threads {bad}: must be between 1 and {MAX_THREADS}"):
                set_threads(bad)
        assert torch.get_num_threads() == before  # a refused count changes nothing
        set_threads(2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def _learn(*extra: str) -> list[str]:
    return ["learn", "--store", "missing.zarr", "--problem", "walker-1", "--learner", "svdgp", "--out", "run", *extra]


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        pytest.param(_learn("--device", "cuda"), "--device cuda", marks=no_cuda),
        (_learn("--device", "meta"), "--device 'meta'"),
        (_learn("--device", "cpu", "--dtype", "float32", "--threads", "100000"), "--threads 100000"),
        (["--threads", "0", *_learn()], "--threads 0"),
        pytest.param(["control", "walker", "--learner", "svdgp", "--device", "cuda"], "--device cuda", marks=no_cuda),
        (["bench", "wiski", "--device", "meta"], "--device 'meta'"),
    ],
)
def test_cli_refuses_before_any_work(argv, option, tmp_path, capsys):
    # the store does not exist: a check that came after loading it would name the store instead
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert option in err and "missing.zarr" not in err and "Traceback" not in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "logs").exists()


def test_cli_threads_apply_to_the_job(walker_store, tmp_path):
    before = torch.get_num_threads()
    try:
        assert main(["--threads", "2", "inspect", str(walker_store.path)]) == 0
        assert torch.get_num_threads() == 2
        assert main(["inspect", str(walker_store.path), "--threads", "3"]) == 0  # after the command, too
        assert torch.get_num_threads() == 3
        assert main(["inspect", str(walker_store.path)]) == 0  # the default
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_cli_dtype_choices_come_from_the_policy(capsys):
    assert main(_learn("--dtype", "float16")) == 2
    assert "--dtype: invalid choice: 'float16' (choose from 'float32', 'float64')" in capsys.readouterr().err
