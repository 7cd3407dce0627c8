"""Moved to :mod:`snnquant.export.backends.files`; this path stays importable and is that module."""
import sys

from .backends import files as _module

sys.modules[__name__] = _module
