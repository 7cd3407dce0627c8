"""The process group of a ``torchrun`` run of ``snnquant train`` (gloo on CPU, NCCL on CUDA): join
it, wait for every rank, sum over the ranks; without ``torchrun`` each is the one-process answer."""
from __future__ import annotations

import os

import torch

def dist_setup(device: str):
    """Join the process group torchrun set up (gloo on CPU, NCCL on CUDA); return
    ``(rank, world size, local rank)`` ((0, 1, 0) without torchrun)."""
    import torch.distributed as dist
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend=backend)
    rank = dist.get_rank() if dist.is_initialized() else 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return rank, world, local_rank


def barrier():
    """Wait for every rank (nothing without a process group)."""
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()


def all_sum(values, device):
    """``values`` summed over all ranks (as they are on one process), as a list of floats."""
    import torch.distributed as dist
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()
