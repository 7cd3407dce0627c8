"""Moved to :mod:`snnquant.export.backends.simulator`; this path stays importable and is that module."""
import sys

from .backends import simulator as _module

sys.modules[__name__] = _module
