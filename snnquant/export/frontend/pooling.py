"""The torch front end's pooling and reshape layers: max, average, adaptive and voting pools,
and flatten."""

from __future__ import annotations

import math

import torch.nn as nn

from ...functional.int_limits import pow2_exponent
from ..ir.program import adaptive_windows
from ..ir.network import FlattenOp, PoolOp
from .common import fail_layer

__all__ = ["export_pool", "export_voting", "export_adaptive_pool", "export_flatten"]


# --------------------------------------------------------------------------------------------------
# pooling / flatten

def _tuple(v, n):
    if isinstance(v, int):
        return (int(v),) * n
    return tuple(int(x) for x in v)


def export_pool(name, module, domain):
    dims = 2 if isinstance(module, (nn.MaxPool2d, nn.AvgPool2d)) else 1
    ks = _tuple(module.kernel_size, dims)
    stride = _tuple(module.stride if module.stride is not None else module.kernel_size, dims)
    padding = _tuple(module.padding, dims)
    if isinstance(module, (nn.MaxPool1d, nn.MaxPool2d)):
        if module.return_indices:
            fail_layer(name, module, "return_indices=True is not supported")
        return PoolOp(name=name, kind="max", dims=dims, kernel_size=ks, stride=stride,
                      padding=padding, dilation=_tuple(module.dilation, dims),
                      ceil_mode=bool(module.ceil_mode), frac_bits_added=0), 1
    if domain != "event":
        fail_layer(name, module, "average pooling of synaptic currents is not supported; pool the "
                            "spikes after the neuron instead")
    if module.ceil_mode:
        fail_layer(name, module, "ceil_mode=True changes the divisor at the border; not exact")
    if any(padding) and not module.count_include_pad:
        fail_layer(name, module, "padding with count_include_pad=False changes the divisor at the "
                            "border; not exact")
    area = 1
    for v in ks:
        area *= v
    divisor = getattr(module, "divisor_override", None) or area
    a = pow2_exponent(float(divisor))
    if a is None:
        fail_layer(name, module, f"average pooling divides by {divisor}, not a power of two, so the "
                            f"pooled value is not an exact binary fraction")
    return PoolOp(name=name, kind="sum", dims=dims, kernel_size=ks, stride=stride, padding=padding,
                  dilation=(1,) * dims, ceil_mode=False, frac_bits_added=int(a)), area


def export_voting(name, module, domain):
    """SpikingJelly's ``VotingLayer``: the average of ``voting_size`` features, as a sum pool."""
    if domain != "event":
        fail_layer(name, module, "a VotingLayer of synaptic currents is not supported; vote with the "
                            "spikes after the neuron")
    size = int(module.voting_size)
    a = pow2_exponent(float(size))
    return PoolOp(name=name, kind="sum", dims=1, kernel_size=(size,), stride=(size,),
                  padding=(0,), dilation=(1,), ceil_mode=False, frac_bits_added=int(a or 0),
                  divisor=1 if a is not None else size), size


def export_adaptive_pool(name, module, domain, in_shape):
    r"""An adaptive average pool whose windows all hold :math:`2^a` elements, as a sum pool."""
    dims = 2 if isinstance(module, nn.AdaptiveAvgPool2d) else 1
    if domain != "event":
        fail_layer(name, module, "average pooling of synaptic currents is not supported; pool the "
                            "spikes after the neuron instead")
    size_in = tuple(int(v) for v in in_shape[-dims:])
    size_out = module.output_size
    size_out = (size_out,) * dims if isinstance(size_out, int) else tuple(size_out)
    size_out = tuple(int(o) if o is not None else i for o, i in zip(size_out, size_in))
    kernel = []
    for i, o in zip(size_in, size_out):
        widths = {b - a for a, b in adaptive_windows(i, o)}
        if len(widths) != 1:
            fail_layer(name, module, f"adaptive pooling from {size_in} to {size_out} has windows of "
                                f"{sorted(widths)} elements, so its divisor is not one number; "
                                f"use an input size that the output size divides")
        kernel.append(widths.pop())
    area = math.prod(kernel)
    a = pow2_exponent(float(area))
    if a is None:
        fail_layer(name, module, f"adaptive average pooling from {size_in} to {size_out} divides by "
                            f"{area}, not a power of two, so the pooled value is not an exact "
                            f"binary fraction")
    return PoolOp(name=name, kind="sum", dims=dims, kernel_size=tuple(kernel),
                  stride=tuple(kernel), padding=(0,) * dims, dilation=(1,) * dims,
                  ceil_mode=False, frac_bits_added=int(a), output_size=size_out), area


def export_flatten(name, module, lead, refuse=None):
    """A FlattenOp; a refusal goes to ``refuse(reason)`` (default: names layer ``name``)."""
    refuse = refuse or (lambda reason: fail_layer(name, module, reason))
    start, end = int(module.start_dim), int(module.end_dim)
    if start >= 0:
        start -= lead
        if start < 0:
            refuse(f"it flattens the time or batch dimension (start_dim={module.start_dim} on "
                   f"an input with {lead} leading dimensions)")
    if end >= 0:
        end -= lead
        if end < 0:
            refuse(f"end_dim={module.end_dim} lies in the time/batch dimensions")
    return FlattenOp(name=name, start_dim=start, end_dim=end)
