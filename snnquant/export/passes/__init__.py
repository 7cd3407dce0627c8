"""Passes over a quantized model before it is lowered: BatchNorm folding (:mod:`.fold`) and
membrane widening (:mod:`.widen`)."""
