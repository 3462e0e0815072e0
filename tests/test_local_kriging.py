"""The local kriging head's solver: robust to covariances float rounding leaves not quite positive definite."""

import pytest
import torch

from geonp.models.kriging_linalg import robust_cholesky, spd_solve


def test_spd_solve_jitters_a_matrix_rounding_left_not_positive_definite():
    good = torch.tensor([[2.0, 0.5], [0.5, 1.0]])
    bad = torch.tensor([[1.0, 1.0], [1.0, 1.0 - 1e-7]])  # two identical neighbours, no nugget
    k = torch.stack([good, bad])  # [2, 2, 2]
    chol = robust_cholesky(k)
    torch.testing.assert_close(chol[0], torch.linalg.cholesky(good))  # untouched
    assert torch.isfinite(chol).all() and (chol[1].diagonal() > 0).all()
    x = spd_solve(k, torch.ones(2, 2, 1))
    assert torch.isfinite(x).all()
    with pytest.raises(torch.linalg.LinAlgError, match="not positive definite"):
        robust_cholesky(torch.tensor([[1.0, 0.0], [0.0, -1.0]]))
