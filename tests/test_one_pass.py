"""One-pass learners (ssgp, rls, svdgp-stream): pretraining and iid training observe every row once.

Their ``observe`` is all their learning and a row observed twice counts twice, so a minibatch loop
that observes only the first minibatch (what pretraining did before) or every minibatch of every
epoch would learn from a few rows, or from copies.
"""

from __future__ import annotations

import pytest
import torch

from gpdyn.data.streams import IIDStream
from gpdyn.gp import make_learner
from gpdyn.gp.online import run_online
from gpdyn.gp.prior_mean import WithPriorMean
from gpdyn.gp.training import ONE_PASS_FIRST_ROWS, OnlineUpdater, pretrain_learner

ONE_PASS = ("ssgp", "rls", "svdgp-stream")


def _data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    y = torch.stack([torch.sin(x[:, 0]) + 0.5 * x[:, 1], x[:, 2] ** 2], dim=-1)
    return x, y + 0.05 * torch.randn(n, 2, generator=gen, dtype=torch.float64)


def _rls_sums(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    phi = torch.cat([x, torch.ones_like(x[:, :1])], dim=-1)  # rls's features: the inputs and a bias
    return phi.T @ phi, phi.T @ y


@pytest.mark.parametrize("name", ONE_PASS)
def test_the_capability_is_declared_and_passes_through_a_prior_mean(name: str) -> None:
    learner = make_learner(name, 3, 2, preset="small", dtype=torch.float64)
    assert learner.can("one_pass")
    assert WithPriorMean(learner, lambda x: x[..., :2] * 0).can("one_pass")
    assert not make_learner("svdgp", 3, 2, preset="small", dtype=torch.float64).can("one_pass")


@pytest.mark.parametrize("name", ONE_PASS)
def test_pretraining_observes_every_row_exactly_once(name: str) -> None:
    x, y = _data(ONE_PASS_FIRST_ROWS + 700)  # the first batch, then 128-row chunks and a shorter last one
    learner = make_learner(name, 3, 2, preset="small", dtype=torch.float64)
    pretrain_learner(learner, x, y, iterations=5, batch=128, progress=False)
    assert learner.rows == x.shape[0]
    if name == "rls":  # the sums are those of every row, once (in any order)
        gram, cross = _rls_sums(x, y)
        torch.testing.assert_close(learner.gram, gram)
        torch.testing.assert_close(learner.cross, cross)


def test_iid_training_of_a_one_pass_learner_observes_the_first_epoch_only() -> None:
    x, y = _data(1000)
    stream = IIDStream(x, y, batch_size=96, seed=3)  # 10 batches per epoch and 40 rows left over
    learner = make_learner("rls", 3, 2, dtype=torch.float64)
    run_online(learner, stream, x[:50], y[:50], iterations=35, eval_every=35, progress=False)
    assert learner.rows == x.shape[0]
    gram, cross = _rls_sums(x, y)
    torch.testing.assert_close(learner.gram, gram)
    torch.testing.assert_close(learner.cross, cross)


def test_first_pass_rows_cover_each_row_once_then_stop() -> None:
    x = torch.arange(23, dtype=torch.float64)[:, None]
    stream = IIDStream(x, x, batch_size=5, seed=1)
    seen: list[float] = []
    for _ in range(12):
        stream.next_batch()
        rows = stream.first_pass_rows()
        if stream.batches_drawn > 4:
            assert rows is None
        else:
            seen += rows[0].flatten().tolist()
    assert sorted(seen) == list(range(23))


def test_online_updates_of_a_one_pass_learner_are_its_observes() -> None:
    x, y = _data(300)
    learner = make_learner("ssgp", 3, 2, preset="small", dtype=torch.float64)
    pretrain_learner(learner, x[:200], y[:200], progress=False)
    updater = OnlineUpdater(learner, updates=3)
    for row in range(200, 210):
        updater(x[row : row + 1], y[row : row + 1])
    assert learner.rows == 210
    assert updater.summary()["gp_updates"] == 10  # ten observes; no step, which would learn nothing
