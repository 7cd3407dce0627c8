r"""What NIR's consumers need beside a graph: the documented workarounds as functions.

* :func:`shift_flatten_dims`: snnTorch 1.0 and Norse 1.1 pass NIR's per-sample ``Flatten`` dims
  straight to ``torch.nn.Flatten``, which then also flattens the batch; shift them past it on the
  module their importer returns.
* :func:`narrow_registers`: a consumer whose membrane register holds less than a layer's grid
  :math:`[v_{min}, v_{max}]` (Lava on Loihi 2: a 24-bit membrane holding the value times
  :math:`2^6`, so :math:`\pm 131{,}071` membrane integers against the :math:`\pm 524{,}288` of the
  guide's 20-bit headroom grid) wraps or saturates where snnquant does not;
  :func:`~snnquant.export.to_nir` warns (:class:`ConsumerRegisterWarning`) naming such layers.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch.nn as nn

from ..ir.network import IntegerNetwork, NeuronOp

__all__ = ["shift_flatten_dims", "ConsumerRegister", "CONSUMER_REGISTERS", "narrow_registers",
           "ConsumerRegisterWarning", "warn_narrow_registers"]


def shift_flatten_dims(module: nn.Module) -> nn.Module:
    """Shift every ``torch.nn.Flatten``'s non-negative ``start_dim``/``end_dim`` in ``module``
    by one, past the batch dimension, in place: the fix-up for importers that give NIR's
    per-sample ``Flatten`` dims to ``torch.nn.Flatten`` (snnTorch 1.0
    ``import_nir.import_from_nir``, Norse 1.1 ``norse.torch.from_nir``).

    Args:
        module: the module a consumer's importer returned.

    Returns:
        ``module`` itself.

    Raises:
        TypeError: ``module`` is not an ``nn.Module``.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module (what the importer returned), got "
                        f"{type(module).__name__}")
    for m in module.modules():
        if isinstance(m, nn.Flatten):
            if m.start_dim >= 0:
                m.start_dim += 1
            if m.end_dim >= 0:
                m.end_dim += 1
    return module


@dataclass(frozen=True)
class ConsumerRegister:
    r"""A consumer's membrane register: ``bits``-bit two's complement holding the membrane
    integer times :math:`2^{f}` (``frac_bits``), so it reaches membrane integers in
    :math:`[-2^{b-1-f}, \lfloor (2^{b-1} - 1) / 2^f \rfloor]`.

    Attributes:
        consumer: the consumer's name.
        bits: :math:`b`, the register width.
        frac_bits: :math:`f`, the bits its fixed-point scaling takes.
        where: where the width comes from, in words.
    """

    consumer: str
    bits: int
    frac_bits: int
    where: str

    @property
    def low(self) -> int:
        """The smallest membrane integer the register holds."""
        return -(1 << (self.bits - 1 - self.frac_bits))

    @property
    def high(self) -> int:
        """The largest membrane integer the register holds."""
        return ((1 << (self.bits - 1)) - 1) >> self.frac_bits


#: The membrane registers of consumers narrower than some snnquant grid, by consumer name.
CONSUMER_REGISTERS: Dict[str, ConsumerRegister] = {
    "lava": ConsumerRegister("lava", 24, 6, "Lava's register (Loihi 2, lava-dl: 24 bits holding "
                                            "the membrane times 2^6)"),
}


class ConsumerRegisterWarning(UserWarning):
    """A consumer's membrane register is narrower than a layer's grid; the message names the
    consumer, the layer, both ranges and what to do."""


def _registers(consumers: Optional[Sequence[str]]) -> List[ConsumerRegister]:
    names = list(CONSUMER_REGISTERS) if consumers is None else consumers
    if isinstance(names, str):
        names = [names]
    unknown = [c for c in names if c not in CONSUMER_REGISTERS]
    if unknown:
        raise ValueError(f"consumers must name consumers of {sorted(CONSUMER_REGISTERS)}, got "
                         f"{unknown!r}")
    return [CONSUMER_REGISTERS[c] for c in names]


def narrow_registers(desc: IntegerNetwork, consumers: Optional[Sequence[str]] = None
                     ) -> List[str]:
    """Per consumer and neuron layer whose grid :math:`[v_{min}, v_{max}]` a consumer's
    register (:data:`CONSUMER_REGISTERS`) does not hold, one line saying so (empty when every
    register holds every grid).

    Args:
        desc: the integer network.
        consumers: names of :data:`CONSUMER_REGISTERS` (default: all).

    Raises:
        ValueError: ``consumers`` names an unknown consumer.
    """
    if not isinstance(desc, IntegerNetwork):
        raise TypeError(f"desc must be an IntegerNetwork, got {type(desc).__name__}")
    lines = []
    for reg in _registers(consumers):
        for op in desc.ops:
            if isinstance(op, NeuronOp) and (op.v_min < reg.low or op.v_max > reg.high):
                lines.append(f"{reg.consumer}: layer {op.name!r} has the {op.v_bits}-bit grid "
                             f"[{op.v_min}, {op.v_max}], wider than [{reg.low}, {reg.high}], "
                             f"what {reg.where} holds")
    return lines


def warn_narrow_registers(desc: IntegerNetwork, consumers: Optional[Sequence[str]] = None,
                          stacklevel: int = 2) -> List[str]:
    """:func:`narrow_registers`, each line as one :class:`ConsumerRegisterWarning` that says
    what to check; returns the lines."""
    lines = narrow_registers(desc, consumers)
    for line in lines:
        warnings.warn(f"{line}: a membrane beyond it is wrapped or clipped there and not in "
                      f"snnquant, so the spikes may differ; check that your data keeps the "
                      f"membranes inside (simulate_nir(graph, x, record=True)[1][layer]['v'] / "
                      f"membrane_unit) or widen the grid by fewer bits",
                      ConsumerRegisterWarning, stacklevel=stacklevel + 1)
    return lines
