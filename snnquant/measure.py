r"""Per-layer storage and activity of a (quantized) spiking network: what :func:`snnquant.summary`
tabulates and :func:`snnquant.sensitivity` budgets, counted in one place.

:func:`layer_rows` gives one row per synaptic layer and per neuron layer; the formulas are those
of :func:`snnquant.summary`.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import neuron

from .utils import copy_model, is_multi_step

__all__ = ["layer_rows"]


def _bits_of(q) -> Optional[int]:
    return None if q is None else q.num_bits


def _synaptic_ops(module: nn.Module, x: torch.Tensor) -> float:
    """Nonzero inputs times their fan-out, counted exactly (border effects of convolutions included)."""
    mask = (x.detach() != 0)
    if isinstance(module, nn.Linear):
        return float(mask.sum()) * module.out_features
    dims = {nn.Conv1d: 1, nn.Conv2d: 2, nn.Conv3d: 3}[next(
        k for k in (nn.Conv1d, nn.Conv2d, nn.Conv3d) if isinstance(module, k))]
    mask = mask.reshape((-1,) + tuple(mask.shape[-(dims + 1):])).to(torch.float64)
    ones = torch.ones(module.weight.shape, dtype=torch.float64, device=mask.device)
    # a conv of the event mask with all-ones weights counts, per output, the events that reach it
    return float(module._conv_forward(mask, ones, None).sum())


@torch.no_grad()
def _measure(model: nn.Module, example_input: torch.Tensor):
    """Run a copy of ``model`` in eval mode; return per-module synaptic ops and neuron counts."""
    if not isinstance(example_input, torch.Tensor) or example_input.dim() < 3:
        raise ValueError(f"example_input must be a tensor of shape [T, N, ...], got "
                         f"{getattr(example_input, 'shape', type(example_input))}")
    work = copy_model(model).eval()
    sjf.reset_net(work)
    T, N = example_input.shape[0], example_input.shape[1]
    synops: Dict[str, float] = {}
    neurons: Dict[str, int] = {}
    spikes: Dict[str, float] = {}
    handles = []
    for name, m in work.named_modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            def syn_hook(mod, inputs, _out, name=name):
                synops[name] = synops.get(name, 0.0) + _synaptic_ops(mod, inputs[0])
            handles.append(m.register_forward_hook(syn_hook))
        elif isinstance(m, neuron.BaseNode):
            def neuron_hook(_mod, _inputs, out, name=name):
                neurons.setdefault(name, out.numel())
                spikes[name] = spikes.get(name, 0.0) + float((out != 0).sum())
            handles.append(m.register_forward_hook(neuron_hook))
    x = example_input.to(next(iter(work.parameters())).device) if any(True for _ in work.parameters()) \
        else example_input
    try:
        if is_multi_step(work):
            work(x)
            per_call = T * N
        else:
            for t in range(T):
                work(x[t])
            per_call = N
    finally:
        for h in handles:
            h.remove()
    return ({k: v / N for k, v in synops.items()}, {k: v // per_call for k, v in neurons.items()},
            {k: v / N for k, v in spikes.items()})


def layer_rows(model: nn.Module, example_input: Optional[torch.Tensor] = None) -> List[dict]:
    """One dict per synaptic layer (``Linear``/``Conv``) and neuron layer of ``model``, in module
    order: ``name``, ``type``, ``weight_bits``, ``v_bits``, ``params``, ``fp32_bytes``,
    ``quant_bytes``, ``membrane_bits_per_neuron``, and, with ``example_input`` (``[T, N, ...]``,
    run once on a copy in eval mode), ``neurons`` and ``spikes`` per sample of neuron layers,
    ``state_fp32_bytes``/``state_quant_bytes`` and ``synops`` per sample of synaptic layers
    (``None`` where not measured). See :func:`snnquant.summary` for the formulas."""
    measured = _measure(model, example_input) if example_input is not None else None
    rows = []
    for name, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            wq = getattr(m, "weight_quant", None)
            bq = getattr(m, "bias_quant", None)
            wb, bb = _bits_of(wq), _bits_of(bq)
            nw = m.weight.numel()
            nb = m.bias.numel() if m.bias is not None else 0
            qbytes = nw * (wb or 32) / 8 + nb * (bb or 32) / 8
            rows.append(dict(name=name, type=type(m).__name__, weight_bits=wb, v_bits=None,
                             params=nw + nb, fp32_bytes=4.0 * (nw + nb), quant_bytes=qbytes,
                             membrane_bits_per_neuron=None, neurons=None, state_fp32_bytes=None,
                             state_quant_bytes=None, spikes=None,
                             synops=measured[0].get(name, 0.0) if measured else None))
        elif isinstance(m, (neuron.BaseNode,)):
            vb = _bits_of(getattr(m, "v_quant", None))
            np_ = sum(p.numel() for p in m.parameters(recurse=False))
            n = measured[1].get(name) if measured else None
            rows.append(dict(name=name, type=type(m).__name__, weight_bits=None, v_bits=vb,
                             params=np_, fp32_bytes=4.0 * np_, quant_bytes=4.0 * np_,
                             membrane_bits_per_neuron=vb or 32, neurons=n,
                             state_fp32_bytes=None if n is None else 4.0 * n,
                             state_quant_bytes=None if n is None else n * (vb or 32) / 8,
                             spikes=measured[2].get(name) if measured else None, synops=None))
    return rows
