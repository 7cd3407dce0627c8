r"""Capture of a network's structure from its forward pass, and the BatchNorm plan made from it.

Below :mod:`snnquant.convert` and :mod:`snnquant.export`, which both read it:

* :mod:`snnquant.capture.graph`: :func:`capture`, the graph of a forward at the level of layers,
  neurons and containers (from a run on an example input, or by torch.fx symbolic tracing), and
  the errors that name the submodule and line that stopped it;
* :mod:`snnquant.capture.plan`: :func:`plan_folding`, which ``conv -> bn`` pairs fold and why each
  other BatchNorm does not (what :func:`~snnquant.quantize_model` trains folded and
  :func:`~snnquant.export.fold_batchnorm` folds).
"""

from .graph import (Capture, CaptureError, ExportError, SpikingTracer, capture, connect_functions,
                    is_sequence, node_origin, where_it_stopped)
from .plan import (FoldPlan, charged_neuron, is_batchnorm, is_neuron, is_synapse, passes_through,
                   plan_folding)

__all__ = ["capture", "Capture", "CaptureError", "ExportError", "SpikingTracer", "is_sequence",
           "connect_functions", "node_origin", "where_it_stopped", "FoldPlan", "plan_folding",
           "charged_neuron", "is_synapse", "is_batchnorm", "is_neuron", "passes_through"]
