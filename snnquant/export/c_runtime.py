"""Moved to :mod:`snnquant.export.backends.c_runtime`; this path stays importable and is that module."""
import sys

from .backends import c_runtime as _module

sys.modules[__name__] = _module
