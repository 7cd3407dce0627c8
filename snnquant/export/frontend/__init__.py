"""The export's front ends: a quantized torch model (:mod:`.torch_model`, one module per layer
family) and a NIR graph written by :func:`~snnquant.export.to_nir` (:mod:`.nir_import`), each
lowered to an :class:`~snnquant.export.IntegerNetwork`."""
