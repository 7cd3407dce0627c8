r"""The membrane quantizer of a neuron, made in one place: :func:`make_membrane_quantizer`.

A quantized neuron's ``v_quant=b`` and :class:`~snnquant.QuantConfig`'s ``v_bits`` /
``membrane_quantizer`` both come here, so that a hand-built neuron and one made by
:func:`~snnquant.quantize_model` get the same quantizer.
"""

from __future__ import annotations

import math
from typing import Optional, Union

from .base import QuantizerBase, check_bits
from .fixed import StateQuant, UniformQuantizer
from .lsq import LSQQuantizer

__all__ = ["MEMBRANE_QUANTIZERS", "make_membrane_quantizer", "uniform_membrane_step"]

#: The kinds of membrane quantizer an int bit width can stand for.
MEMBRANE_QUANTIZERS = ("uniform", "threshold_centered", "lsq")


def uniform_membrane_step(v_threshold: float, bits: int) -> float:
    r"""The step of the uniform ``bits``-bit membrane grid of a neuron with threshold ``v_threshold``.

    The grid must hold :math:`[-R, R)` with :math:`R = 2|V_{th}|` (:math:`R = 2` for
    :math:`V_{th} = 0`); its step is the smallest power of two whose :math:`2^b` levels cover it:

    .. math::

        s = 2^{\lceil \log_2 (R / 2^{b-1}) \rceil}

    For a threshold that is a power of two this is :math:`|V_{th}|\,2^{2-b}` (range exactly
    :math:`[-2V_{th}, 2V_{th})`); for any other threshold the range is wider, up to
    :math:`[-4V_{th}, 4V_{th})`. The step is always a power of two, so the network exports to
    integers exactly whatever the threshold; the threshold itself acts on the grid as
    :math:`\theta_q = s \lceil V_{th} / s \rceil`, rounded up to the grid like the reset values.
    This is the one membrane-step formula of snnquant (``v_quant=b`` and
    ``QuantConfig(membrane_quantizer='uniform')`` both use it).
    """
    bits = check_bits(bits, "bits", 2, 32)
    span = 2.0 * (abs(float(v_threshold)) or 1.0)
    if not math.isfinite(span):
        raise ValueError(f"v_threshold must be finite, got {v_threshold!r}")
    mantissa, exponent = math.frexp(span)  # span = mantissa * 2^exponent, mantissa in [0.5, 1)
    cover = exponent - 1 if mantissa == 0.5 else exponent  # smallest e with 2^e >= span
    return math.ldexp(1.0, cover - (bits - 1))


def make_membrane_quantizer(spec: Union[QuantizerBase, int, None], v_threshold: float,
                            kind: str = "uniform") -> Optional[QuantizerBase]:
    r"""Turn a ``v_quant`` argument into a membrane quantizer.

    A quantizer module is used as is; ``None`` means none. An int ``b`` means, by ``kind``:

    * ``'uniform'``: ``UniformQuantizer(b, step=uniform_membrane_step(v_threshold, b))``,
      :math:`2^b` levels with a power-of-two step covering :math:`[-2|V_{th}|, 2|V_{th}|)`
      (see :func:`uniform_membrane_step`);
    * ``'threshold_centered'``: ``StateQuant(num_bits=b, uniform=False, thr_centered=True,
      threshold=v_threshold)`` (snnTorch/SQUAT exponential levels centred on the threshold);
    * ``'lsq'``: ``LSQQuantizer(b, signed=True)`` (learned step).

    Raises:
        ValueError: ``spec`` is not a quantizer, ``None`` or an int in ``[2, 32]`` (named
            ``v_quant``), or ``kind`` is not one of :data:`MEMBRANE_QUANTIZERS`.
    """
    if spec is None or isinstance(spec, QuantizerBase):
        return spec
    bits = check_bits(spec, "v_quant", 2, 32)
    if kind == "uniform":
        return UniformQuantizer(bits, step=uniform_membrane_step(v_threshold, bits))
    if kind == "threshold_centered":
        return StateQuant(num_bits=bits, uniform=False, thr_centered=True, threshold=v_threshold)
    if kind == "lsq":
        return LSQQuantizer(bits, signed=True)
    raise ValueError(f"kind must be one of {MEMBRANE_QUANTIZERS}, got {kind!r}")
