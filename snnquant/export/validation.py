"""Moved to :mod:`snnquant.export.ir.validation`; this path stays importable and is that module."""
import sys

from .ir import validation as _module

sys.modules[__name__] = _module
