"""Chip profiles: train in a neuromorphic chip's own arithmetic, check its limits, export to its
vendor's format.

* :mod:`snnquant.targets.xylo`: SynSense Xylo Audio 2 (SYNS61201), checked on SynSense's
  simulator (``xylosim``, through Rockpool's ``XyloSim``).
"""

from .xylo import (XYLO_AUDIO2, Violation, XyloLIFLayer, XyloProfile, XyloSpec, check_xylo,
                   load_xylo, quantize_for_xylo, run_xylosim, save_xylo, to_xylo)

__all__ = ["XYLO_AUDIO2", "Violation", "XyloLIFLayer", "XyloProfile", "XyloSpec", "check_xylo",
           "load_xylo", "quantize_for_xylo", "run_xylosim", "save_xylo", "to_xylo"]
