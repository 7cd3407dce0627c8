"""Moved to :mod:`snnquant.export.ir.integer_ops`; this path stays importable and is that module."""
import sys

from .ir import integer_ops as _module

sys.modules[__name__] = _module
