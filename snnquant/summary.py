r"""Storage and activity of a (quantized) spiking network: :func:`summary`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import neuron

from .utils import copy_model, is_multi_step

__all__ = ["summary", "Summary"]


@dataclass
class Summary:
    """Per-layer storage and activity table; ``str()`` is the printed table.

    Deployment view: weight bytes at the quantized bit widths vs fp32 (always), membrane state
    bytes at ``v_bits`` vs fp32 and synaptic operations per sample (when :func:`summary` was given
    an ``example_input``; ``None`` otherwise).
    """
    rows: List[dict]
    total_params: int
    total_fp32_bytes: float
    total_quant_bytes: float
    total_state_fp32_bytes: Optional[float] = None
    total_state_quant_bytes: Optional[float] = None
    total_synops: Optional[float] = None
    num_samples: Optional[int] = None
    c_rom_bytes: Optional[int] = None
    c_ram_bytes: Optional[int] = None

    @property
    def compression_ratio(self) -> float:
        """fp32 bytes / quantized bytes of all weights and biases."""
        return self.total_fp32_bytes / self.total_quant_bytes if self.total_quant_bytes else 1.0

    @property
    def state_compression_ratio(self) -> Optional[float]:
        """fp32 bytes / quantized bytes of all membrane state (``None`` when not measured)."""
        if not self.total_state_quant_bytes:
            return None
        return self.total_state_fp32_bytes / self.total_state_quant_bytes

    def __str__(self):
        def num(v, fmt="{:.0f}"):
            return "-" if v is None else fmt.format(v)

        head = ["layer", "type", "w_bits", "v_bits", "params", "fp32 B", "quant B", "v bits/neuron",
                "neurons", "state fp32 B", "state quant B", "synops/sample"]
        body = [[r["name"], r["type"], str(r["weight_bits"] or "-"), str(r["v_bits"] or "-"),
                 str(r["params"]), f"{r['fp32_bytes']:.0f}", f"{r['quant_bytes']:.0f}",
                 str(r["membrane_bits_per_neuron"] or "-"), num(r.get("neurons")),
                 num(r.get("state_fp32_bytes")), num(r.get("state_quant_bytes")),
                 num(r.get("synops"))] for r in self.rows]
        body.append(["total", "", "", "", str(self.total_params), f"{self.total_fp32_bytes:.0f}",
                     f"{self.total_quant_bytes:.0f}", "", "", num(self.total_state_fp32_bytes),
                     num(self.total_state_quant_bytes), num(self.total_synops)])
        widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
        fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
        lines = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(b) for b in body]
        lines.append(f"compression ratio (fp32 / quantized): {self.compression_ratio:.2f}x")
        if self.total_state_quant_bytes is not None:
            lines.append(f"membrane state: {self.total_state_fp32_bytes:.0f} B at fp32, "
                         f"{self.total_state_quant_bytes:.0f} B at v_bits "
                         f"({self.state_compression_ratio:.2f}x)")
        if self.c_rom_bytes is not None:
            lines.append(f"C model (to_c): ROM {self.c_rom_bytes} B, RAM {self.c_ram_bytes} B")
        if self.total_synops is not None:
            lines.append(f"synaptic operations per sample: {self.total_synops:.0f} (measured on "
                         f"{self.num_samples} samples: nonzero inputs x fan-out)")
        return "\n".join(lines)


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


def summary(model: nn.Module, example_input: Optional[torch.Tensor] = None, *,
            integer=None) -> Summary:
    r"""Storage of each synaptic layer and neuron layer of ``model``, and its activity on a batch.

    Per layer: weight bits, membrane bits, parameter count, bytes at fp32 (:math:`4n`) and quantized
    (:math:`n_w b_w / 8 + n_b b_b / 8`, unquantized tensors counted at 32 bits), membrane state bits
    per neuron. Totals and ``compression_ratio`` = fp32 bytes / quantized bytes.

    With ``example_input`` (``[T, N, ...]``; a single-step model is called once per step) the
    model's copy runs once in eval mode and the rows also get:

    * neuron layers: ``neurons`` per sample, membrane state bytes ``state_fp32_bytes`` =
      :math:`4 n` and ``state_quant_bytes`` = :math:`n\, b_v / 8` (32 bits without a membrane
      quantizer), and ``spikes`` per sample (all steps);
    * synaptic layers: ``synops`` per sample (all steps), the synaptic operations

      .. math::

          \mathrm{SynOps} = \sum_{t} \sum_{i:\, x_t[i] \ne 0} \mathrm{fanout}(i)

      with the fan-out of input :math:`i` the number of weights that read it: ``out_features``
      for a linear layer; for a convolution counted exactly, border positions and stride
      included, as the sum of the convolution of the event mask with all-ones weights.
      Non-binary inputs (event counts) count once per nonzero entry.

    Args:
        model: the network.
        example_input: optional input batch ``[T, N, ...]`` to measure activity.
        integer: optional :class:`~snnquant.export.IntegerNetwork` of ``model``: the summary then
            also reports ``c_rom_bytes``/``c_ram_bytes`` of its C model
            (:func:`~snnquant.export.c_memory`; the input shape from ``example_input``).

    Returns:
        A :class:`Summary`.
    """
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
    total_params = sum(r["params"] for r in rows)
    extra = {}
    if measured:
        extra = dict(
            total_state_fp32_bytes=sum(r["state_fp32_bytes"] or 0.0 for r in rows),
            total_state_quant_bytes=sum(r["state_quant_bytes"] or 0.0 for r in rows),
            total_synops=sum(r["synops"] or 0.0 for r in rows),
            num_samples=int(example_input.shape[1]))
    if integer is not None:
        from .export.c_runtime import c_memory
        mem = c_memory(integer, None if example_input is None else tuple(example_input.shape[2:]))
        extra.update(c_rom_bytes=mem.rom_bytes, c_ram_bytes=mem.ram_bytes)
    return Summary(rows, total_params, sum(r["fp32_bytes"] for r in rows),
                   sum(r["quant_bytes"] for r in rows), **extra)
