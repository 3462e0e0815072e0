"""One optimizer step of a neural process: the loss and the update training and fine-tuning share.

Training (:mod:`geonp.train`, resumable runs, several processes) and fine-tuning on a user's
cube (:mod:`geonp.fill.finetune`, a few dozen steps in memory) optimise the same thing: the
Gaussian negative log-likelihood of the target values, averaged over a batch of tasks, with
AdamW and gradients clipped by norm. Both call this module, so the two cannot drift apart.
"""

from __future__ import annotations

import torch

from geonp.metrics import task_log_likelihood
from geonp.models.base import NeuralProcess
from geonp.tasks.batch import Batch


def optimizer(model: NeuralProcess, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over ``model``'s parameters (``weight_decay = 0``: Adam)."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)


def task_loss(model: torch.nn.Module, batch: Batch, device: torch.device) -> torch.Tensor:
    """Mean negative log-likelihood (nats per target, averaged per task) of ``batch``'s targets.

    ``model`` follows the calling convention ``model(xc, yc, xt, mask_c, mask_t) -> Normal``
    (``xc [B, Nc, Dx]``, ``yc [B, Nc, Dy]``, ``xt [B, Nt, Dx]``, masks ``[B, Nc]``/``[B, Nt]``);
    it may be wrapped for several processes. On CUDA the forward pass runs in bfloat16 autocast.
    """
    batch = batch.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        dist = model(batch.xc, batch.yc, batch.xt, batch.mask_c, batch.mask_t)
    return -task_log_likelihood(dist, batch.yt, batch.mask_t).mean()


def optimizer_step(model: NeuralProcess, opt: torch.optim.Optimizer, batch: Batch, device: torch.device,
                   lr: float, clip_grad_norm: float, net: torch.nn.Module | None = None) -> float:
    """One update of ``model`` on ``batch``; returns the batch's loss before the update.

    Args:
        model: the model whose parameters ``opt`` updates (in training mode).
        opt: its optimizer (:func:`optimizer`).
        batch: the tasks of this step.
        device: where ``model`` is.
        lr: the learning rate of this step (set every step: a resumed state holds the rate it was
            saved at, and a schedule changes it).
        clip_grad_norm: the largest gradient norm (over all parameters) before the update.
        net: what computes the loss, when not ``model`` itself (``model`` inside
            DistributedDataParallel, which averages gradients over processes).
    """
    loss = task_loss(model if net is None else net, batch, device)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
    for params in opt.param_groups:
        params["lr"] = lr
    opt.step()
    return loss.item()
