"""What reads the integer network: one module per target.

:mod:`~snnquant.export.backends.simulator` (:class:`IntegerSNN`, with
:mod:`~snnquant.export.backends.compiled_neuron`), :mod:`~snnquant.export.backends.c_runtime`
(:func:`to_c`), :mod:`~snnquant.export.backends.files` (:func:`save_integer` /
:func:`load_integer`) and NIR (:mod:`~snnquant.export.backends.nir_graph`,
:mod:`~snnquant.export.frontend.nir_import`, :mod:`~snnquant.export.backends.nir_schema`,
:mod:`~snnquant.export.backends.nir_consumers`).
"""
