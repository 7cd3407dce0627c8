"""Moved to :mod:`snnquant.export.backends.nir_import`; this path stays importable and is that module."""
import sys

from .backends import nir_import as _module

sys.modules[__name__] = _module
