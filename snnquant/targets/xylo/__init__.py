r"""SynSense Xylo Audio 2 (SYNS61201): its neuron arithmetic, its limits, training in that
arithmetic, and export to the specification that Rockpool's ``XyloSim`` (SynSense's ``xylosim``
simulator) and Rockpool's ``config_from_specification`` take.

**The arithmetic** (read from ``xylosim`` 0.1.3, SynSense's C++ simulator, and tested against it
in ``tests/test_targets_xylo.py``; the shapes and limits from Rockpool 3.1's
``devices/xylo/syns61201``). A Xylo network is a layer of up to 16 input channels, a population
of up to 1000 hidden neurons and up to 8 readout neurons. Each neuron has a synaptic current
:math:`I` and a membrane :math:`V`, 16-bit signed integers. Per time step :math:`t`, for each
neuron, with its weights :math:`w` (8-bit signed) shifted left by the layer's ``weight_shift``
:math:`s`, its bit-shift decays :math:`d_I`, :math:`d_V` (:func:`~snnquant.functional.bitshift.
bitshift_decay`), threshold :math:`\theta` and bias :math:`b`:

* :math:`I \leftarrow d_I(A)`, where :math:`A` adds the step's input events to :math:`I` one event
  at a time, in the order of the sources, saturating to :math:`[-2^{15}, 2^{15}-1]` after each
  (:func:`~snnquant.functional.bitshift.saturating_accumulate`);
* :math:`V \leftarrow \mathrm{sat}(V + \mathrm{sat}(\mathrm{sat}(I - \ell_V) + b))`, where
  :math:`\ell_V = V - d_V(V)` is the membrane's leak and :math:`\mathrm{sat}` saturates to
  :math:`[-2^{15}, 2^{15}-1]`: the change of the membrane saturates before it is added (a
  membrane of :math:`-2^{15}` that receives :math:`I = 31744` goes to :math:`-1`, not to
  :math:`d_V(-2^{15}) + I`);
* :math:`n = \min(\lfloor V/\theta \rfloor, 31)` spikes if :math:`V \ge \theta` (hidden neurons;
  a readout neuron fires at most 1), and :math:`V \leftarrow V - n\theta`.

An input channel sends up to 15 events per step (Rockpool's ``XyloSamna.evolve``: "Up to 15 input
events can be sent per bin"). Hidden-to-hidden (``weights_rec``) and hidden-to-readout events
arrive one step after the spikes that send them. A hidden neuron's ``n`` spikes are ``n``
events.

**The network snnquant maps onto it**: a stack of :class:`XyloLIFLayer`: the first reads the input
channels (``weights_in``), each next hidden layer reads the previous one through
``weights_rec`` (one step later: ``delay=1``), and the last layer is the readout
(``weights_out``, one step later, at most one spike per step). Every layer computes in Xylo's
integers in training too (float tensors holding integers; straight-through gradients for the
roundings and the surrogate gradient for the spikes), so the exported network computes what was
trained.
"""

from .layer import XYLO_AUDIO2, Violation, XyloLIFLayer, XyloProfile, check_xylo, quantize_for_xylo
from .op import XyloLayerOp
from .vendor import XyloSpec, load_xylo, run_xylosim, save_xylo, to_xylo

__all__ = ["XyloProfile", "XYLO_AUDIO2", "XyloLIFLayer", "Violation", "check_xylo",
           "quantize_for_xylo", "XyloSpec", "to_xylo", "save_xylo", "load_xylo", "run_xylosim",
           "XyloLayerOp"]
