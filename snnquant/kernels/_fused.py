"""Shared core of the fused neuron kernels: configuration, argument checks, autograd Function,
the cache of compiled kernels.

The GPU launcher (:mod:`snnquant.kernels.cupy_backend`), the cpp backend and its test build
(:mod:`snnquant.kernels.cpp_backend`, :mod:`snnquant.kernels.host`) all run :func:`run_fused`;
they differ only in the object that launches the two kernels of ``neuron.cu``. So the host tests
exercise this module as it runs on the GPU: argument preparation, the autograd Function, the
reductions of the partial gradients.
"""

from __future__ import annotations

import math
import numbers
import threading
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Generic, Hashable, Optional, Protocol, TypeVar

import torch
from torch.autograd.function import once_differentiable

from ..functional import compute_dtype
from ..functional.neuron import NEURON_KINDS, NeuronParams, check_real

#: The kernel source's ``SNQ_NEURON_*`` code of each neuron kind: its place in
#: :data:`~snnquant.functional.neuron.NEURON_KINDS`.
NEURON_CODES = {kind: code for code, kind in enumerate(NEURON_KINDS)}
SURROGATE_CODES = {"Sigmoid": 0, "ATan": 1}
SUPPORTED_SURROGATES = ("spikingjelly.activation_based.surrogate.Sigmoid",
                        "spikingjelly.activation_based.surrogate.ATan")
DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
_CUDA_TYPE_NAMES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "snq_half",
    torch.bfloat16: "snq_bfloat16",
}
SOURCE_FILE = "neuron.cu"


def kernel_source() -> str:
    """Return the CUDA C source of the fused neuron kernels (``neuron.cu``), shipped in the package.

    Returns:
        The source text, compiled by NVRTC on the GPU and by g++ (behind ``host_shim.h``) on the CPU.
    """
    return resources.files(__package__).joinpath(SOURCE_FILE).read_text(encoding="utf-8")


def surrogate_kind(surrogate_function: Any) -> Optional[tuple[int, float]]:
    """``(surrogate code, alpha)`` of a surrogate the kernels implement (a spiking
    ``surrogate.Sigmoid`` or ``surrogate.ATan`` with a finite float ``alpha``), else ``None``."""
    from spikingjelly.activation_based import surrogate

    kinds = {surrogate.Sigmoid: SURROGATE_CODES["Sigmoid"], surrogate.ATan: SURROGATE_CODES["ATan"]}
    code = kinds.get(type(surrogate_function))
    if code is None or not getattr(surrogate_function, "spiking", False):
        return None
    alpha = getattr(surrogate_function, "alpha", None)
    if isinstance(alpha, torch.Tensor) or not isinstance(alpha, numbers.Real):
        return None
    if isinstance(alpha, bool) or not math.isfinite(float(alpha)):
        return None
    return code, float(alpha)


def supports(surrogate_function: Any, dtype: torch.dtype = torch.float32) -> bool:
    """Whether the fused kernels implement this surrogate function and storage dtype.

    The kernels implement SpikingJelly's ``surrogate.Sigmoid`` and ``surrogate.ATan`` (exactly
    those classes, in spiking mode, with a finite real ``alpha``) and the dtypes float16,
    bfloat16, float32 and float64. ``backend='auto'`` uses this to fall back to the torch backend.

    .. math::
        \\mathrm{Sigmoid}: g'(x) = \\alpha\\,\\sigma(\\alpha x)(1 - \\sigma(\\alpha x)), \\qquad
        \\mathrm{ATan}: g'(x) = \\frac{\\alpha / 2}{1 + (\\frac{\\pi}{2}\\alpha x)^2}

    Args:
        surrogate_function: a SpikingJelly surrogate module.
        dtype: storage dtype of the input sequence.

    Returns:
        ``True`` when :func:`~snnquant.kernels.fused_quant_neuron_multi_step` accepts both.
    """
    return dtype in DTYPE_CODES and surrogate_kind(surrogate_function) is not None


@dataclass(frozen=True)
class KernelConfig:
    """Compile-time configuration of one pair of kernels (one template instantiation each).

    Args:
        dtype: storage dtype.
        neuron: 0 if, 1 lif, 2 plif (``NEURON_CODES``).
        decay_input: LIF/PLIF input decay (always ``False`` for IF, where it has no meaning).
        hard_reset: ``v_reset`` is not ``None``.
        detach_reset: no gradient through the reset.
        surrogate: 0 Sigmoid, 1 ATan (``SURROGATE_CODES``).
        store_v_seq: the forward also writes the membrane after every step.
    """

    dtype: torch.dtype
    neuron: int
    decay_input: bool
    hard_reset: bool
    detach_reset: bool
    surrogate: int
    store_v_seq: bool

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the kernels compute in (float64 for float64, else float32)."""
        return compute_dtype(self.dtype)

    @property
    def dtype_code(self) -> int:
        """Integer code of the storage dtype (``DTYPE_CODES``)."""
        return DTYPE_CODES[self.dtype]

    @property
    def forward_name(self) -> str:
        """C++ name expression of the forward kernel instantiation."""
        return (f"snq_forward<{_CUDA_TYPE_NAMES[self.dtype]}, {self.neuron}, "
                f"{_cpp_bool(self.decay_input)}, {_cpp_bool(self.hard_reset)}, "
                f"{_cpp_bool(self.store_v_seq)}>")

    @property
    def backward_name(self) -> str:
        """C++ name expression of the backward kernel instantiation."""
        return (f"snq_backward<{_CUDA_TYPE_NAMES[self.dtype]}, {self.neuron}, "
                f"{_cpp_bool(self.decay_input)}, {_cpp_bool(self.hard_reset)}, "
                f"{_cpp_bool(self.detach_reset)}, {self.surrogate}>")


def _cpp_bool(value: bool) -> str:
    return "true" if value else "false"


def all_configs() -> list[KernelConfig]:
    """Every configuration the kernels can be specialised for (the compile-check matrix).

    Returns:
        The list of :class:`KernelConfig`, IF only with ``decay_input=False``.
    """
    configs = []
    for dtype in DTYPE_CODES:
        for neuron in NEURON_CODES.values():
            for decay_input in ((False,) if neuron == NEURON_CODES["if"] else (False, True)):
                for hard_reset in (False, True):
                    for detach_reset in (False, True):
                        for surrogate in SURROGATE_CODES.values():
                            for store_v_seq in (False, True):
                                configs.append(KernelConfig(dtype, neuron, decay_input, hard_reset,
                                                            detach_reset, surrogate, store_v_seq))
    return configs


@dataclass(frozen=True)
class KernelScalars:
    """Run-time scalars passed by value to the kernels (Python floats).

    Args:
        tau: LIF time constant (1.0 where unused).
        v_threshold: firing threshold.
        v_reset: hard reset value (0.0 for soft reset, where it is unused).
        qmin: lowest grid index.
        qmax: highest grid index.
        alpha: the surrogate's alpha.
        step_grad_scale: factor on the gradient of the step.
    """

    tau: float
    v_threshold: float
    v_reset: float
    qmin: float
    qmax: float
    alpha: float
    step_grad_scale: float


Compiled = TypeVar("Compiled")


class KernelCache(Generic[Compiled]):
    """What a process has compiled or loaded, one entry per key (a :class:`KernelConfig`).

    Thread-safe; an entry is built once, on first use, by the function :meth:`get` is given. The
    cpp backend keeps its loaded libraries here and the cupy backend its compiled modules.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict = {}

    def get(self, key: Hashable, build: Callable[[], Compiled]) -> Compiled:
        """The entry of ``key``, built by ``build()`` when there is none yet.

        Args:
            key: what identifies the entry.
            build: makes the entry (called at most once per key, under the cache's lock).
        """
        entry = self._entries.get(key)
        if entry is None:
            with self._lock:
                entry = self._entries.get(key)
                if entry is None:
                    entry = build()
                    self._entries[key] = entry
        return entry

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every entry (the next :meth:`get` builds again)."""
        with self._lock:
            self._entries.clear()


class Launcher(Protocol):
    """What :func:`run_fused` needs from a backend: the two kernel launches.

    Every tensor argument is contiguous (``[T, N]`` sequences, ``[N]`` states, one-element step and
    ``k``) or ``None`` where the kernel takes a null pointer.
    """

    def forward(self, config: KernelConfig, T: int, N: int, x_seq, v_init, step, k, spike_seq,
                v_last, v_seq, h_seq, scalars: KernelScalars) -> None:
        """Launch the forward kernel."""

    def backward(self, config: KernelConfig, T: int, N: int, h_seq, x_seq, v_init, step, k,
                 grad_spike_seq, grad_v_seq, grad_v_last, grad_x_seq, grad_v_init,
                 grad_step_partial, grad_k_partial, scalars: KernelScalars) -> None:
        """Launch the backward kernel."""


class FusedQuantNeuronFunction(torch.autograd.Function):
    """Autograd Function around the fused forward and backward kernels.

    Forward, per neuron and step (one kernel launch for all ``T`` steps):

    .. math::
        H_t = f(V_{t-1}, X_t),\\quad \\hat H_t = \\mathrm{clamp}(\\lfloor H_t / s \\rceil,
        q_{min}, q_{max})\\,s,\\quad S_t = \\Theta(\\hat H_t - V_{th}),\\quad
        V_t = \\mathrm{reset}(\\hat H_t, S_t)

    Backward (one launch, reverse time): the hand-written gradient of
    ``quant_neuron_multi_step``, with :math:`\\partial \\hat H/\\partial H = \\mathbb{1}[q_{min}
    \\le H/s \\le q_{max}]` and the surrogate derivative for :math:`\\partial S/\\partial \\hat H`.

    Inputs after the four non-tensor ones (launcher, :class:`KernelConfig`,
    :class:`KernelScalars`, whether a backward may follow): ``x_seq [T, N]``, ``v_init [N]``
    (storage dtype), ``step [1]`` and ``k [1]`` (compute dtype; ``k = sigmoid(w)`` for PLIF, else
    ``None``).
    """

    @staticmethod
    def forward(ctx, launcher, config, scalars, needs_grad, x_seq, v_init, step, k):
        # needs_grad comes from the caller: ctx.needs_input_grad is True under torch.no_grad too,
        # and saving H would then cost a write of T * N values for nothing
        T, N = x_seq.shape
        spike_seq = torch.empty_like(x_seq)
        v_last = torch.empty_like(v_init)
        v_seq = torch.empty_like(x_seq) if config.store_v_seq else None
        h_seq = (torch.empty((T, N), dtype=config.compute_dtype, device=x_seq.device)
                 if needs_grad else None)
        launcher.forward(config, T, N, x_seq, v_init, step, k, spike_seq, v_last, v_seq, h_seq,
                         scalars)
        ctx.set_materialize_grads(False)
        if needs_grad:
            plif = config.neuron == NEURON_CODES["plif"]
            ctx.save_for_backward(h_seq, x_seq if plif and config.decay_input else None,
                                  v_init if plif else None, step, k)
        ctx.launcher = launcher
        ctx.config = config
        ctx.scalars = scalars
        if v_seq is None:
            return spike_seq, v_last
        return spike_seq, v_last, v_seq

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_spike_seq, grad_v_last, grad_v_seq=None):
        h_seq, x_seq, v_init, step, k = ctx.saved_tensors
        config = ctx.config
        T, N = h_seq.shape
        needs = ctx.needs_input_grad[4:]  # x_seq, v_init, step, k
        grad_x_seq = torch.empty((T, N), dtype=config.dtype, device=h_seq.device)
        grad_v_init = torch.empty((N,), dtype=config.dtype, device=h_seq.device)
        grad_step_partial = (torch.empty((N,), dtype=config.compute_dtype, device=h_seq.device)
                             if needs[2] else None)
        grad_k_partial = (torch.empty((N,), dtype=config.compute_dtype, device=h_seq.device)
                          if needs[3] else None)
        ctx.launcher.backward(config, T, N, h_seq, x_seq, v_init, step, k,
                              _contiguous(grad_spike_seq), _contiguous(grad_v_seq),
                              _contiguous(grad_v_last), grad_x_seq, grad_v_init,
                              grad_step_partial, grad_k_partial, ctx.scalars)
        grad_step = None
        if grad_step_partial is not None:
            grad_step = (grad_step_partial.sum() * ctx.scalars.step_grad_scale).reshape(step.shape)
        grad_k = grad_k_partial.sum().reshape(k.shape) if grad_k_partial is not None else None
        return (None, None, None, None, grad_x_seq if needs[0] else None,
                grad_v_init if needs[1] else None, grad_step, grad_k)


def _contiguous(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if tensor is None else tensor.contiguous()


def _check_scalar_tensor(name: str, value: Any) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a one-element floating-point tensor, got "
                        f"{type(value).__name__}")
    if value.numel() != 1 or not value.is_floating_point():
        raise ValueError(f"{name} must be a one-element floating-point tensor, got shape "
                         f"{tuple(value.shape)} and dtype {value.dtype}")
    return value


def _check_same_device(name: str, tensor: torch.Tensor, x_seq: torch.Tensor) -> None:
    if tensor.device != x_seq.device:
        raise ValueError(f"{name} is on {tensor.device} but x_seq is on {x_seq.device}; move all "
                         f"tensors to {x_seq.device}")


def pointer(tensor: Optional[torch.Tensor]) -> Optional[int]:
    """The data pointer of ``tensor`` for a kernel argument (``None``: a null pointer)."""
    return None if tensor is None else tensor.data_ptr()


def tensor_arguments(x_seq, v_init, step, w, neuron) -> list:
    """``[(name, tensor)]``: the tensor arguments of a kernel's keyword function (``w`` for
    ``'plif'`` only), whose devices its public entry point checks before anything else."""
    return [(name, tensor) for name, tensor in (("x_seq", x_seq), ("v_init", v_init),
                                                ("step", step),
                                                ("w", w if neuron == "plif" else None))
            if isinstance(tensor, torch.Tensor)]


def check_devices(check: Callable[[str, torch.Tensor], None], x_seq, v_init, step, w,
                  neuron) -> None:
    """Run ``check(name, tensor)`` on every tensor argument of a kernel's keyword function (``w``
    for ``'plif'`` only): the device check of the public entry points, before anything else."""
    for name, tensor in tensor_arguments(x_seq, v_init, step, w, neuron):
        check(name, tensor)


def run_fused(launcher: Launcher, x_seq: torch.Tensor, v_init, step, w: Optional[torch.Tensor],
              params: NeuronParams):
    """Check the tensors, prepare contiguous ones and run :class:`FusedQuantNeuronFunction`.

    The step function of the fused backends (with their launcher); the devices are checked by
    the caller (:func:`snnquant.kernels.dispatch.select_backend` or a keyword function).

    .. math::
        (S_{0..T-1}, V_{T-1}, V_{0..T-1}) = \\mathrm{QuantNeuron}(X_{0..T-1}, V_{-1})

    Args:
        launcher: the backend that launches the kernels (CuPy on the GPU, ctypes on the CPU).
        x_seq: input ``[T, N, ...]``.
        v_init: initial membrane, a tensor broadcastable to ``x_seq[0]`` or a number.
        step: quantization step (positive float or one-element tensor).
        w: PLIF parameter (one-element tensor), unused by the others.
        params: the neuron's constants.

    Returns:
        ``(spike_seq, v_last, v_seq or None)``.
    """
    if not isinstance(x_seq, torch.Tensor):
        raise TypeError(f"x_seq must be a torch.Tensor, got {type(x_seq).__name__}")
    if x_seq.dtype not in DTYPE_CODES:
        raise TypeError(f"x_seq has dtype {x_seq.dtype}; the fused kernels support float16, "
                        "bfloat16, float32 and float64")
    if x_seq.dim() < 1:
        raise ValueError(f"x_seq must have a leading time dimension [T, ...], got shape "
                         f"{tuple(x_seq.shape)}")
    neuron = params.neuron
    kind = surrogate_kind(params.surrogate_function)
    if kind is None:
        raise ValueError(f"the fused kernels support the surrogate functions "
                         f"{', '.join(SUPPORTED_SURROGATES)} (spiking=True, real alpha); got "
                         f"{params.surrogate_function!r}; use backend='torch' for others")
    surrogate_code, alpha = kind
    if isinstance(step, numbers.Real) and not isinstance(step, bool):
        step = torch.tensor(check_real("step", step, positive=True), dtype=x_seq.dtype,
                            device=x_seq.device)
    step = _check_scalar_tensor("step", step)
    _check_same_device("step", step, x_seq)
    if neuron == "plif":
        w = _check_scalar_tensor("w", w)
        _check_same_device("w", w, x_seq)
    if isinstance(v_init, numbers.Real) and not isinstance(v_init, bool):
        v_init = torch.full((), float(v_init), dtype=x_seq.dtype, device=x_seq.device)
    if not isinstance(v_init, torch.Tensor):
        raise TypeError(f"v_init must be a tensor broadcastable to x_seq[0], got "
                        f"{type(v_init).__name__}")
    _check_same_device("v_init", v_init, x_seq)

    shape = tuple(x_seq.shape)
    T = shape[0]
    N = math.prod(shape[1:])
    try:
        v_start = torch.broadcast_to(v_init, shape[1:])
    except RuntimeError as error:
        raise ValueError(f"v_init of shape {tuple(v_init.shape)} does not broadcast to x_seq[0] "
                         f"of shape {shape[1:]}") from error

    hard_reset = params.v_reset is not None
    config = KernelConfig(
        dtype=x_seq.dtype,
        neuron=NEURON_CODES[neuron],
        decay_input=params.decay_input if neuron != "if" else False,
        hard_reset=hard_reset,
        detach_reset=params.detach_reset,
        surrogate=surrogate_code,
        store_v_seq=params.store_v_seq,
    )
    scalars = KernelScalars(tau=params.tau if neuron == "lif" else 1.0,
                            v_threshold=params.v_threshold,
                            v_reset=params.v_reset if hard_reset else 0.0,
                            qmin=float(params.qmin), qmax=float(params.qmax), alpha=alpha,
                            step_grad_scale=params.step_grad_scale)
    real = config.compute_dtype
    x_flat = x_seq.reshape(T, N).contiguous()
    v_flat = v_start.to(x_seq.dtype).reshape(N).contiguous()
    # as the reference: the step and k are first rounded to the storage dtype (a no-op for
    # float32/float64), then widened to the compute dtype
    step_flat = step.reshape(1).to(x_seq.dtype).to(real)
    k_flat = torch.sigmoid(w).reshape(1).to(x_seq.dtype).to(real) if neuron == "plif" else None
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x_flat, v_flat, step_flat, k_flat))
    outputs = FusedQuantNeuronFunction.apply(launcher, config, scalars, needs_grad, x_flat,
                                             v_flat, step_flat, k_flat)
    spike_seq = outputs[0].reshape(shape)
    v_last = outputs[1].reshape(shape[1:])
    v_seq = outputs[2].reshape(shape) if params.store_v_seq else None
    return spike_seq, v_last, v_seq
