"""DINEOF's iterations on a torch device (``dineof(..., device=)``): the same fill as NumPy's on
either EOF path, and a fill on a GPU runs them there (``geonp.fill.stack.dineof_device``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_history import low_rank_stack

import geonp.fill.stack as stack
from geonp.fill.engine import infill
from geonp.fill.options import FitOptions
from geonp.tasks import eofs as module
from geonp.tasks.dineof import dineof
from tests.test_nugget_choice import cube


def _spy_iterations(monkeypatch) -> list[str]:
    """Record what kind of matrix each of DINEOF's convergences iterates on."""
    kinds = []
    real = module._iterate

    def spied(work, *rest):
        kinds.append("torch" if torch.is_tensor(work) else "numpy")
        return real(work, *rest)

    monkeypatch.setattr(module, "_iterate", spied)
    return kinds


@pytest.mark.parametrize("dense_steps", [10_000, 8])  # a dense eigh each iteration; Lanczos and block steps past 8
def test_torch_iterations_fill_as_numpys(monkeypatch, dense_steps):
    """On a CPU device the iterations are torch's, and the fill (modes, cross-validation, mean,
    held-out predictions, 1-sigma) is NumPy's to rounding, with the resumed final fill too."""
    _, given = low_rank_stack(steps=40, rows=14, cols=16)
    kinds = _spy_iterations(monkeypatch)
    for resume in (False, True):
        kinds.clear()
        host = dineof(given, dense_steps=dense_steps, resume=resume)
        assert set(kinds) == {"numpy"}
        kinds.clear()
        on_torch = dineof(given, dense_steps=dense_steps, resume=resume, device="cpu")
        assert kinds and set(kinds) == {"torch"}
        assert on_torch.modes == host.modes >= 3
        np.testing.assert_allclose(list(on_torch.cv_rmse.values()), list(host.cv_rmse.values()), rtol=1e-9)
        for name in ("mean", "held_out", "std"):
            np.testing.assert_allclose(getattr(on_torch, name), getattr(host, name), atol=1e-8, err_msg=name)


def test_a_device_out_of_memory_hands_the_convergence_back_to_the_host(monkeypatch):
    """Where the device runs out of memory mid-convergence, the host converges from the same start:
    NumPy's fill to the bit."""
    _, given = low_rank_stack(steps=12, rows=10, cols=11)
    host = dineof(given)
    real = module._iterate
    ran = []

    def short_of_memory(work, *rest):
        ran.append(torch.is_tensor(work))
        if torch.is_tensor(work):
            work.view(-1)[:3] = 99.0  # a partial update the host must not start from
            raise torch.OutOfMemoryError("out of memory")
        return real(work, *rest)

    monkeypatch.setattr(module, "_iterate", short_of_memory)
    fell_back = dineof(given, device="cpu")
    assert ran[:2] == [True, False]
    for name in ("mean", "held_out", "std"):
        np.testing.assert_array_equal(getattr(fell_back, name), getattr(host, name))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_iterations_fill_as_numpys():
    """On a GPU: the fill, climbed or resumed, on either EOF path, and history folds side by side."""
    from geonp.tasks.history import history_folds

    _, given = low_rank_stack(steps=40, rows=14, cols=16)
    for dense_steps in (10_000, 8):
        for resume in (False, True):
            host = dineof(given, dense_steps=dense_steps, resume=resume)
            gpu = dineof(given, dense_steps=dense_steps, resume=resume, device="cuda")
            assert gpu.modes == host.modes
            for name in ("mean", "held_out", "std"):
                np.testing.assert_allclose(getattr(gpu, name), getattr(host, name), atol=1e-8, err_msg=name)
    names = ["dineof", "spread"]
    on_host = history_folds(given, None, names, 3, threads=3)
    on_gpu = history_folds(given, None, names, 3, threads=3, device=torch.device("cuda", 0))
    for a, b in zip(on_host, on_gpu):
        np.testing.assert_array_equal(a.hidden, b.hidden)
        np.testing.assert_allclose(a.covariates, b.covariates, atol=1e-5)


def test_a_fill_runs_dineof_on_its_device_only_when_that_is_a_gpu():
    assert stack.dineof_device(None) is None
    assert stack.dineof_device("cpu") is None and stack.dineof_device(torch.device("cpu")) is None
    assert stack.dineof_device("cuda:1") == torch.device("cuda:1")  # no GPU needed to name one


def test_every_dineof_of_a_fill_is_given_the_fills_device(monkeypatch):
    """The history covariates, the history check's, the nugget check's and calibration's folds,
    fine-tuning's folds and the ``dineof`` baseline all ask :func:`dineof_device` with the fill's
    device; routed to torch on this CPU, the te-pt-tnp fill is the NumPy one's to rounding."""
    asked = []

    def torch_on_cpu(device):
        asked.append(device)
        return torch.device("cpu")

    ds = cube(0.1)  # every step that runs DINEOF on: the nugget check, calibration, fine-tuning's folds
    kwargs = dict(fit=FitOptions(steps=2, history_folds=1), calibrate_sigma=True, check_windows=8, device="cpu")
    host = infill(ds, "v", "te-pt-tnp", **kwargs)
    kinds = _spy_iterations(monkeypatch)
    monkeypatch.setattr(stack, "dineof_device", torch_on_cpu)
    on_torch = infill(ds, "v", "te-pt-tnp", **kwargs)
    assert len(asked) == 4 and all(torch.device(d) == torch.device("cpu") for d in asked)
    assert kinds and set(kinds) == {"torch"}
    np.testing.assert_allclose(on_torch["v"].values, host["v"].values, atol=1e-5)
    for model, more in (("te-pt-tnp", dict(history="auto")), ("dineof", {})):  # the history check; the baseline
        asked.clear()
        infill(ds, "v", model, fit_steps=0, check_windows=8, device="cpu", **more)
        assert [torch.device(d) for d in asked] == [torch.device("cpu")] * (2 if more else 1), model
