"""Data-parallel training across processes: torchrun's environment, one model per process.

``torchrun --nproc-per-node=G -m geonp.train CONFIG`` starts ``G`` processes with ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE`` and a rendezvous address in their environment. :func:`setup`
reads them, joins the process group (NCCL on CUDA, gloo on CPU) and gives each process its
device; :class:`Group` carries the few collective steps the training loop needs. Without those
variables (a plain ``geonp train``) everything here is a no-op on a group of one.

Why each rank draws its own tasks: the gradients DistributedDataParallel averages are only
worth averaging if the ranks' batches differ, so rank ``r > 0`` seeds its task stream from
``(seed, r)`` while rank 0 keeps the single-process stream (a run on one process is the same
run whether or not it was started by torchrun).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


@dataclass
class Group:
    """This process's place among the training processes (``world == 1``: alone)."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    owns: bool = False  # this module joined the process group, so it leaves it too

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints, logs and the final model; the others only train."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def seed(self, seed: int) -> int:
        """The task-stream seed of this rank (rank 0: ``seed`` itself)."""
        return seed if self.rank == 0 else int(np.random.SeedSequence([seed, self.rank]).generate_state(1)[0])

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` inside DistributedDataParallel (gradients averaged over ranks), or as is alone."""
        if not self.active:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def mean(self, value: float) -> float:
        """``value`` averaged over ranks (for logging the training loss of all of them)."""
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self._comm_device)
        dist.all_reduce(t)
        return t.item() / self.world

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on any (e.g. rank 0's time budget ran out)."""
        if not self.active:
            return flag
        t = torch.tensor([int(flag)], device=self._comm_device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (JSON-like or tensors on the CPU), in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    @property
    def _comm_device(self) -> torch.device:
        # NCCL moves only CUDA tensors; gloo only CPU ones.
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")


def setup(device: torch.device) -> Group:
    """Join the process group torchrun describes (if any) and pick this rank's device.

    ``device`` is the configured device (:func:`geonp.device.resolve_device`); on CUDA each rank takes GPU
    ``LOCAL_RANK``. Raises ValueError (one line) when torchrun's variables are incomplete.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Group(device=device)
    missing = [k for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ValueError(f"WORLD_SIZE={world} but {', '.join(missing)} unset: start distributed training with "
                         "torchrun (or geonp train --ddp N)")
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if device.type == "cuda":
        if local >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local}: only {torch.cuda.device_count()} CUDA device(s) on this node")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    owns = not dist.is_initialized()
    if owns:
        # torch.distributed.nn.functional's collectives take ``group=group.WORLD`` as a default
        # argument, evaluated when the module is first imported. PyTorch imports it when the first
        # torch.optim optimizer is built (through torch._dynamo); imported after the group exists,
        # those defaults hold the group past destroy_process_group, its gloo threads outlive the
        # interpreter's finalisation, and one run in 30 to 100 aborted at exit (SIGABRT,
        # "terminate called without an active exception"). Imported first, the defaults are None.
        importlib.import_module("torch.distributed.nn.functional")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)
    return Group(rank, world, device, owns)


def shutdown(group: Group) -> None:
    """Leave the process group :func:`setup` joined (one the caller set up stays theirs)."""
    if group.owns and dist.is_initialized():
        dist.destroy_process_group()
