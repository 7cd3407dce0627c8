"""What the torch front end knows about each value of a graph while it lowers it (its domain,
its bound, an index map of a layout operation), and the function tables it dispatches on."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn as nn

from ...nn import registry
from .common import sj_modules

__all__ = ["Value", "View", "flat_args", "FlattenCall", "module_lead", "arg_text",
           "spiking_part_hint", "POOL_TYPES", "ADAPTIVE_TYPES", "ADD_FUNCTIONS",
           "MUL_FUNCTIONS", "FLATTEN_FUNCTIONS", "TRUEDIV_FUNCTIONS",
           "MATMUL_FUNCTIONS", "LAYOUT_FUNCTIONS", "CONNECT_KINDS", "SPIKES"]


# --------------------------------------------------------------------------------------------------
# graphs

POOL_TYPES = (nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d)
ADAPTIVE_TYPES = (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)
ADD_FUNCTIONS = {operator.add, operator.iadd, torch.add, "add", "add_", "__add__", "__iadd__"}
MUL_FUNCTIONS = {operator.mul, operator.imul, torch.mul, "mul", "mul_"}
FLATTEN_FUNCTIONS = {torch.flatten, "flatten"}
TRUEDIV_FUNCTIONS = {operator.truediv, torch.div, "div", "__truediv__"}
MATMUL_FUNCTIONS = {operator.matmul, torch.matmul, "matmul", "__matmul__"}
#: layout operations: replayed on index maps (:meth:`FunctionLowering.layout`)
LAYOUT_FUNCTIONS = {torch.flatten, "flatten", torch.reshape, "reshape", "view", torch.transpose,
                    "transpose", torch.permute, "permute", "contiguous", torch.chunk, "chunk",
                    torch.split, "split", torch.unflatten, "unflatten", torch.squeeze, "squeeze",
                    torch.unsqueeze, "unsqueeze", "expand", torch.movedim, "movedim",
                    torch.swapaxes, "swapaxes", torch.narrow, "narrow", torch.unbind, "unbind",
                    "clone", torch.clone, "t", torch.t}
CONNECT_KINDS = {"ADD": "add", "AND": "and", "IAND": "iand"}


@dataclass(frozen=True)
class Value:
    """What the export knows about one value of the graph (the input or an operation's output).

    ``domain``: ``'event'`` (spikes, event counts, their sums and sum pools) or ``'current'``
    (a synaptic current); ``frac``: its fractional bits; ``x_bound``: ``('input', factor)``
    (a multiple of the network input) or ``('abs', m)`` (``|value| <= m`` integer units);
    ``cur_log2``: log2 of the largest integer of a current; ``binary``: values are 0 or 1.
    """

    domain: str
    frac: int
    x_bound: Tuple[str, int]
    cur_log2: float = 0.0
    binary: bool = False
    time_mean: bool = False

    def magnitude(self, input_max) -> Optional[int]:
        """The largest integer magnitude (``None``: it depends on an unknown ``input_max``)."""
        if self.domain == "current":
            return int(math.ceil(2.0 ** self.cur_log2))
        if self.x_bound[0] == "input":
            return None if input_max is None else self.x_bound[1] * input_max
        return self.x_bound[1]


SPIKES = Value("event", 0, ("abs", 1), 0.0, True)


class View:
    """A pending layout: one sample of value ``src`` read through ``index`` (a tensor of the
    output's shape holding positions in the source sample, row-major). Materialised as a
    :class:`GatherOp` only where a computing operation reads it (``emitted``)."""

    def __init__(self, src: int, index: torch.Tensor):
        self.src, self.index, self.emitted = src, index, None


def flat_args(args, kwargs):
    """Every argument of a call, nested tuples and lists opened."""
    stack = list(args) + list(kwargs.values())
    while stack:
        a = stack.pop()
        if isinstance(a, (tuple, list)):
            stack.extend(a)
        else:
            yield a


class FlattenCall:
    """``torch.flatten(x, start_dim, end_dim)`` as the module :func:`export_flatten` reads."""

    def __init__(self, start_dim=0, end_dim=-1):
        self.start_dim, self.end_dim = int(start_dim), int(end_dim)


def module_lead(module, multi: bool, default: int) -> int:
    """Leading (time/batch) dimensions ``module`` sees, as :func:`model_walk` counts them."""
    base, _, _ = sj_modules()
    if not multi:
        return 1
    if isinstance(module, base.StepModule) and getattr(module, "step_mode", "s") == "m":
        return 1
    return default


def arg_text(arg) -> str:
    """An operation's argument as an error shows it: a tensor by the node that computes it."""
    if isinstance(arg, torch.fx.Node):
        return "a tensor"
    if isinstance(arg, (tuple, list)):
        return "(" + ", ".join(arg_text(a) for a in arg) + ")"
    return repr(arg)


def spiking_part_hint(name, module) -> str:
    """``; or export one of its parts that has neurons: model.body`` (never a part without one)."""
    _, _, sj_neuron = sj_modules()
    parts = [n for n, c in module.named_children()
             if any(isinstance(m, sj_neuron.BaseNode) for m in c.modules())
             and any(registry.layer_kind(m) is not None for m in c.modules())]
    if not parts:
        return ""
    where = f"model.{name}." if name else "model."
    return f"; or export a part of it that has synaptic layers and neurons, e.g. {where}{parts[0]}"
