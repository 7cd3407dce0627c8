r"""Check that the integer network and the fake-quantized float model spike identically.

:func:`compare_integer` runs both on the same input and compares every neuron layer at every step;
:func:`integer_agreement` returns the one number an example prints.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
import torch.nn as nn

from ...utils import copy_model, is_multi_step

from ..ir.network import IntegerNetwork
from ..frontend.torch_model import to_integer
from ..backends.simulator import IntegerSNN

__all__ = ["IntegerAgreement", "SilentNetworkWarning", "compare_integer", "integer_agreement",
           "run_float_reference"]


class SilentNetworkWarning(UserWarning):
    """:func:`compare_integer` compared a network in which a neuron layer (or the spiking output)
    never spiked on the data: agreement there checks only that both stay silent."""


@dataclass
class IntegerAgreement:
    r"""How far the integer network agrees with the float model on one input batch.

    Attributes:
        layers: per neuron layer, the fraction of identical spike values over
            ``[T, N, neurons]``.
        output: fraction of identical output values (spikes, or currents compared exactly).
        samples: fraction of samples whose whole output sequence (every step and output neuron)
            is identical.
        predictions: fraction of samples with the same prediction, the argmax over classes of the
            output summed over time (spike count; ties go to the lowest index in both models).
        first_mismatch: where the first difference is (layer, step, sample, flat neuron index),
            or ``None``.
        approximate_layers: the description's layers with a fixed-point leak
            (``exact=False``); when not empty, agreement is measured, not guaranteed.
        silent_layers: the neuron layers that never spiked on the data (in the float model);
            agreement on them checks nothing.
    """

    layers: Dict[str, float] = field(default_factory=dict)
    output: float = 1.0
    samples: float = 1.0
    predictions: float = 1.0
    first_mismatch: Optional[str] = None
    approximate_layers: List[str] = field(default_factory=list)
    silent_layers: List[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        """True when every layer, step and sample agrees."""
        return self.first_mismatch is None

    def __str__(self):
        lines = [f"integer vs float: samples identical {100 * self.samples:.2f}%, output values "
                 f"{100 * self.output:.4f}%, predictions {100 * self.predictions:.2f}%"]
        if self.approximate_layers:
            lines.append(f"  approximate export (fixed-point leak in "
                         f"{', '.join(self.approximate_layers)}): agreement is not guaranteed")
        lines += [f"  {name}: {100 * v:.4f}% identical spikes" for name, v in self.layers.items()]
        if self.silent_layers:
            lines.append(f"  never spiked (checks nothing): {', '.join(self.silent_layers)}")
        if self.first_mismatch:
            lines.append(f"  first mismatch: {self.first_mismatch}")
        return "\n".join(lines)


def _integer_input(x_seq: torch.Tensor) -> torch.Tensor:
    if not isinstance(x_seq, torch.Tensor):
        raise TypeError(f"x_seq must be a tensor, got {type(x_seq).__name__}")
    if x_seq.dim() < 3:
        raise ValueError(f"x_seq must have shape [T, N, ...], got shape {tuple(x_seq.shape)}")
    if x_seq.is_floating_point():
        x_int = x_seq.to(torch.int64)
        if not torch.equal(x_int.to(x_seq.dtype), x_seq):
            raise ValueError("x_seq must hold integer values (event counts or spikes); it has "
                             "non-integer entries")
        return x_int
    return x_seq.to(torch.int64)


def run_float_reference(model: nn.Module, x_seq: torch.Tensor, names, dtype: torch.dtype,
                        device="cpu"):
    """Run a copy of ``model`` in eval mode on ``x_seq`` and record the named modules' outputs.

    Returns ``(output [T, N, ...], {name: output [T, N, ...]})``; single-step models are called
    once per time step. The model itself is not modified.
    """
    from spikingjelly.activation_based import functional as sjf

    ref = copy_model(model).to(device=device, dtype=dtype).eval()
    sjf.reset_net(ref)
    modules = dict(ref.named_modules())
    store = {n: [] for n in names}
    handles = [modules[n].register_forward_hook(
        lambda _m, _i, out, n=n: store[n].append(out.detach())) for n in names if n in modules]
    x = x_seq.to(device=device, dtype=dtype)
    try:
        with torch.no_grad():
            if is_multi_step(ref):
                out = ref(x)
                rec = {n: v[0] for n, v in store.items() if v}
            else:
                out = torch.stack([ref(x[t]) for t in range(x.shape[0])])
                rec = {n: torch.stack(v) for n, v in store.items() if v}
    finally:
        for h in handles:
            h.remove()
    return out, rec


def compare_integer(model: nn.Module, x_seq: torch.Tensor, desc: Optional[IntegerNetwork] = None,
                    *, reference_dtype: Optional[torch.dtype] = None,
                    device="cpu", leak_bits: Optional[int] = None,
                    _stacklevel: int = 2) -> IntegerAgreement:
    r"""Run the fake-quantized model and its integer export on ``x_seq`` and compare them.

    .. math::

        \text{layers}[\ell] = \frac{1}{T N n_\ell} \sum_{t, i, j} [S^{float}_{\ell}[t, i, j] =
        S^{int}_{\ell}[t, i, j]]

    The float model runs in eval mode in the description's reference dtype on ``device``
    (CPU by default: its float kernels sum exactly when exact sums are representable, which the
    export's bounds guarantee; cuDNN may choose Winograd or FFT convolutions, and TF32, that do
    not); the integer network runs on CPU with ``x_seq`` converted to ``int64``.

    For an exact description (``desc.exact``) every number is 1.0 by construction. For one with
    a fixed-point leak (``to_integer(..., leak_bits=F)``, ``desc.exact`` false) the numbers are
    measured agreement, not guaranteed; ``approximate_layers`` names those layers.

    Args:
        model: the quantized model (not modified).
        x_seq: input ``[T, N, ...]`` of integer values (event counts or spikes; float or integer
            dtype).
        desc: the exported network; default: ``to_integer(model, reference_dtype=...)``.
        reference_dtype: dtype of the float run when ``desc`` is not given.
        device: device of the float run.
        leak_bits: passed to :func:`~snnquant.export.to_integer` when ``desc`` is not given.

    Returns:
        An :class:`IntegerAgreement`. Where a neuron layer never spiked on ``x_seq``, a
        :class:`SilentNetworkWarning` names it (100% agreement on a silent layer checks nothing).
    """
    x_int = _integer_input(x_seq)
    if desc is None:
        desc = to_integer(model, reference_dtype=reference_dtype, leak_bits=leak_bits,
                          input_shape=tuple(x_seq.shape[2:]))
    elif not isinstance(desc, IntegerNetwork):
        raise TypeError(f"desc must be an IntegerNetwork, got {type(desc).__name__}")
    dtype = getattr(torch, desc.reference_dtype)
    names = desc.neuron_names
    out_f, rec_f = run_float_reference(model, x_int, names, dtype, device)
    out_i, rec_i = IntegerSNN(desc)(x_int, record=True)
    report = IntegerAgreement(approximate_layers=desc.approximate_layers)
    T, N = x_int.shape[0], x_int.shape[1]
    for name in names:
        if name not in rec_f:
            raise RuntimeError(f"neuron layer {name!r} produced no output in the float model")
        a = rec_f[name].cpu().reshape(T, N, -1)
        b = rec_i[name].reshape(T, N, -1).to(a.dtype)
        if a.shape != b.shape:
            raise RuntimeError(f"layer {name!r}: float spikes have shape {tuple(a.shape)}, integer "
                               f"spikes {tuple(b.shape)}")
        same = a == b
        report.layers[name] = float(same.float().mean()) if same.numel() else 1.0
        if not bool(a.any()):
            report.silent_layers.append(name)
        if report.first_mismatch is None and not bool(same.all()):
            t, n, j = (int(v) for v in (~same).nonzero()[0])
            report.first_mismatch = (f"layer {name!r}, step {t}, sample {n}, neuron {j}: float "
                                     f"{float(a[t, n, j]):g}, integer {int(b[t, n, j])}")
    steps = 1 if desc.output_time_mean else T   # the model's output averages over time
    of = out_f.cpu().double().reshape(steps, N, -1)
    oi = out_i.double().reshape(steps, N, -1)
    divisor = desc.output_divisor * (T if desc.output_time_mean else 1)
    if divisor != 1:  # rounded to the float model's dtype, as the model rounds
        oi = (oi / divisor).to(dtype).double()
    if of.shape != oi.shape:
        raise RuntimeError(f"float output has shape {tuple(out_f.shape)}, integer output "
                           f"{tuple(out_i.shape)}")
    same = of == oi
    report.output = float(same.double().mean()) if same.numel() else 1.0
    report.samples = float(same.all(dim=2).all(dim=0).double().mean()) if N else 1.0
    report.predictions = float((of.sum(0).argmax(-1) == oi.sum(0).argmax(-1)).double().mean()) \
        if N else 1.0
    if report.first_mismatch is None and not bool(same.all()):
        t, n, j = (int(v) for v in (~same).nonzero()[0])
        report.first_mismatch = f"output, step {t}, sample {n}, index {j}"
    if report.silent_layers:
        output = " (the output layer among them)" if names and names[-1] in \
            report.silent_layers and desc.output_kind != "current" else ""
        warnings.warn(f"neuron layers that never spiked on these {N} samples{output}: "
                      f"{', '.join(report.silent_layers)}; agreement on them checks only that "
                      f"both models stay silent: compare on data that makes them spike",
                      SilentNetworkWarning, stacklevel=_stacklevel)
    return report


def integer_agreement(model: nn.Module, x_seq: torch.Tensor,
                      desc: Optional[IntegerNetwork] = None, **kwargs) -> float:
    r"""Fraction of samples on which the integer network reproduces the float model exactly.

    .. math::

        \text{agreement} = \frac{1}{N}\sum_{i=1}^{N}
            \big[S^{float}_{out}[t, i, :] = S^{int}_{out}[t, i, :]\ \forall t\big]

    A sample counts as agreeing only when its whole output sequence (every time step and every
    output neuron; currents compared exactly for a synaptic readout) is identical, so 1.0 also
    means identical predictions (for an exact description it is 1.0 by construction; with a
    fixed-point leak it is measured, not guaranteed). Per-layer, per-step details:
    :func:`compare_integer`.

    Args:
        model: the quantized model (eval-mode behaviour is compared; it is not modified).
        x_seq: integer-valued input ``[T, N, ...]``.
        desc: the exported network (default: exported from ``model`` here).
        **kwargs: ``reference_dtype``, ``device``, ``leak_bits`` as in :func:`compare_integer`.

    Returns:
        A float in :math:`[0, 1]`.
    """
    return compare_integer(model, x_seq, desc, _stacklevel=3, **kwargs).samples
