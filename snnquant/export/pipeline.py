"""The export's entry points that run several stages of its pipeline: :func:`to_nir` (a model
through the torch front end, the NIR writer and, given data, the saturation check)."""

from __future__ import annotations

import os
from typing import Optional, Sequence, Union

import numpy as np
import torch
import torch.nn as nn

from .._io import atomic_write
from .backends.nir_graph import MAX_POOL_FORMS, UNITS, nir_graph
from .backends.nir_schema import import_nir
from .frontend.torch_model import to_integer
from .ir.network import IntegerNetwork, check_input_shape
from .verification.saturation import nir_saturation_warning

__all__ = ["to_nir"]


def to_nir(source: Union[IntegerNetwork, nn.Module], input_shape: Sequence[int], *,
           units: str = "integer", dt: float = 1e-4, max_pool: str = "threshold",
           path: Optional[Union[str, os.PathLike]] = None, data: Optional[torch.Tensor] = None,
           consumers: Optional[Sequence[str]] = None):
    r"""Build a NIR graph of a quantized network (and optionally write it to ``path``).

    .. math::

        W_{nir} = c\, w\, s_w,\quad b_{nir} = c\, b\, 2^{-F},\quad
        V_{th,nir} = (\theta - \tfrac{1}{2})\, u,\quad V_{r,nir} = v_r\, u,\quad u = c\, s_v,

        r_{IF} = \frac{1}{dt},\qquad \tau_{LIF} = \tau\, dt,\qquad
        r_{LIF} = \begin{cases} 1 & \text{decay\_input}\\ \tau & \text{otherwise}\end{cases},
        \qquad c = \begin{cases} 2^{F_0} & \text{units='integer'}\\ 1 &
        \text{units='real'}\end{cases}

    Euler steps of NIR's equations with this ``dt`` then give snnquant's float dynamics: IF
    :math:`v \leftarrow v + dt\, r\, I = v + I`; LIF :math:`v \leftarrow v + \frac{dt}{\tau_{LIF}}
    ((v_{leak} - v) + r I) = v + \frac{1}{\tau}((v_r u - v) + r I)`; and NIR's strict
    :math:`v > V_{th,nir}` fires exactly when snnquant's :math:`v \ge \theta` does. What NIR's
    float dynamics cannot do (round the membrane to its grid after each charge, saturate it to
    :math:`[v_{min}, v_{max}]`) is written in each node's metadata, with the integers, bit widths
    and grid steps (schema :data:`SCHEMA_VERSION`). An IF layer with ``grid_shift`` 0 (currents
    on the membrane grid, ``nir_dynamics_exact`` in its metadata) whose membrane stays inside
    its range is reproduced exactly by NIR's equations; LIF membrane rounding is not expressible.

    A consumer must integrate with the same ``dt`` (it is in ``graph.metadata['dt']``), e.g.
    ``import_from_nir(graph, dt=dt)`` in SpikingJelly or ``norse.torch.from_nir(graph, dt=dt)``.

    Args:
        source: an :class:`~snnquant.export.IntegerNetwork` or a quantized model (exported with
            :func:`~snnquant.export.to_integer` first).
        input_shape: shape of one input sample, without time and batch (``(C, H, W)`` or
            ``(features,)``).
        units: ``'integer'`` (every weight, bias, threshold and reset value an integer or, for
            thresholds, a half-integer times the membrane unit) or ``'real'``.
        dt: time step in seconds of one snnquant step, a positive number; written into the graph
            metadata and every neuron node's.
        max_pool: ``'threshold'`` (``SumPool2d`` + ``Threshold(0)``, NIR's step function) or
            ``'conv_if'`` (channel-identity ``Conv2d`` of ones + stateless
            ``IF(v_threshold=1/2, v_reset=0)``, for consumers without ``SumPool2d`` or
            ``Threshold``); both give the same spikes.
        path: if given, write the graph there (``nir.write``, atomically).
        data: optional input ``[T, N, ...]`` (the user's data) on which to check saturation: a
            :class:`~snnquant.export.SaturationWarning` names every layer whose membrane reaches
            ``v_min`` or ``v_max`` on it (:func:`~snnquant.export.saturation_report`; for an
            :class:`~snnquant.export.IntegerNetwork`, where NIR's membrane leaves that range),
            since NIR has no saturation and consumers cannot reproduce those steps.
        consumers: the consumers whose membrane registers to check against every layer's grid
            (names of :data:`~snnquant.export.backends.nir_consumers.CONSUMER_REGISTERS`; default all,
            ``()`` none): a :class:`~snnquant.export.ConsumerRegisterWarning` names each layer
            whose grid :math:`[v_{min}, v_{max}]` a consumer's register does not hold (Lava's
            24-bit membrane: :math:`\pm 131{,}071` membrane integers).

    Returns:
        The ``nir.NIRGraph`` with nodes named after the source layers (dots replaced by ``_``),
        ``input`` and ``output``.

    Raises:
        ImportError: ``nir`` is missing or older than 1.0.6.
        ExportError: a layer has no NIR equivalent (soft reset, max pooling of non-binary values,
            1-d pooling other than ``VotingLayer``, dilated pooling, adaptive pooling whose
            windows overlap or repeat the input; the operations of spiking transformers:
            layout maps, sums over dimensions, matrix products, see
            :func:`~snnquant.export.backends.nir_graph.refuse_beyond_nir`), named with the reason.
    """
    nir = import_nir("to_nir")
    if units not in UNITS:
        raise ValueError(f"units must be one of {UNITS}, got {units!r}")
    if isinstance(dt, bool) or not isinstance(dt, (int, float)) or not np.isfinite(dt) or dt <= 0:
        raise ValueError(f"dt must be a positive finite number, got {dt!r}")
    dt = float(dt)
    if max_pool not in MAX_POOL_FORMS:
        raise ValueError(f"max_pool must be one of {MAX_POOL_FORMS}, got {max_pool!r}")
    input_shape = check_input_shape(input_shape)
    if isinstance(source, nn.Module):
        desc = to_integer(source, input_shape=input_shape)
    elif isinstance(source, IntegerNetwork):
        desc = source
    else:
        raise TypeError(f"source must be an IntegerNetwork or an nn.Module, "
                        f"got {type(source).__name__}")
    graph = nir_graph(desc, input_shape, units=units, dt=dt, max_pool=max_pool,
                      consumers=consumers)
    if data is not None:
        nir_saturation_warning(source, graph, data)
    if path is not None:
        atomic_write(path, lambda tmp: nir.write(tmp, graph))
    return graph
