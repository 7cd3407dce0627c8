"""Moved to :mod:`snnquant.export.ir.program`; this path stays importable and is that module."""
import sys

from .ir import program as _module

sys.modules[__name__] = _module
