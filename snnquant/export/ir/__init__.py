"""The integer network of a network (the IR the export's backends read).

:mod:`~snnquant.export.ir.network` (the operations and :class:`IntegerNetwork`),
:mod:`~snnquant.targets` (the operations of chip networks),
:mod:`~snnquant.export.ir.program` (each operation's torch form, C text and value interval),
:mod:`~snnquant.export.ir.validation` (:func:`check_network`) and
:mod:`~snnquant.export.ir.integer_ops` (rounding, integer widths, bit packing).
"""
