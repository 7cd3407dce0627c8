"""Moved to :mod:`snnquant.export.backends.compiled_neuron`; this path stays importable and is that module."""
import sys

from .backends import compiled_neuron as _module

sys.modules[__name__] = _module
