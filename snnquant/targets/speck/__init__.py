r"""SynSense Speck (DYNAP-CNN cores) through Sinabs: the integrate-and-fire arithmetic of Sinabs'
``DynapcnnNetwork`` simulation, training in it, the chip's core memory checks, and export to
the layers Sinabs maps onto the chip, checked on Sinabs' discretised simulation.

**The arithmetic** (Sinabs 3.1.3, read from ``sinabs/layers/functional/lif.py``
``lif_forward_single``, ``sinabs/activation/spike_generation.py`` ``MultiSpike`` and
``SingleSpike``, ``sinabs/activation/reset_mechanism.py`` ``MembraneSubtract``,
``sinabs/backend/dynapcnn/discretize.py`` and ``dynapcnn_layer.py``; tested against Sinabs' own
run in ``tests/test_targets_speck.py``). A Speck layer is a convolution (a ``Linear`` layer is a
convolution whose kernel covers its whole input), integrate-and-fire neurons without leak and an
optional sum pooling. Per time step, with the input event counts :math:`x`, the 8-bit weights
:math:`W`, the bias :math:`b`, the threshold :math:`\theta` (16-bit) and the lower bound
:math:`v_{min}`:

* :math:`v \leftarrow v + W * x + b`;
* :math:`n = \lfloor v / \theta \rfloor` where :math:`v > 0`, else 0 (Sinabs' ``MultiSpike``,
  the default of its ``IAFSqueeze``; with ``SingleSpike``, :math:`n = [v \ge \theta]`);
* :math:`v \leftarrow \max(v - n\theta,\ v_{min})`;
* the layer sends :math:`n` summed over each :math:`k \times k` pooling window (``SumPool2d``).

Every layer of one step runs in that step: no delay between layers. ``DynapcnnNetwork`` with
``discretize=True`` rescales each layer's weights, bias and thresholds by one common factor to fit
8-bit weights and biases and 16-bit thresholds; snnquant exports integers for which that factor is
exactly 1 (:math:`v_{min} = -2^{15}`, weights and biases in :math:`[-128, 127]`), and
:func:`run_sinabs` fails if Sinabs changed any of them. The chip's memory rule is Sinabs'
``DynapcnnLayer.memory_summary`` and its core table ``chips/dynapcnn.py`` ``get_constraints``.

**The network snnquant maps onto it**: a stack of :class:`SpeckIAFLayer`. Sinabs needs the
``dynapcnn`` backend's imports (including SynSense's ``samna`` driver for devices) and pins nir
<= 1.0.4: :func:`run_sinabs` runs the exported network in a Python with Sinabs
(``SNNQUANT_SINABS_PYTHON`` or its ``python`` argument) through
``snnquant/targets/speck/sinabs_script.py``.
"""

from .layer import (SPECK2F, SpeckIAFLayer, SpeckProfile, check_speck, quantize_for_speck,
                    speck_cores)
from .op import SpeckLayerOp
from .vendor import (SpeckSpec, load_speck, run_sinabs, save_speck, sinabs_python, sinabs_runner,
                     to_speck)

__all__ = ["SpeckProfile", "SPECK2F", "SpeckIAFLayer", "check_speck", "quantize_for_speck",
           "SpeckSpec", "to_speck", "save_speck", "load_speck", "run_sinabs", "speck_cores",
           "sinabs_python", "sinabs_runner", "SpeckLayerOp"]
