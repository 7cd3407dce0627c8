"""Moved to :mod:`snnquant.export.ir.description`; this path stays importable and is that module."""
import sys

from .ir import description as _module

sys.modules[__name__] = _module
