"""Shared test helper: record the dtype of every tensor an operation produces."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode


class RecordDtypes(TorchDispatchMode):
    """``with RecordDtypes() as rec: ...`` fills ``rec.dtypes`` with ``(op name, dtype)`` pairs."""

    def __init__(self):
        super().__init__()
        self.dtypes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in torch.utils._pytree.tree_leaves(out):
            if isinstance(o, torch.Tensor):
                self.dtypes.append((str(func), o.dtype))
        return out
