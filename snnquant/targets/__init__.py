"""Chip profiles: train in a neuromorphic chip's own arithmetic, check its limits, export to its
vendor's format, and run it on the vendor's simulator.

* :mod:`snnquant.targets.xylo`: SynSense Xylo Audio 2 (SYNS61201), checked on SynSense's
  simulator (``xylosim``, through Rockpool's ``XyloSim``).
* :mod:`snnquant.targets.loihi`: Intel Loihi 2 as Lava's fixed-point models compute it, checked
  on Lava's CPU simulation (``Loihi2SimCfg(select_tag="fixed_pt")``).
* :mod:`snnquant.targets.speck`: SynSense Speck (DYNAP-CNN cores) as Sinabs'
  ``DynapcnnNetwork`` maps and simulates it, checked on that simulation.

A chip is one package: ``layer.py`` (its profile, its layer training in the chip's integers, the
check of a network and the conversion of a float one), ``op.py`` (its operation in an
:class:`~snnquant.export.IntegerNetwork`, with the widths and ranges of its registers, which the
profile's defaults are) and ``vendor.py`` (the vendor's format, its file and the vendor's
simulator); its neuron step is in :mod:`snnquant.functional.chip_neurons` and its fused kernel in
:mod:`snnquant.kernels.chip`. :data:`CHIP_OP_TYPES` lists the chips' operations.
"""

from ._layer import Violation
from .loihi import (LOIHI2, LoihiLayerOp, LoihiLIFLayer, LoihiProfile, LoihiSpec, check_loihi,
                    load_loihi, quantize_for_loihi, run_lava, save_loihi, to_loihi)
from .speck import (SPECK2F, SpeckIAFLayer, SpeckLayerOp, SpeckProfile, SpeckSpec, check_speck,
                    load_speck, quantize_for_speck, run_sinabs, save_speck, speck_cores, to_speck)
from .xylo import (XYLO_AUDIO2, XyloLayerOp, XyloLIFLayer, XyloProfile, XyloSpec, check_xylo,
                   load_xylo, quantize_for_xylo, run_xylosim, save_xylo, to_xylo)

#: The chips' operations of an :class:`~snnquant.export.IntegerNetwork`, one per chip: a new
#: chip's operation is added here.
CHIP_OP_TYPES = (XyloLayerOp, LoihiLayerOp, SpeckLayerOp)

__all__ = ["Violation", "CHIP_OP_TYPES", "XyloLayerOp", "LoihiLayerOp", "SpeckLayerOp",
           "LOIHI2", "LoihiLIFLayer", "LoihiProfile", "LoihiSpec", "check_loihi", "load_loihi",
           "quantize_for_loihi", "run_lava", "save_loihi", "to_loihi",
           "SPECK2F", "SpeckIAFLayer", "SpeckProfile", "SpeckSpec", "check_speck", "load_speck",
           "quantize_for_speck", "run_sinabs", "save_speck", "speck_cores", "to_speck",
           "XYLO_AUDIO2", "XyloLIFLayer", "XyloProfile", "XyloSpec", "check_xylo", "load_xylo",
           "quantize_for_xylo", "run_xylosim", "save_xylo", "to_xylo"]
