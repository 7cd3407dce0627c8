"""Helpers that :mod:`snnquant.convert`, :mod:`snnquant.export`, :mod:`snnquant.summary`,
:mod:`snnquant.calibrate` and :mod:`snnquant.sensitivity` share."""

from __future__ import annotations

import copy
from typing import Iterable, List, Optional, Tuple

import torch
import torch.nn as nn

__all__ = ["copy_model", "is_multi_step", "model_walk", "batch_input", "run_batches"]


def copy_model(model: nn.Module) -> nn.Module:
    """Deep copy of ``model`` that also works right after a training step.

    Neuron states that are still part of an autograd graph (non-leaf tensors, which
    ``copy.deepcopy`` refuses) are copied detached; ``model`` itself is not changed.
    """
    memo = {}

    def seed(value):
        if isinstance(value, torch.Tensor) and not value.is_leaf:
            memo[id(value)] = value.detach().clone()
        elif isinstance(value, dict):
            for v in value.values():
                seed(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                seed(v)

    for m in model.modules():
        for value in vars(m).values():
            seed(value)
    return copy.deepcopy(model, memo)


def is_multi_step(model: nn.Module) -> bool:
    """Whether ``model`` takes whole sequences ``[T, N, ...]`` in one call (SpikingJelly 'm' mode).

    True when a SeqToANNContainer/MultiStepContainer is used or any step module other than a
    quantizer has ``step_mode='m'``; otherwise the model is run one step at a time.
    """
    from spikingjelly.activation_based import base, layer

    from .nn.quantizers import QuantizerBase

    for m in model.modules():
        if isinstance(m, (layer.SeqToANNContainer, layer.MultiStepContainer)):
            return True
        if isinstance(m, base.StepModule) and getattr(m, "step_mode", "s") == "m" and \
                not isinstance(m, QuantizerBase):
            return True
    return False


def batch_input(batch, index: int) -> torch.Tensor:
    """The input tensor ``[T, N, ...]`` of a batch (a tensor, or an ``(input, target)`` pair);
    ``index`` names the batch in the error for anything else."""
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    if not isinstance(x, torch.Tensor) or x.dim() < 3:
        raise ValueError(f"batches[{index}] must be an input tensor [T, N, ...] or an (input, "
                         f"target) pair, got {type(batch).__name__} with input "
                         f"{getattr(x, 'shape', type(x))}")
    return x


def run_batches(model: nn.Module, batches: Iterable, num_batches: Optional[int] = None,
                on_output=None) -> int:
    """Run ``model`` (as it is) over ``batches`` without gradients; return the number of batches.

    Each batch is an input tensor ``[T, N, ...]`` or an ``(input, target)`` pair; a multi-step
    model gets the whole sequence, a single-step model one step at a time. Neuron states are reset
    before each batch and at the end. ``on_output(output [T, N, ...], batch)`` is called per batch.
    """
    from spikingjelly.activation_based import functional as sjf

    multi = is_multi_step(model)
    ref = next((t for t in list(model.parameters()) + list(model.buffers())
                if t.is_floating_point()), None)
    count = 0
    with torch.no_grad():
        for i, batch in enumerate(batches):
            if num_batches is not None and i >= num_batches:
                break
            x = batch_input(batch, i)
            if ref is not None:
                x = x.to(device=ref.device, dtype=ref.dtype if x.is_floating_point() else None)
            sjf.reset_net(model)
            out = model(x) if multi else torch.stack([model(x[t]) for t in range(x.shape[0])])
            if on_output is not None:
                on_output(out, batch)
            count += 1
    sjf.reset_net(model)
    return count


def _container_context(module, inherited: str) -> Optional[str]:
    """Context of the children of a supported container, or None when it is not one."""
    from spikingjelly.activation_based import layer

    if isinstance(module, layer.SeqToANNContainer):
        return "seq"
    if isinstance(module, layer.MultiStepContainer):
        return "step"
    if isinstance(module, layer.StepModeContainer):
        if module.step_mode == "m":
            return "step" if module.stateful else "seq"
        return inherited
    if isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward:
        return inherited
    return None


def model_walk(model: nn.Module) -> List[Tuple[str, nn.Module, int]]:
    """The modules of a sequential network in execution order, as ``(name, module, lead)``.

    ``lead`` is the number of leading (time/batch) dimensions the module sees: 1 for
    ``[T*N, ...]`` or ``[N, ...]``, 2 for a plain module that receives ``[T, N, ...]`` in a
    multi-step network. Supported containers: ``nn.Sequential`` and SpikingJelly's
    ``SeqToANNContainer``, ``MultiStepContainer`` and ``StepModeContainer``, nested freely; any
    other module is returned as a leaf.
    """
    from spikingjelly.activation_based import base

    multi = is_multi_step(model)
    out = []

    def visit(module, name, ctx):
        child_ctx = _container_context(module, ctx)
        if child_ctx is not None:
            for child_name, child in module.named_children():
                visit(child, f"{name}.{child_name}" if name else child_name, child_ctx)
            return
        if not multi or ctx in ("seq", "step"):
            lead = 1
        elif isinstance(module, base.StepModule) and getattr(module, "step_mode", "s") == "m":
            lead = 1
        else:
            lead = 2
        out.append((name or type(module).__name__, module, lead))

    visit(model, "", "top")
    return out
