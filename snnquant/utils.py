"""Helpers that :mod:`snnquant.convert`, :mod:`snnquant.summary` and :mod:`snnquant.export` share."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

__all__ = ["copy_model", "is_multi_step"]


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
