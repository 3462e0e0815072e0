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


class PlainAdamW:
    """AdamW with ``torch.optim.AdamW``'s arithmetic (its single-tensor path, the one it takes on
    the CPU: the same weights bit for bit, tested) without ``torch.optim``, for fine-tuning.

    Every ``torch.optim`` optimizer imports ``torch._dynamo`` when it is built: 1.1 s of the
    demo's 18 s te-pt-tnp fill on 2 cores (cProfile), paid by every fine-tuned fill for 30
    steps. Training keeps ``torch.optim.AdamW``, whose state its checkpoints save. The parts
    :func:`optimizer_step` uses are torch's: ``param_groups`` (``lr`` set each step),
    ``zero_grad`` and ``step``; default betas and eps are torch's. Parameters without a gradient
    are left as they are, as torch leaves them.
    """

    def __init__(self, params, lr: float, weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.param_groups = [{"params": list(params), "lr": lr, "weight_decay": weight_decay, "betas": betas,
                              "eps": eps}]
        self.state: dict[torch.Tensor, dict] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.param_groups[0]["params"]:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        lr, decay, (beta1, beta2), eps = group["lr"], group["weight_decay"], group["betas"], group["eps"]
        by_step: dict[float, list[torch.Tensor]] = {}  # parameters at the same step update together
        for p in group["params"]:
            if p.grad is None:
                continue
            if p not in self.state:
                self.state[p] = {"step": 0.0, "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
            self.state[p]["step"] += 1.0
            by_step.setdefault(self.state[p]["step"], []).append(p)
        # On the CPU torch._foreach_* run each tensor's op in turn, in C++: the same arithmetic as one
        # call per tensor (tested bit for bit), without ~370 parameters x 8 Python calls a step (20 ms
        # a step of the demo's fine-tuning on 2 cores, cProfile). On a GPU they are fused kernels,
        # which may round differently in the last bit.
        for step, params in by_step.items():
            grads = [p.grad for p in params]
            exp_avg = [self.state[p]["exp_avg"] for p in params]
            exp_avg_sq = [self.state[p]["exp_avg_sq"] for p in params]
            if decay != 0:
                torch._foreach_mul_(params, 1 - lr * decay)
            torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
            torch._foreach_mul_(exp_avg_sq, beta2)
            torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
            step_size = lr / (1 - beta1 ** step)
            denom = torch._foreach_sqrt(exp_avg_sq)
            torch._foreach_div_(denom, (1 - beta2 ** step) ** 0.5)
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(params, exp_avg, denom, value=-step_size)


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


def optimizer_step(model: NeuralProcess, opt: torch.optim.Optimizer | PlainAdamW, batch: Batch, device: torch.device,
                   lr: float, clip_grad_norm: float, net: torch.nn.Module | None = None) -> float:
    """One update of ``model`` on ``batch``; returns the batch's loss before the update.

    Args:
        model: the model whose parameters ``opt`` updates (in training mode).
        opt: its optimizer (:func:`optimizer`; fine-tuning's :class:`PlainAdamW`).
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
