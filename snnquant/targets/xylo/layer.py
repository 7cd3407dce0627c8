r"""Xylo Audio 2's profile, its layer of neurons (training in the chip's integers), the check of
a network against the chip's limits and the conversion of a float network (the arithmetic:
:mod:`snnquant.targets.xylo`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn as nn
from spikingjelly.activation_based import neuron

from ...functional.chip_neurons import xylo_lif_step
from ...functional.int_limits import int_range
from ...kernels.chip import xylo_lif_multi_step
from .._layer import (ChipLayer, Violation, check_int, chip_layers, field_violations,
                      linear_neuron_pairs, pow2_step, refuse, sources)
from .op import DASH_RANGE, STATE_BITS, WEIGHT_BITS, WEIGHT_SHIFT_RANGE, XyloLayerOp

__all__ = ["XyloProfile", "XYLO_AUDIO2", "XyloLIFLayer", "Violation", "check_xylo",
           "quantize_for_xylo", "field_rules", "xylo_layers"]


@dataclass(frozen=True)
class XyloProfile:
    """What a Xylo chip fixes: sizes, bit widths and ranges.

    Attributes:
        name: the chip (``'xylo-audio2'``: SYNS61201).
        max_inputs: input channels (Rockpool ``xylo_mapper.le_16_input_channels``: 16).
        max_hidden: hidden neurons (Rockpool ``xylo_mapper.mapper(max_hidden_neurons=1000)``).
        max_outputs: readout neurons (``mapper(max_output_neurons=8)``).
        weight_bits: signed weight width (``config_from_specification`` casts to ``int8``).
        state_bits: synaptic current and membrane width (16, signed).
        threshold_range: thresholds (the mapper's ``threshold_dtype`` ``int16``; a threshold
            below 1 would fire on a membrane of 0, so the range starts at 1).
        dash_range: bit-shift decays (4-bit registers: 0 to 15).
        weight_shift_range: weight left shifts (0 to 7).
        max_input_events: events an input channel sends per step (15).
        max_hidden_spikes: spikes a hidden neuron emits per step (31).
        max_output_spikes: spikes a readout neuron emits per step (1).
    """

    name: str = "xylo-audio2"
    max_inputs: int = 16
    max_hidden: int = 1000
    max_outputs: int = 8
    weight_bits: int = WEIGHT_BITS
    state_bits: int = STATE_BITS
    threshold_range: tuple = (1, int_range(STATE_BITS, True)[1])
    dash_range: tuple = DASH_RANGE
    weight_shift_range: tuple = WEIGHT_SHIFT_RANGE
    max_input_events: int = 15
    max_hidden_spikes: int = 31
    max_output_spikes: int = 1

    def quantize_network(self, model: nn.Module, example_input=None) -> nn.Sequential:
        """:func:`~snnquant.quantize_model`'s route for this chip: :func:`quantize_for_xylo`
        with this profile and its defaults (``example_input`` is not needed)."""
        return quantize_for_xylo(model, self)

    @property
    def state_range(self) -> tuple:
        """The saturation bounds of the synaptic current and the membrane."""
        return int_range(self.state_bits, True)

    @property
    def weight_range(self) -> tuple:
        """The integer weight range."""
        return int_range(self.weight_bits, True)


def field_rules(profile: XyloProfile) -> tuple:
    """``(field, lo, hi)`` of a layer's integers: the one rule the layer's constructor,
    :func:`check_xylo` and the file checks apply."""
    return (("threshold", *profile.threshold_range), ("dash_syn", *profile.dash_range),
            ("dash_mem", *profile.dash_range), ("weight_shift", *profile.weight_shift_range),
            ("max_spikes", 1, profile.max_hidden_spikes))


#: Xylo Audio 2 (SYNS61201), the chip Rockpool's ``devices.xylo.syns61201`` and ``xylosim.v2``
#: simulate.
XYLO_AUDIO2 = XyloProfile()


class XyloLIFLayer(ChipLayer):
    r"""A layer of Xylo neurons with their input weights, computing in Xylo's integers.

    Forward, per step (all values integers held in float tensors; see :mod:`snnquant.targets.xylo`
    for the rules), with the input event counts :math:`c` (delayed by ``delay`` steps), the
    integer weights :math:`W = \mathrm{clamp}(\mathrm{round}(w / \Delta), -128, 127)` of the
    latent float weights :math:`w` and the power-of-two step :math:`\Delta`:

    .. math::

        I &\leftarrow d_I(\mathrm{sat\_acc}(I,\ c,\ W \cdot 2^{s}))\\
        V &\leftarrow \mathrm{sat}(V + \mathrm{sat}(\mathrm{sat}(I - (V - d_V(V))) + b))\\
        n &= \min(\lfloor V / \theta \rfloor, n_{max})\,[V \ge \theta]\\
        V &\leftarrow V - n\theta

    Gradients: the weight rounding, the decays' floors and the saturating accumulation pass the
    gradient of the real values they round (:math:`\partial W/\partial w = 1/\Delta` inside the
    range, 0 outside; :math:`\partial d(x)/\partial x = 1 - 2^{-\mathrm{dash}}`;
    :math:`\partial A/\partial I = 1`, :math:`\partial A/\partial c = W 2^s`); each saturation
    :math:`\mathrm{sat}` (to :math:`[-2^{15}, 2^{15}-1]`) passes 1 inside and 0 outside; the
    spike count has the surrogate gradient
    :math:`\partial n/\partial V = \sigma'((V - \theta)/\theta)/\theta` of ``surrogate_function``
    :math:`\sigma`.

    Args:
        in_features, out_features: sizes.
        threshold: :math:`\theta`, an int in the profile's ``threshold_range``.
        dash_syn, dash_mem: :math:`d_I`, :math:`d_V` shifts (ints in ``dash_range``).
        weight_step: :math:`\Delta`, a power of two: float weight = integer weight times it.
        weight_shift: :math:`s` (int in ``weight_shift_range``).
        max_spikes: :math:`n_{max}`: 31 for a hidden layer, 1 for the readout.
        delay: 0 for the layer reading the input channels, 1 for a layer reading another layer.
        bias: whether the layer has a membrane bias :math:`b` (learned; integer, 16-bit).
        input_max: the largest event count an input may carry (15 for the input channels, the
            previous layer's ``max_spikes`` otherwise); larger, negative or fractional counts are
            refused with a ``ValueError``.
        profile: the chip's :class:`XyloProfile`.
        surrogate_function: a SpikingJelly surrogate (default ``surrogate.Sigmoid()``).
        step_mode: ``'s'`` or ``'m'`` (SpikingJelly's contract: ``[N, in]`` or ``[T, N, in]``).
        backend: what runs the ``'m'`` step: ``'auto'`` (the fused kernels of
            :mod:`snnquant.kernels.chip` where they can run, else the torch loop), ``'cpp'``,
            ``'cupy'`` or ``'torch'``; the spikes and states are the same.
    """

    def __init__(self, in_features: int, out_features: int, threshold: int, dash_syn: int = 1,
                 dash_mem: int = 1, weight_step: float = 2.0 ** -7, weight_shift: int = 0,
                 max_spikes: int = 31, delay: int = 0, bias: bool = False,
                 input_max: Optional[int] = None, profile: XyloProfile = XYLO_AUDIO2,
                 surrogate_function=None, step_mode: str = "s",
                 backend: str = "auto"):
        super().__init__(in_features, out_features, weight_step, profile.weight_range,
                         profile.state_range if bias else None, delay,
                         profile.max_input_events if input_max is None else input_max,
                         surrogate_function, step_mode, backend)
        self.profile = profile
        given = dict(threshold=threshold, dash_syn=dash_syn, dash_mem=dash_mem,
                     weight_shift=weight_shift, max_spikes=max_spikes)
        for name, lo, hi in field_rules(profile):
            setattr(self, name, check_int(given[name], lo, hi, name))
        self.register_memory("isyn", 0.0)
        self.register_memory("vmem", 0.0)

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, threshold={self.threshold}, "
                f"dash_syn={self.dash_syn}, dash_mem={self.dash_mem}, "
                f"weight_step=2**{int(math.log2(self.weight_step))}, "
                f"weight_shift={self.weight_shift}, max_spikes={self.max_spikes}, "
                f"delay={self.delay}, bias={self.bias is not None}, step_mode={self.step_mode}, "
                f"backend={self.backend}")

    def integer_op(self, name: str) -> XyloLayerOp:
        """The layer as a :class:`~snnquant.targets.xylo.op.XyloLayerOp` named ``name``."""
        w, b = self._integers()
        return XyloLayerOp(name=name, weight=w, weight_shift=self.weight_shift, bias=b,
                           threshold=self.threshold, dash_syn=self.dash_syn,
                           dash_mem=self.dash_mem, max_spikes=self.max_spikes, delay=self.delay,
                           input_max=self.input_max, state_bits=self.profile.state_bits)

    def _chip_weight(self, w: torch.Tensor) -> torch.Tensor:
        return w * (2.0 ** self.weight_shift)

    def _step(self, c: torch.Tensor, w_shifted: torch.Tensor, b) -> torch.Tensor:
        state = None if not isinstance(self.isyn, torch.Tensor) else (self.isyn, self.vmem)
        n, (self.isyn, self.vmem) = xylo_lif_step(
            state, c, w_shifted, b, threshold=self.threshold, dash_syn=self.dash_syn,
            dash_mem=self.dash_mem, max_spikes=self.max_spikes,
            state_bits=self.profile.state_bits, fire=self._fire)
        return n

    def _multi_step(self, c_seq: torch.Tensor, w_shifted: torch.Tensor, b) -> torch.Tensor:
        state = None if not isinstance(self.isyn, torch.Tensor) else (self.isyn, self.vmem)
        n, state = xylo_lif_multi_step(
            state, c_seq, w_shifted, b, threshold=self.threshold, dash_syn=self.dash_syn,
            dash_mem=self.dash_mem, max_spikes=self.max_spikes,
            state_bits=self.profile.state_bits, surrogate_function=self.surrogate_function,
            backend=self.backend)
        if state is not None:   # None: no step was run on a fresh layer
            self.isyn, self.vmem = state
        return n


# ---- limits -------------------------------------------------------------------------------------
def xylo_layers(model: nn.Module) -> List[tuple]:
    """``(name, layer)`` of every :class:`XyloLIFLayer` of ``model``, in order."""
    return chip_layers(model, XyloLIFLayer, "Xylo")


def check_xylo(model: nn.Module, profile: Optional[XyloProfile] = None) -> List[Violation]:
    """Every way ``model`` (a stack of :class:`XyloLIFLayer`) exceeds ``profile``'s limits.

    Checked: at least one hidden layer and a readout; input channels, hidden neurons and readout
    neurons against the chip's counts; the first layer without delay and every later one with a
    delay of one step; hidden layers with ``max_spikes`` 31 and the readout with 1; each layer's
    ``input_max`` equal to what its source sends; one ``weight_shift`` for all hidden layers after
    the first (the chip has one for ``weights_rec``); every layer's profile being ``profile``;
    each layer's threshold, decays, shift and ``max_spikes`` as they are now (the values the
    export writes), by the rules its constructor applies.

    Args:
        model: the network.
        profile: the chip (default: the layers' own profile).

    Returns:
        The list of :class:`Violation` (empty when the network fits), each naming the layer, the
        limit and the value.
    """
    layers = xylo_layers(model)
    if not layers:
        return [Violation("", "at least one hidden XyloLIFLayer and a readout", "no XyloLIFLayer")]
    profile = profile or layers[0][1].profile
    found = []
    if len(layers) < 2:
        found.append(Violation("", "at least one hidden layer before the readout",
                               f"{len(layers)} layer"))
    hidden, readout = layers[:-1], layers[-1]
    name0, first = layers[0]
    if first.in_features > profile.max_inputs:
        found.append(Violation(name0, f"input channels <= {profile.max_inputs}", first.in_features))
    n_hidden = sum(m.out_features for _, m in hidden)
    if n_hidden > profile.max_hidden:
        found.append(Violation("", f"hidden neurons <= {profile.max_hidden}", n_hidden))
    if readout[1].out_features > profile.max_outputs:
        found.append(Violation(readout[0], f"readout neurons <= {profile.max_outputs}",
                               readout[1].out_features))
    previous = None
    for i, (name, m) in enumerate(layers):
        if m.profile != profile:
            found.append(Violation(name, f"profile {profile.name}", m.profile.name))
        bad = field_violations(name, m, field_rules(profile))
        if bad:
            found += bad
            previous = m
            continue
        want_delay = 0 if i == 0 else 1
        if m.delay != want_delay:
            found.append(Violation(name, f"delay == {want_delay}", m.delay))
        want_spikes = (profile.max_output_spikes if i == len(layers) - 1
                       else profile.max_hidden_spikes)
        if m.max_spikes != want_spikes:
            found.append(Violation(name, f"max_spikes == {want_spikes}", m.max_spikes))
        want_input = profile.max_input_events if previous is None else previous.max_spikes
        if m.input_max != want_input:
            found.append(Violation(name, f"input_max == {want_input}", m.input_max))
        if previous is not None and m.in_features != previous.out_features:
            found.append(Violation(name, f"in_features == {previous.out_features} (the previous "
                                         f"layer's out_features)", m.in_features))
        previous = m
    shifts = {m.weight_shift for _, m in hidden[1:]}
    if len(shifts) > 1:
        found.append(Violation("", "one weight_shift for the hidden layers after the first "
                                   "(weights_rec)", sorted(shifts)))
    return found


def quantize_for_xylo(model: nn.Module, profile: XyloProfile = XYLO_AUDIO2, dash_syn: int = 1,
                      surrogate_function=None, step_mode: str = "m",
                      backend: str = "auto") -> nn.Sequential:
    r"""A SpikingJelly network of ``Linear`` + neuron pairs as a stack of :class:`XyloLIFLayer`
    that trains in Xylo's arithmetic.

    ``model`` is an ``nn.Sequential`` of ``nn.Linear`` (or SpikingJelly ``layer.Linear``) layers,
    each followed by a ``neuron.LIFNode`` or ``neuron.IFNode`` (``nn.Flatten`` /
    ``layer.Flatten`` and ``nn.Identity`` are allowed before the first layer and skipped); the
    last pair becomes the readout. Each pair becomes one layer with:

    * the weights on a power-of-two step :math:`\Delta = 2^{\lceil \log_2(\max|w| / 127)\rceil}`
      (the float weights move over; ``weight_shift`` 0), the ``Linear`` bias as the membrane
      bias in units of :math:`\Delta` (Xylo adds it to the membrane, not the current);
    * the threshold :math:`\theta = \mathrm{round}(V_{th} / \Delta)` (at least 1);
    * ``dash_mem`` :math:`= \mathrm{round}(\log_2 \tau)` for a LIF (its decay
      :math:`1 - 1/\tau` becomes :math:`1 - 2^{-\mathrm{dash}}`), 15 for an IF (the slowest
      decay the chip has); ``dash_syn`` as given (the chip's synaptic current has no
      "instantaneous" setting: ``dash_syn`` 0 would empty it before it reaches the membrane).

    The dynamics differ from the float network's (a current-based neuron, multi-spike hidden
    neurons, one step of delay per layer), so the result is meant to be trained (or fine-tuned):
    every step of training is then the chip's arithmetic.

    Args:
        model: the network (not modified).
        profile: the chip.
        dash_syn: the synaptic decay of every layer.
        surrogate_function: surrogate of the spikes (default ``surrogate.Sigmoid()``).
        step_mode: of the layers.
        backend: of the layers (what runs their ``'m'`` step, see :class:`XyloLIFLayer`).

    Raises:
        ValueError: naming the module, for a module that is not one of the above, a neuron with
            a reset other than soft (``v_reset=None``: the chip subtracts the threshold), a
            ``decay_input=False`` LIF... and listing every limit the result exceeds
            (:func:`check_xylo`).
    """
    pairs = linear_neuron_pairs(model, "Xylo", None, "Xylo resets by subtracting the threshold")
    lo, hi = profile.weight_range
    layers, previous = [], None
    for i, ((lname, lin), (nname, neu)) in enumerate(pairs):
        last = i == len(pairs) - 1
        step = pow2_step(lin.weight, hi)
        if isinstance(neu, neuron.LIFNode):
            dash_mem = min(max(round(math.log2(float(neu.tau))), profile.dash_range[0]),
                           profile.dash_range[1])
        else:
            dash_mem = profile.dash_range[1]
        th = max(1, round(float(neu.v_threshold) / step))
        if th > profile.threshold_range[1]:
            raise ValueError(f"model.{nname}: v_threshold {neu.v_threshold} is {th} weight steps "
                             f"of model.{lname}, beyond the chip's threshold range "
                             f"{profile.threshold_range}")
        new = XyloLIFLayer(lin.in_features, lin.out_features, threshold=th, dash_syn=dash_syn,
                           dash_mem=dash_mem, weight_step=step, weight_shift=0,
                           max_spikes=(profile.max_output_spikes if last
                                       else profile.max_hidden_spikes),
                           delay=0 if i == 0 else 1, bias=lin.bias is not None,
                           input_max=profile.max_input_events if previous is None
                           else previous.max_spikes,
                           profile=profile, surrogate_function=surrogate_function,
                           step_mode=step_mode, backend=backend)
        with torch.no_grad():
            new.weight.copy_(lin.weight.clamp(lo * step, hi * step))
            if lin.bias is not None:
                new.bias.copy_(lin.bias / step)
        new.converted_from = sources((lname, lin), (nname, neu))
        layers.append(new)
        previous = new
    out = nn.Sequential(*layers)
    refuse(check_xylo(out, profile), "quantize_for_xylo")
    return out
