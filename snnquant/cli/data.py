"""The data of ``snnquant train``: the training and test sets of ``--dataset``, and the loaders of
each epoch (an order that depends only on ``--seed`` and the epoch; a rank's share under DDP)."""
from __future__ import annotations

import torch

from snnquant.cli.distributed import barrier

def load_data(args, rank):
    """The training and test sets of the run (rank 0 prepares the root, the others wait)."""
    from snnquant.datasets import load_dataset

    if rank == 0:
        if args.data_root is None:
            print("data: no --data-root given, using snnquant's built-in digits dataset in N-MNIST "
                  "format (scikit-learn digits through an emulated DVS saccade recording)")
        else:
            print(f"data: {args.dataset} at {args.data_root}")
    # rank 0 checks and prepares the root; the others wait at the barrier, then load it
    train_set, test_set, _info = load_dataset(args.dataset, args.data_root, args.T,
                                              samples_per_class=args.samples_per_class,
                                              seed=args.seed, rank=rank, barrier=barrier)
    if getattr(args, "crop", None):
        from snnquant.cli.zoo import CroppedDataset
        train_set, test_set = CroppedDataset(train_set, args.crop), CroppedDataset(test_set,
                                                                                   args.crop)
    return train_set, test_set


def make_loaders(train_set, test_set, args, rank, world, epoch):
    """The training and test loaders of ``epoch``: the order depends only on ``--seed`` and the
    epoch (a resumed run sees the same batches); under DDP each rank gets its share."""
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

    if world > 1:
        train_sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True,
                                           seed=args.seed)
        train_sampler.set_epoch(epoch)
        # every test sample exactly once over all ranks (DistributedSampler would pad)
        test_sampler = list(range(rank, len(test_set), world))
    else:
        # the order of epoch e depends only on (seed, e): a resumed run sees the same batches
        g = torch.Generator().manual_seed(args.seed * 100003 + epoch)
        train_sampler = RandomSampler(train_set, generator=g)
        test_sampler = SequentialSampler(test_set)
    kw = dict(batch_size=args.batch_size, num_workers=args.workers,
              pin_memory=args.device.startswith("cuda"))
    return (DataLoader(train_set, sampler=train_sampler, drop_last=False, **kw),
            DataLoader(test_set, sampler=test_sampler, **kw))
