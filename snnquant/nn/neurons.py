r"""Quantized-membrane neurons: subclasses of SpikingJelly's ``IFNode``, ``LIFNode`` and
``ParametricLIFNode``.

Per step, with the neuron's charge :math:`f` and membrane quantizer :math:`Q`:

.. math::

    H[t] &= f(V[t-1], X[t]),\qquad H_q[t] = Q(H[t]),\qquad S[t] = \Theta(H_q[t] - V_{th})\\
    V[t] &= H_q[t](1 - S[t]) + V_{r,q} S[t]\ \text{(hard)}\quad\text{or}\quad
            H_q[t] - \theta_q S[t]\ \text{(soft)}

The gradient of :math:`Q` is straight-through inside its range and 0 outside; the spike uses the
neuron's surrogate gradient. The exact definition (reset values on the grid, step gradient) is in
:mod:`snnquant.functional.neuron`.

``v_quant`` is a quantizer module, a bit width ``b`` (``UniformQuantizer(b,
step=uniform_membrane_step(v_threshold, b))``: a power-of-two step whose range covers
:math:`[-2V_{th}, 2V_{th})`), or ``None`` (then the neuron is exactly the
SpikingJelly neuron it replaces). Quantizers whose :meth:`~snnquant.nn.QuantizerBase.grid` is a
uniform per-tensor grid (``UniformQuantizer``, per-tensor ``LSQQuantizer``, ...) run the whole sequence as one autograd node
(:class:`~snnquant.functional.neuron.QuantNeuronFunction`) or the fused CUDA kernel; any other
quantizer runs a per-step autograd loop with the same dynamics (a soft reset subtracts
:math:`\theta_q` whenever the quantizer has a uniform grid, and re-quantizes
:math:`Q(H_q - S\,V_{th})` for level sets that are not a grid, such as ``StateQuant``). A
``MinMaxQuantizer`` updates its range from every step's charge in training, and its range always
contains :math:`V_{reset}` and :math:`V_{th}` (set through its ``include_values`` when not given).

``backend``: ``'torch'``, ``'cupy'`` (fused CUDA kernel, CUDA tensors and CuPy required),
``'cpp'`` (the same kernels compiled for the CPU at first use, CPU tensors and a C++ compiler
required) or ``'auto'`` (``'cpp'`` for CPU tensors when a C++ compiler is found, ``'cupy'`` for
CUDA tensors when CuPy imports, when the configuration is supported; ``'torch'`` otherwise; see
:mod:`snnquant.kernels.dispatch`; the default). It applies to the quantized membrane path.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import neuron, surrogate

from ..functional.neuron import (NeuronParams, membrane_reset_values, neuron_charge,
                                 neuron_reset, quantized_threshold)
from ..kernels.dispatch import BACKENDS, DEFAULT_BACKEND, check_backend_name, select_backend
from ._neuron_config import NeuronConfigCheckMixin
from .custom import refuse_ignored_overrides
from .quantizers import QuantizerBase
from .quantizers.membrane import make_membrane_quantizer, uniform_membrane_step

__all__ = ["QuantIFNode", "QuantLIFNode", "QuantParametricLIFNode", "make_membrane_quantizer",
           "uniform_membrane_step", "BACKENDS"]

VQuantArg = Union[QuantizerBase, int, None]


def _has_trainable(module: torch.nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())


class _QuantNeuronMixin(NeuronConfigCheckMixin):
    _kind = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # The fused membrane update never calls neuronal_charge/fire/reset: refuse overrides.
        refuse_ignored_overrides(cls, next(k.__name__ for k in cls.__mro__ if k.__module__ == __name__))

    def _init_quant(self, v_quant: VQuantArg, backend: str):
        check_backend_name(backend)
        self.v_quant = make_membrane_quantizer(v_quant, self.v_threshold)
        if getattr(self.v_quant, "include_values", False) is None:
            # an observed membrane range must reach the threshold, or the neuron can never fire
            self.v_quant.include_values = (self.v_reset or 0.0, self.v_threshold)
        self.backend = backend
        self._backend_key = None  # what the backend was last resolved for (see _resolved_backend)
        self._resolved = None

    # ---- parameters of the charge -------------------------------------------------------------
    def _tau(self):
        return getattr(self, "tau", 2.0)

    def _w(self):
        return getattr(self, "w", None)

    # ---- SpikingJelly's own path (v_quant=None) ----------------------------------------------------
    def _precision_kwargs(self):
        p = self._neuron_precision
        return dict(neuron_storage=None if p is None else p[0],
                    neuron_fwd="fp32" if p is None else p[1],
                    neuron_bwd="fp32" if p is None else p[2])

    def _sj_multi_step(self, x_seq, v, store_v_seq):
        raise NotImplementedError

    # ---- the quantized path ----------------------------------------------------------------------
    def _prime_quantizer(self, x_seq, v):
        """Give a data-dependent membrane quantizer its first statistics from the first step's
        unquantized charge (learned-step init of LSQ, first range of MinMax)."""
        q = self.v_quant
        if q.is_initialized:
            return
        with torch.no_grad():
            vr = 0.0 if self.v_reset is None else self.v_reset
            v0 = v if isinstance(v, torch.Tensor) and v.shape == x_seq.shape[1:] \
                else torch.full_like(x_seq[0], float(vr))
            k = torch.sigmoid(self._w().detach()).to(x_seq.dtype) if self._kind == "plif" else None
            h0 = neuron_charge(self._kind, v0, x_seq[0], self._tau(), k, self.decay_input_, vr)
            q.ensure_initialized(h0)

    def _membrane_grid(self, x_seq):
        """``(step, qmin, qmax, grad_scale)`` for the one-node path, or None for the per-step path."""
        q = self.v_quant
        grid = q.sequence_grid()  # None while the grid moves with every step: per-step path
        if grid is None or not grid.per_tensor:
            return None
        return grid.step, grid.qmin, grid.qmax, q.step_grad_scale(x_seq[0])

    @property
    def decay_input_(self):
        return getattr(self, "decay_input", True)

    def __getstate__(self):
        # the backend is resolved again where the copy runs (another machine may lack a compiler)
        state = dict(super().__getstate__())
        state["_backend_key"] = state["_resolved"] = None
        return state

    def _resolved_backend(self, x):
        """The backend for ``x`` (its step function), resolved and checked by
        :func:`snnquant.kernels.dispatch.select_backend` once per requested backend, device,
        dtype and surrogate function (again after ``.to(...)`` or a change of ``backend``)."""
        key = (self.backend, x.device, x.dtype, self.surrogate_function)
        if torch.compiler.is_compiling():
            return select_backend(self.backend, x, self.surrogate_function, "x")
        if getattr(self, "_backend_key", None) != key:
            self._resolved = select_backend(self.backend, x, self.surrogate_function, "x")
            self._backend_key = key
        return self._resolved

    def _quant_multi(self, x_seq, v, store_v_seq):
        self._prime_quantizer(x_seq, v)
        grid = self._membrane_grid(x_seq)
        if grid is None:
            return self._generic_multi(x_seq, v, store_v_seq)
        step, qmin, qmax, grad_scale = grid
        step = step.to(device=x_seq.device)
        if not isinstance(v, torch.Tensor) or v.shape != x_seq.shape[1:]:
            vr_q, _ = membrane_reset_values(step.to(x_seq.dtype), qmin, qmax, self.v_threshold,
                                            self.v_reset)
            v = vr_q
        params = NeuronParams(neuron=self._kind, tau=self._tau(), decay_input=self.decay_input_,
                              v_threshold=self.v_threshold, v_reset=self.v_reset,
                              surrogate_function=self.surrogate_function,
                              detach_reset=self.detach_reset, qmin=qmin, qmax=qmax,
                              step_grad_scale=grad_scale, store_v_seq=store_v_seq)
        return self._resolved_backend(x_seq).step(x_seq, v, step, self._w(), params)

    def _quantize_membrane(self, h):
        q = self.v_quant
        hq = q.quantize(h)
        rng = q.value_range()
        if rng is None or _has_trainable(q):
            return hq
        inside = ((h >= rng[0]) & (h <= rng[1])).to(h.dtype)
        return hq.detach() + (h - h.detach()) * inside

    @torch.no_grad()
    def _on_grid(self, value: float, like: torch.Tensor) -> torch.Tensor:
        """``Q(value)`` shaped like ``like``, without updating any statistics of the quantizer."""
        q = self.v_quant
        was_training = q.training
        q.train(False)
        try:
            return q.quantize(torch.full_like(like, float(value)))
        finally:
            q.train(was_training)

    def _reset_values(self, like):
        """``(v_reset_q, theta_q)``: on the quantizer's uniform grid when it has one (as the one-node
        path), else ``Q(v_reset)`` and ``None`` (soft reset then re-quantizes)."""
        q = self.v_quant
        if q.observing:  # the grid moves with every step: read it with tensor arithmetic only
            step = q.current_step()
            if step is not None:
                step = step.detach().to(device=like.device, dtype=like.dtype)
                vr_q = torch.zeros((), dtype=like.dtype, device=like.device) \
                    if self.v_reset is None else self._on_grid(self.v_reset, like)
                return vr_q, quantized_threshold(step, self.v_threshold)
        grid = q.sequence_grid()
        if grid is not None and grid.per_tensor:
            return membrane_reset_values(grid.step.to(device=like.device, dtype=like.dtype),
                                         grid.qmin, grid.qmax, self.v_threshold, self.v_reset)
        vr_q = torch.zeros((), dtype=like.dtype, device=like.device) if self.v_reset is None \
            else self._on_grid(self.v_reset, like)
        return vr_q, None

    def _generic_multi(self, x_seq, v, store_v_seq):
        dtype = x_seq.dtype
        vr_q, theta_q = self._reset_values(x_seq[0])
        if not isinstance(v, torch.Tensor) or v.shape != x_seq.shape[1:]:
            v = vr_q.expand_as(x_seq[0])
        k = torch.sigmoid(self._w()).to(dtype) if self._kind == "plif" else None
        spikes, v_seq = [], []
        for t in range(x_seq.shape[0]):
            h = neuron_charge(self._kind, v, x_seq[t], self._tau(), k, self.decay_input_, vr_q)
            hq = self._quantize_membrane(h)
            spike = self.surrogate_function(hq - self.v_threshold)
            spike_r = spike.detach() if self.detach_reset else spike
            if self.v_reset is None and theta_q is None:
                # levels that are not a grid: subtract V_th and re-quantize
                was_training = self.v_quant.training
                self.v_quant.train(False)  # re-quantizing must not update statistics
                try:
                    v = self._quantize_membrane(hq - spike_r * self.v_threshold)
                finally:
                    self.v_quant.train(was_training)
            else:
                v = neuron_reset(hq, spike_r, self.v_reset, vr_q, theta_q)
            spikes.append(spike)
            if store_v_seq:
                v_seq.append(v)
            if self.v_quant.observing and t + 1 < x_seq.shape[0]:
                vr_q, theta_q = self._reset_values(x_seq[0])  # the range moved
        return torch.stack(spikes), v, (torch.stack(v_seq) if store_v_seq else None)

    def _check_backend(self, x: torch.Tensor) -> None:
        """Resolve the backend for ``x`` (the kernels check the device and what the backend
        needs); a request for the fused kernels by name also needs a membrane they can run."""
        if not self._resolved_backend(x).fused_requested:
            return
        if self.v_quant is None:
            raise ValueError(f"{type(self).__name__}(backend={self.backend!r}) needs a quantized "
                             "membrane (v_quant): with v_quant=None it is SpikingJelly's own "
                             "neuron; use backend='torch' or 'auto'")
        grid = self.v_quant.grid()
        if grid is None or not grid.per_tensor:
            raise ValueError(f"backend={self.backend!r} runs membrane quantizers with a uniform "
                             f"per-tensor grid; {type(self.v_quant).__name__} has none: use "
                             "backend='auto' (falls back to torch) or 'torch'")

    # ---- SpikingJelly's step contract -------------------------------------------------------------
    def single_step_forward(self, x: torch.Tensor, *args, **kwargs):
        self._check_backend(x)
        return super().single_step_forward(x, *args, **kwargs)

    def materialize_states(self, inputs, states, step_mode):
        if self.v_quant is not None and not isinstance(states[0], torch.Tensor):
            return states  # the quantized path starts from the on-grid reset value
        return super().materialize_states(inputs, states, step_mode)

    def single_step_functional_forward(self, inputs, states, **kwargs):
        if self.v_quant is None:
            return super().single_step_functional_forward(inputs, states, **kwargs)
        spikes, v, _ = self._quant_multi(inputs[0].unsqueeze(0), states[0], False)
        return (spikes[0],), (v, *states[1:])

    def multi_step_functional_forward(self, inputs, states, **kwargs):
        if self.v_quant is None:
            return super().multi_step_functional_forward(inputs, states, **kwargs)
        spikes, v, _ = self._quant_multi(inputs[0], states[0], False)
        return (spikes,), (v,)

    def multi_step_forward(self, x_seq: torch.Tensor, *args, **kwargs):
        if not isinstance(x_seq, torch.Tensor) or x_seq.dim() < 2:
            raise ValueError(f"{type(self).__name__} in step_mode='m' expects x_seq with shape "
                             f"[T, N, ...], got shape {tuple(getattr(x_seq, 'shape', ()))}")
        self._check_backend(x_seq)
        states = self.materialize_states((x_seq,), tuple(self._memories.values()), "m")
        if self.v_quant is None:
            spikes, v, v_seq = self._sj_multi_step(x_seq, states[0], self.store_v_seq)
        else:
            spikes, v, v_seq = self._quant_multi(x_seq, states[0], self.store_v_seq)
        self._memories["v"] = v
        self.v_seq = v_seq
        return spikes

    def extra_repr(self):
        vq = self.v_quant
        v_bits = None if vq is None else vq.num_bits
        return super().extra_repr() + f", v_bits={v_bits}, backend={self.backend}"


class QuantIFNode(_QuantNeuronMixin, neuron.IFNode):
    r"""Integrate-and-fire neuron with a quantized membrane; drop-in for ``neuron.IFNode``.

    .. math::

        H[t] = V[t-1] + X[t],\qquad H_q[t] = Q(H[t])

    then fire and reset as described in :mod:`snnquant.nn.neurons`.

    Args:
        v_threshold: as ``neuron.IFNode`` (and so are ``v_reset``, ``surrogate_function``,
            ``detach_reset``, ``step_mode``, ``store_v_seq``).
        v_quant: membrane quantizer module, bit width, or ``None``.
        backend: ``'torch'``, ``'cupy'``, ``'cpp'`` or ``'auto'``.
    """

    _kind = "if"

    def __init__(self, v_threshold: float = 1.0, v_reset: Optional[float] = 0.0,
                 surrogate_function=surrogate.Sigmoid(), detach_reset: bool = False,
                 step_mode="s", store_v_seq: bool = False, v_quant: VQuantArg = None,
                 backend: str = DEFAULT_BACKEND):
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset,
                         step_mode=step_mode, store_v_seq=store_v_seq)
        self._init_quant(v_quant, backend)

    def _sj_multi_step(self, x_seq, v, store_v_seq):
        return sjf.if_multi_step(x_seq, v, self.v_threshold, self.v_reset,
                                 self.surrogate_function, self.detach_reset, store_v_seq,
                                 **self._precision_kwargs())


class QuantLIFNode(_QuantNeuronMixin, neuron.LIFNode):
    r"""Leaky integrate-and-fire neuron with a quantized membrane; drop-in for ``neuron.LIFNode``.

    .. math::

        H[t] = V[t-1] + \frac{1}{\tau}(X[t] - (V[t-1] - V_r))\ \text{(decay\_input)},\quad
        H[t] = V[t-1] - \frac{1}{\tau}(V[t-1] - V_r) + X[t]\ \text{(otherwise)}

    then :math:`H_q = Q(H)`, fire and reset as described in :mod:`snnquant.nn.neurons`.

    Args:
        tau: as ``neuron.LIFNode`` (and so are ``decay_input``, ``v_threshold``, ``v_reset``,
            ``surrogate_function``, ``detach_reset``, ``step_mode``, ``store_v_seq``).
        v_quant: membrane quantizer module, bit width, or ``None``.
        backend: ``'torch'``, ``'cupy'``, ``'cpp'`` or ``'auto'``.
    """

    _kind = "lif"

    def __init__(self, tau: float = 2.0, decay_input: bool = True, v_threshold: float = 1.0,
                 v_reset: Optional[float] = 0.0, surrogate_function=surrogate.Sigmoid(),
                 detach_reset: bool = False, step_mode="s", store_v_seq: bool = False,
                 v_quant: VQuantArg = None, backend: str = DEFAULT_BACKEND):
        super().__init__(tau, decay_input, v_threshold, v_reset, surrogate_function,
                         detach_reset, step_mode=step_mode, store_v_seq=store_v_seq)
        self._init_quant(v_quant, backend)

    def _sj_multi_step(self, x_seq, v, store_v_seq):
        return sjf.lif_multi_step(x_seq, v, self.tau, self.decay_input, self.v_threshold,
                                  self.v_reset, self.surrogate_function, self.detach_reset,
                                  store_v_seq, **self._precision_kwargs())


class QuantParametricLIFNode(_QuantNeuronMixin, neuron.ParametricLIFNode):
    r"""Parametric LIF neuron (learnable :math:`\tau`) with a quantized membrane; drop-in for
    ``neuron.ParametricLIFNode``.

    .. math::

        H[t] = V[t-1] + k (X[t] - (V[t-1] - V_r)),\qquad k = \mathrm{sigmoid}(w) = 1/\tau

    (or :math:`H = V - k(V - V_r) + X` without ``decay_input``), then :math:`H_q = Q(H)`, fire and
    reset as described in :mod:`snnquant.nn.neurons`. :math:`w` receives its true gradient.

    Args:
        init_tau: as ``neuron.ParametricLIFNode`` (and so are ``decay_input``, ``v_threshold``,
            ``v_reset``, ``surrogate_function``, ``detach_reset``, ``step_mode``, ``store_v_seq``).
        v_quant: membrane quantizer module, bit width, or ``None``.
        backend: ``'torch'``, ``'cupy'``, ``'cpp'`` or ``'auto'``.
    """

    _kind = "plif"

    def __init__(self, init_tau: float = 2.0, decay_input: bool = True, v_threshold: float = 1.0,
                 v_reset: Optional[float] = 0.0, surrogate_function=surrogate.Sigmoid(),
                 detach_reset: bool = False, step_mode="s", store_v_seq: bool = False,
                 v_quant: VQuantArg = None, backend: str = DEFAULT_BACKEND):
        super().__init__(init_tau, decay_input, v_threshold, v_reset, surrogate_function,
                         detach_reset, step_mode=step_mode, store_v_seq=store_v_seq)
        self._init_quant(v_quant, backend)

    def _sj_multi_step(self, x_seq, v, store_v_seq):
        return sjf.plif_multi_step(x_seq, v, self.w, self.decay_input, self.v_threshold,
                                   self.v_reset, self.surrogate_function, self.detach_reset,
                                   store_v_seq, **self._precision_kwargs())
