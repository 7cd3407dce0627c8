"""The modules of a sequential network in the order they run (:func:`model_walk`), read by the
integer export and by BatchNorm folding."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch.nn as nn

from ..utils import is_multi_step

__all__ = ["model_walk"]


def _sj():
    from spikingjelly.activation_based import base, layer, neuron
    return base, layer, neuron


def _container_context(module, inherited: str) -> Optional[str]:
    """Context of the children of a supported container, or None when it is not one."""
    _, layer, _ = _sj()
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
    base, _, _ = _sj()
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
