r"""Storage and activity of a (quantized) spiking network: :func:`summary` (the table of the
per-layer counts of :mod:`snnquant.measure`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn as nn

from .measure import layer_rows

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
    rows = layer_rows(model, example_input)
    total_params = sum(r["params"] for r in rows)
    extra = {}
    if example_input is not None:
        extra = dict(
            total_state_fp32_bytes=sum(r["state_fp32_bytes"] or 0.0 for r in rows),
            total_state_quant_bytes=sum(r["state_quant_bytes"] or 0.0 for r in rows),
            total_synops=sum(r["synops"] or 0.0 for r in rows),
            num_samples=int(example_input.shape[1]))
    if integer is not None:
        from .export.backends.c_runtime import c_memory
        mem = c_memory(integer, None if example_input is None else tuple(example_input.shape[2:]))
        extra.update(c_rom_bytes=mem.rom_bytes, c_ram_bytes=mem.ram_bytes)
    return Summary(rows, total_params, sum(r["fp32_bytes"] for r in rows),
                   sum(r["quant_bytes"] for r in rows), **extra)
