r"""Intel Loihi 2 through Lava: the fixed-point LIF and Dense arithmetic of Lava's ``fixed_pt``
process models, training in it, and export to Lava processes checked on Lava's CPU simulation.

**The arithmetic** (Lava 0.10, ``lava/proc/lif/models.py`` ``AbstractPyLifModelFixed`` and
``PyLifModelBitAcc``, ``lava/proc/dense/models.py`` ``AbstractPyDenseModelBitAcc``,
``lava/utils/weightutils.py``; tested against Lava's own run in ``tests/test_targets_loihi.py``).
Per step, for a ``Dense`` layer with Lava weights :math:`w` (``num_weight_bits=8``, mixed signs:
even integers in :math:`[-256, 254]`, i.e. :math:`w = 2W` with an 8-bit :math:`W`, except that
a layer whose weights are all :math:`\le 0` runs in Lava's inhibitory sign mode, where
:math:`-256` becomes :math:`-255`: :func:`~snnquant.functional.chip_neurons.lava_weight`), weight
exponent :math:`e`, and its ``LIF`` neurons with current :math:`u`, voltage :math:`v` (24-bit),
decays :math:`d_u, d_v` (12-bit), threshold mantissa :math:`\vartheta` (17-bit), bias
:math:`b` (``bias_mant << bias_exp``):

* ``Dense`` sends the activation it computed on the previous step, :math:`a = (w\,s) \ll e`
  (:math:`\gg -e`, an arithmetic shift, for :math:`e < 0`), from the spikes :math:`s` it received
  then: every layer delivers one step later;
* :math:`u \leftarrow \mathrm{wrap}_{24}(\mathrm{sign}(u)\lfloor |u (4096 - d_u - 1)| / 4096
  \rfloor + (a \ll 6))` (``ds_offset`` = 1; one wrap modulo :math:`2^{24}`);
* :math:`v \leftarrow \mathrm{clip}(\mathrm{sign}(v)\lfloor |v (4096 - d_v)| / 4096 \rfloor + u
  + b,\ -2^{23} + 1,\ 2^{23} - 1)`;
* spike where :math:`v > \vartheta \ll 6`, then :math:`v \leftarrow 0` (:math:`u` is kept).

Lava's docstring states that ``PyLifModelBitAcc`` "mimics Loihi behaviour bit-by-bit"; it runs on
the CPU with ``Loihi2SimCfg(select_tag="fixed_pt")``. Refractory periods and axonal delays (which
that model lacks) are not used.

**The network snnquant maps onto it**: a stack of :class:`LoihiLIFLayer` (a ``Dense`` and its
``LIF``), spikes in, spikes out, each layer one step of delay. Lava needs Python <= 3.10
(lava-nc 0.10); :func:`run_lava` runs the exported network in such a Python
(``SNNQUANT_LAVA_PYTHON`` or its ``python`` argument) through
``snnquant/targets/loihi/lava_runner.py``.
"""

from .layer import LOIHI2, LoihiLIFLayer, LoihiProfile, check_loihi, quantize_for_loihi
from .op import LoihiLayerOp
from .vendor import LoihiSpec, lava_python, load_loihi, run_lava, save_loihi, to_loihi

__all__ = ["LoihiProfile", "LOIHI2", "LoihiLIFLayer", "check_loihi", "quantize_for_loihi",
           "LoihiSpec", "to_loihi", "save_loihi", "load_loihi", "run_lava", "lava_python",
           "LoihiLayerOp"]
