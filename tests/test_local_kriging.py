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


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_blocks_follow_the_device_the_model_is_on(device):
    """for_prediction / for_training size the attention blocks and the kriging head's slices for
    the device the weights are on: cache-sized on a CPU, a few launches a window on a GPU."""
    from geonp.models import build, local_kriging, te_attention

    model = build("te-pt-tnp", dim_x=6, dim_y=1).to(device)  # the shipped model: 3 locations, 3 covariates
    gpu = device == "cuda"

    def sizes():
        attention = {m.max_block_elems for m in model.modules() if isinstance(m, te_attention.TEAttention)}
        kriging = {m.cache_elems for m in model.modules() if isinstance(m, local_kriging.LocalKriging)}
        return attention, kriging

    model.for_training()
    assert sizes() == ({te_attention.TRAIN_BLOCK_ELEMS},
                       {local_kriging.GPU_CACHE_ELEMS if gpu else local_kriging.CACHE_ELEMS})
    assert model.training
    model.for_prediction()
    assert sizes() == ({te_attention.GPU_PREDICT_BLOCK_ELEMS if gpu else te_attention.PREDICT_BLOCK_ELEMS},
                       {local_kriging.GPU_CACHE_ELEMS if gpu else local_kriging.CACHE_ELEMS})
    assert not model.training
