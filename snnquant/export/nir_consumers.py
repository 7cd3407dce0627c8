"""Moved to :mod:`snnquant.export.backends.nir_consumers`; this path stays importable and is that module."""
import sys

from .backends import nir_consumers as _module

sys.modules[__name__] = _module
