r"""Fused multi-step kernels of the chip neurons (:mod:`snnquant.targets`): Xylo's, Loihi's (Lava's
fixed point) and Speck's neuron layers, all ``T`` steps in one call, forward and backward.

The chip layers of :mod:`snnquant.targets` step through time in Python with the torch functions of
:mod:`snnquant.functional.chip_neurons`. The functions here compute the same thing: the synaptic
input of every step (a matrix product or a convolution) in one torch operation, then the
neurons' recurrence over the ``T`` steps in the "Chip neurons" section of ``neuron.cu``, one
thread per neuron, on the CPU (the cpp backend: that source compiled by the C++ compiler into one
library for every chip, cached on disk like the neuron kernels'; see
:mod:`snnquant.kernels.cpp_backend`) or on the GPU (CuPy). Everything is float64 and every forward
value an integer below :math:`2^{53}`: spikes and states equal the torch functions' exactly, and
the gradients are the same formulas (the ones documented in
:mod:`snnquant.functional.chip_neurons`), summed in another order.

``backend`` takes the values of :data:`snnquant.kernels.BACKENDS` and is resolved as for the
quantized neurons (:func:`snnquant.kernels.resolve_backend`): ``'auto'`` runs the kernels where
they can run (a C++ compiler and a writable cache folder on the CPU, CuPy on CUDA, a
``surrogate.Sigmoid`` or ``surrogate.ATan`` surrogate) and the torch loop otherwise; ``'cpp'`` and
``'cupy'`` refuse what they cannot run.

Public names: :func:`xylo_lif_multi_step`, :func:`loihi_lif_multi_step`,
:func:`speck_iaf_multi_step`, :data:`CHIP_CODES`, :func:`kernel_names`.
"""

from __future__ import annotations

import ctypes
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ..functional._validation import check_int
from ..functional.chip_neurons import (loihi_dense, loihi_lif_step, speck_iaf_step,
                                       surrogate_count, xylo_lif_step)
from ._fused import KernelCache, surrogate_kind, kernel_source, pointer
from .dispatch import resolve_backend

__all__ = ["CHIP_CODES", "kernel_names", "xylo_lif_multi_step", "loihi_lif_multi_step",
           "speck_iaf_multi_step"]

#: the chip codes of ``neuron.cu`` (``SNQ_CHIP_*``)
CHIP_CODES = {"xylo": 0, "loihi": 1, "speck": 2}


# ---- launchers ----------------------------------------------------------------------------------
class _CppChipLauncher:
    """Runs the chip kernels' CPU build (``chip_entry.h``), one library for every chip."""

    SYMBOLS = ("snq_chip_cpu_forward", "snq_chip_cpu_backward")

    def __init__(self):
        self._cache: KernelCache = KernelCache()

    def _lib(self):
        def load():
            from .cpp_backend import build_arguments, open_cached_library

            arguments = build_arguments(None, None, None, "chip")
            lib = open_cached_library(*arguments[:4], "the cpp backend's chip kernels",
                                      self.SYMBOLS)
            p, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
            lib.snq_chip_cpu_forward.argtypes = [i] + [p] * 14 + [i, ll, i, i, i]
            lib.snq_chip_cpu_forward.restype = i
            lib.snq_chip_cpu_backward.argtypes = [i, i] + [p] * 12 + [i, ll, i, i]
            lib.snq_chip_cpu_backward.restype = i
            return lib
        return self._cache.get("chip", load)

    def forward(self, chip, P, tensors, T, M, out_features, in_features):
        status = self._lib().snq_chip_cpu_forward(chip, *map(pointer, (P, *tensors)), T, M,
                                                  out_features, in_features,
                                                  torch.get_num_threads())
        if status != 0:
            raise RuntimeError(f"snq_chip_cpu_forward rejected chip code {chip}")

    def backward(self, chip, surrogate, P, tensors, T, M, out_features):
        status = self._lib().snq_chip_cpu_backward(chip, surrogate, *map(pointer, (P, *tensors)),
                                                   T, M, out_features, torch.get_num_threads())
        if status != 0:
            raise RuntimeError(f"snq_chip_cpu_backward rejected chip code {chip} or surrogate "
                               f"code {surrogate}")


def _forward_name(chip: int) -> str:
    return f"snq_chip_forward<{chip}>"


def _backward_name(chip: int, surrogate: int) -> str:
    return f"snq_chip_backward<{chip}, {surrogate}>"


def kernel_names() -> tuple:
    """The name expressions of the chip kernels that the CuPy launcher compiles (NVRTC): one
    forward per chip, one backward per chip and surrogate."""
    return tuple(_forward_name(c) for c in CHIP_CODES.values()) + tuple(
        _backward_name(c, s) for c in CHIP_CODES.values() for s in (0, 1))


class _CuPyChipLauncher:
    """Launches the chip kernels of ``neuron.cu`` with CuPy on PyTorch's current stream."""

    def __init__(self, cupy):
        self._cupy = cupy

    def _launch(self, name: str, device: torch.device, M: int, args: tuple) -> None:
        from .cupy_backend import BLOCK_SIZE, NVRTC_OPTIONS, stream_for

        if M == 0:
            return
        cupy = self._cupy
        names = kernel_names()

        def build():
            module = cupy.RawModule(code=kernel_source(), options=NVRTC_OPTIONS,
                                    name_expressions=names)
            return {n: module.get_function(n) for n in names}
        with cupy.cuda.Device(device.index):
            kernel = _CUPY_KERNELS.get(device.index, build)[name]
            kernel(((M + BLOCK_SIZE - 1) // BLOCK_SIZE,), (BLOCK_SIZE,), args,
                   stream=stream_for(cupy, device))

    def forward(self, chip, P, tensors, T, M, out_features, in_features):
        import numpy

        args = (*(pointer(t) or 0 for t in (P, *tensors)), numpy.int32(T), numpy.int64(M),
                numpy.int32(out_features), numpy.int32(in_features))
        self._launch(_forward_name(chip), P.device, M, args)

    def backward(self, chip, surrogate, P, tensors, T, M, out_features):
        import numpy

        args = (*(pointer(t) or 0 for t in (P, *tensors)), numpy.int32(T), numpy.int64(M),
                numpy.int32(out_features))
        self._launch(_backward_name(chip, surrogate), P.device, M, args)


_CPP = _CppChipLauncher()
#: the compiled chip kernels per CUDA device
_CUPY_KERNELS: KernelCache = KernelCache()


def _launcher(name: str, x: torch.Tensor, surrogate_function, argument: str):
    """The launcher of backend ``name`` (``'cpp'`` or ``'cupy'``) after its checks."""
    if surrogate_kind(surrogate_function) is None:
        raise ValueError(f"backend={name!r}: the chip kernels implement the surrogate functions "
                         f"surrogate.Sigmoid and surrogate.ATan (spiking, with a float alpha), "
                         f"got {surrogate_function!r}; use backend='torch' or 'auto'")
    if name == "cpp":
        from .cpp_backend import check_cpu, require_cache, require_cpp

        check_cpu(argument, x)
        require_cpp()
        require_cache()
        return _CPP
    from .cupy_backend import check_cuda, import_cupy

    check_cuda(argument, x)
    return _CuPyChipLauncher(import_cupy())


def _resolve(backend: str, x: torch.Tensor, surrogate_function, argument: str):
    """``None`` for the torch loop, else the launcher of the kernels."""
    name = resolve_backend(backend, x, surrogate_function)
    if name == "torch":
        return None
    return _launcher(name, x, surrogate_function, argument)


# ---- the autograd Function ----------------------------------------------------------------------
def _f64(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach().to(torch.float64).contiguous()


class _ChipNeuronFunction(torch.autograd.Function):
    """The kernels' forward and backward; see :func:`_run`."""

    @staticmethod
    def forward(ctx, launcher, chip, surrogate, P, sizes, x, bias, s0, s1, up, down, counts,
                weight):
        T, M, out_features, in_features = sizes
        x_d, bias_d, s0_d, s1_d = _f64(x), _f64(bias), _f64(s0), _f64(s1)
        new = lambda: torch.empty((T, M), dtype=torch.float64, device=x.device)  # noqa: E731
        out, save0 = new(), new()
        save1 = new() if chip == CHIP_CODES["xylo"] else None
        s0_last = torch.empty(M, dtype=torch.float64, device=x.device)
        s1_last = torch.zeros(M, dtype=torch.float64, device=x.device)
        launcher.forward(chip, P, (x_d, _f64(up), _f64(down), _f64(counts), _f64(weight), bias_d,
                                   s0_d, s1_d, out, save0, save1, s0_last, s1_last),
                         T, M, out_features, in_features)
        ctx.launcher, ctx.chip, ctx.surrogate, ctx.sizes = launcher, chip, surrogate, sizes
        ctx.has_bias = bias is not None
        ctx.save_for_backward(P, save0, save1, s1_d, bias_d)
        return out, s0_last, s1_last

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_s0, grad_s1):
        P, save0, save1, s1_d, bias_d = ctx.saved_tensors
        T, M, out_features, _ = ctx.sizes
        device = save0.device
        grad_x = torch.empty((T, M), dtype=torch.float64, device=device)
        grad_s0_init = torch.empty(M, dtype=torch.float64, device=device)
        grad_s1_init = torch.empty(M, dtype=torch.float64, device=device)
        need_bias = ctx.has_bias and ctx.needs_input_grad[6]
        partial = torch.empty(M, dtype=torch.float64, device=device) if need_bias else None
        ctx.launcher.backward(ctx.chip, ctx.surrogate, P,
                              (save0, save1, s1_d, bias_d, _f64(grad_out), _f64(grad_s0),
                               _f64(grad_s1), grad_x, partial, grad_s0_init, grad_s1_init),
                              T, M, out_features)
        grad_bias = partial.view(-1, out_features).sum(0) if need_bias else None
        needs = ctx.needs_input_grad
        return (None, None, None, None, None, grad_x if needs[5] else None, grad_bias,
                grad_s0_init if needs[7] else None, grad_s1_init if needs[8] else None,
                None, None, None, None)


def _run(launcher, chip: str, surrogate_function, P: list, x: torch.Tensor, out_features: int,
         bias=None, state=(None, None), up=None, down=None, counts=None, weight=None,
         in_features: int = 0):
    """Run the kernels of ``chip`` on ``x`` (``[T, N, ...]``, the last ``out_features`` values
    one sample's neurons): ``(out [T, M], s0 [M], s1 [M])`` in float64, with gradients."""
    code, alpha = surrogate_kind(surrogate_function)
    T = x.shape[0]
    M = x[0].numel()
    params = torch.tensor(P + [alpha], dtype=torch.float64, device=x.device)
    s0, s1 = (None if s is None else s.reshape(M) for s in state)
    return _ChipNeuronFunction.apply(launcher, CHIP_CODES[chip], code, params,
                                     (T, M, out_features, in_features), x.reshape(T, M), bias,
                                     s0, s1, up, down, counts, weight)


def _torch_loop(step, state, seq: torch.Tensor, surrogate_function, *args, **kwargs):
    """The torch backend: ``step(state, seq[t], *args, fire=..., **kwargs)`` (a step of
    :mod:`snnquant.functional.chip_neurons`) at every ``t``; ``(stacked outputs, last state)``."""
    def fire(v, n, threshold):
        return surrogate_count(surrogate_function, v, n, threshold)
    outs = []
    for t in range(seq.shape[0]):
        out, state = step(state, seq[t], *args, fire=fire, **kwargs)
        outs.append(out)
    return torch.stack(outs), state


# ---- argument checks, the same for every backend -------------------------------------------------
_REAL_DTYPES = (torch.float32, torch.float64)


def _check_tensor(fn: str, name: str, t, shape) -> None:
    """``t`` a float32/float64 tensor of ``shape`` (``None`` entries: any size) holding finite
    values; a ``TypeError``/``ValueError`` naming ``fn`` and ``name`` otherwise."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _REAL_DTYPES:
        raise TypeError(f"{fn}: {name} must be a float32 or float64 tensor (integers held "
                        f"exactly), got dtype {t.dtype}")
    if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
        want = ", ".join("*" if s is None else str(s) for s in shape)
        raise ValueError(f"{fn}: {name} must have the shape [{want}], got {tuple(t.shape)}")
    if t.numel() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{fn}: {name} must hold finite values, got NaN or infinity")


def _check_ints(fn: str, rules) -> dict:
    """``{name: int}`` of ``(name, value, lo, hi)`` after :func:`check_int`."""
    return {name: check_int(fn, name, value, lo, hi) for name, value, lo, hi in rules}


def _check_state(fn: str, state, shape) -> None:
    if state is None:
        return
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise TypeError(f"{fn}: state must be None or a pair of tensors, got "
                        f"{type(state).__name__}")
    for k, s in enumerate(state):
        if s is not None:
            _check_tensor(fn, f"state[{k}]", s, shape)


def _check_dense(fn: str, seq_name: str, state, seq, weight, bias) -> None:
    _check_tensor(fn, seq_name, seq, (None, None, None))
    _check_tensor(fn, "weight", weight, (None, seq.shape[2]))
    if bias is not None:
        _check_tensor(fn, "bias", bias, (weight.shape[0],))
    _check_state(fn, state, (seq.shape[1], weight.shape[0]))


# ---- the chips ----------------------------------------------------------------------------------
def xylo_lif_multi_step(state, counts_seq: torch.Tensor, weight: torch.Tensor, bias, *,
                        threshold: int, dash_syn: int, dash_mem: int, max_spikes: int,
                        state_bits: int = 16, surrogate_function,
                        backend: str = "auto") -> Tuple[torch.Tensor, tuple]:
    r"""All ``T`` steps of a layer of Xylo neurons:
    :func:`~snnquant.functional.chip_neurons.xylo_lif_step` at every step, fused.

    .. math::

        I_t &= d_{I}(\mathrm{sat\_acc}(I_{t-1},\ c_t,\ W))\\
        V_t' &= \mathrm{sat}(V_{t-1} + \mathrm{sat}(\mathrm{sat}(I_t - (V_{t-1} -
            d_{V}(V_{t-1}))) + b))\\
        n_t &= \min(\lfloor V_t'/\theta \rfloor, n_{max})\,[V_t' \ge \theta],\qquad
        V_t = V_t' - n_t\theta

    Gradient (the step's): :math:`\partial I_t/\partial I_{t-1} = \partial I_t/\partial(c_t W^T)
    = 1 - 2^{-\mathrm{dash\_syn}}`, :math:`\partial(V_{t-1} - d_V(V_{t-1}))/\partial V_{t-1} =
    2^{-\mathrm{dash\_mem}}`, each saturation 1 inside and 0 outside,
    :math:`\partial n_t/\partial V_t' = \sigma'((V_t' - \theta)/\theta)/\theta`,
    :math:`\partial V_t/\partial n_t = -\theta`.

    Args:
        state: ``(I, V)`` (``[N, out]`` each) or ``None`` (zeros).
        counts_seq: ``[T, N, in]`` input event counts (already delayed).
        weight: ``[out, in]`` integer weights as applied (shifted).
        bias: ``[out]`` integer bias or ``None``.
        threshold, dash_syn, dash_mem, max_spikes, state_bits: the layer's integers.
        surrogate_function: the SpikingJelly surrogate :math:`\sigma`.
        backend: see the module documentation.

    Returns:
        ``(n_seq, (I, V))``: ``[T, N, out]`` counts and the last state, in the dtype of
        ``counts_seq`` (as the torch step returns them); ``state`` itself when ``T`` is 0.
    """
    fn = "xylo_lif_multi_step"
    _check_dense(fn, "counts_seq", state, counts_seq, weight, bias)
    state_bits = _check_ints(fn, [("state_bits", state_bits, 2, 32)])["state_bits"]
    _check_ints(fn, [("threshold", threshold, 1, 2 ** (state_bits - 1) - 1),
                     ("dash_syn", dash_syn, 0, 15), ("dash_mem", dash_mem, 0, 15),
                     ("max_spikes", max_spikes, 1, 2 ** 15)])
    if counts_seq.shape[0] == 0:
        return counts_seq.new_zeros(0, counts_seq.shape[1], weight.shape[0]), state
    launcher = _resolve(backend, counts_seq, surrogate_function, "counts_seq")
    if launcher is None:
        return _torch_loop(xylo_lif_step, state, counts_seq, surrogate_function, weight, bias,
                           threshold=threshold, dash_syn=dash_syn, dash_mem=dash_mem,
                           max_spikes=max_spikes, state_bits=state_bits)
    T, N, _ = counts_seq.shape
    out_features, in_features = weight.shape
    c = counts_seq.to(torch.float64)
    w = weight.to(torch.float64)
    x = c @ w.t()
    with torch.no_grad():
        up, down = c @ w.clamp(min=0).t(), c @ w.clamp(max=0).t()
    n, s0, s1 = _run(launcher, "xylo", surrogate_function,
                     [threshold, dash_syn, dash_mem, max_spikes, state_bits], x, out_features,
                     bias=bias, state=state or (None, None), up=up, down=down, counts=c,
                     weight=w, in_features=in_features)
    dtype = counts_seq.dtype
    return (n.reshape(T, N, out_features).to(dtype),
            (s0.reshape(N, out_features).to(dtype), s1.reshape(N, out_features).to(dtype)))


def loihi_lif_multi_step(state, spikes_seq: torch.Tensor, weight: torch.Tensor, bias, *,
                         vth: int, du: int, dv: int, weight_exp: int, bias_exp: int,
                         state_bits: int = 24, surrogate_function,
                         backend: str = "auto") -> Tuple[torch.Tensor, tuple]:
    r"""All ``T`` steps of a Lava ``Dense`` + ``LIF`` pair in Lava's fixed point:
    :func:`~snnquant.functional.chip_neurons.loihi_lif_step` at every step, fused.

    .. math::

        a_t &= \mathrm{dense}(s_t)\ \ (\text{see } \mathtt{loihi\_dense})\\
        u_t &= \mathrm{wrap}_{b}(\mathrm{sign}(u_{t-1})\lfloor |u_{t-1}(4095 - d_u)| / 4096
            \rfloor + 64 a_t)\\
        v_t' &= \mathrm{clip}(\mathrm{sign}(v_{t-1})\lfloor |v_{t-1}(4096 - d_v)| / 4096\rfloor
            + u_t + \beta 2^{\beta_e},\ -2^{b-1}+1,\ 2^{b-1}-1)\\
        S_t &= [v_t' > 64\vartheta],\qquad v_t = v_t'(1 - S_t)

    Gradient (the step's): the decays :math:`(4095 - d_u)/4096` and :math:`(4096 - d_v)/4096`,
    :math:`\partial u_t/\partial a_t = 64`, the wrap 1, the clip 1 inside and 0 outside,
    :math:`\partial S_t/\partial v_t' = \sigma'((v_t' - f)/f)/f` with :math:`f =
    \max(64\vartheta, 1)`, :math:`\partial v_t/\partial v_t' = 1 - S_t`,
    :math:`\partial v_t/\partial S_t = -v_t'`.

    Args:
        state: ``(u, v)`` (``[N, out]`` float64 each) or ``None`` (zeros).
        spikes_seq: ``[T, N, in]`` input spikes (already delayed by Lava's one step).
        weight: ``[out, in]`` Lava weights.
        bias: ``[out]`` bias mantissas :math:`\beta` or ``None``.
        vth, du, dv, weight_exp, bias_exp, state_bits: the layer's integers.
        surrogate_function: the SpikingJelly surrogate :math:`\sigma`.
        backend: see the module documentation.

    Returns:
        ``(S_seq, (u, v))``, float64 (as the torch step returns them); ``state`` itself when
        ``T`` is 0.
    """
    fn = "loihi_lif_multi_step"
    _check_dense(fn, "spikes_seq", state, spikes_seq, weight, bias)
    _check_ints(fn, [("state_bits", state_bits, 2, 32), ("vth", vth, 0, 2 ** 17 - 1),
                     ("du", du, 0, 4095), ("dv", dv, 0, 4095), ("weight_exp", weight_exp, -8, 7),
                     ("bias_exp", bias_exp, 0, 7)])
    if spikes_seq.shape[0] == 0:
        return torch.zeros(0, spikes_seq.shape[1], weight.shape[0], dtype=torch.float64,
                           device=spikes_seq.device), state
    launcher = _resolve(backend, spikes_seq, surrogate_function, "spikes_seq")
    if launcher is None:
        return _torch_loop(loihi_lif_step, state, spikes_seq, surrogate_function, weight, bias,
                           vth=vth, du=du, dv=dv, weight_exp=weight_exp, bias_exp=bias_exp,
                           state_bits=state_bits)
    T, N, _ = spikes_seq.shape
    out_features = weight.shape[0]
    a = loihi_dense(spikes_seq, weight, weight_exp)
    s, u, v = _run(launcher, "loihi", surrogate_function, [vth, du, dv, state_bits, bias_exp], a,
                   out_features, bias=bias, state=state or (None, None))
    return s.reshape(T, N, out_features), (u.reshape(N, out_features),
                                           v.reshape(N, out_features))


def speck_iaf_multi_step(v, current_seq: torch.Tensor, *, threshold: int, spike: str, v_min: int,
                         pool: int = 1, surrogate_function,
                         backend: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    r"""All ``T`` steps of a Speck core's integrate-and-fire neurons and its sum pooling:
    :func:`~snnquant.functional.chip_neurons.speck_iaf_step` at every step, fused.

    .. math::

        v_t' &= v_{t-1} + y_t\\
        n_t &= [v_t' > 0]\,\lfloor v_t'/\theta \rfloor\ (\text{multi})\quad\text{or}\quad
            [v_t' \ge \theta]\ (\text{single})\\
        v_t &= \max(v_t' - n_t\theta,\ v_{min}),\qquad \text{out}_t = \mathrm{sumpool}_k(n_t)

    Gradient (the step's): :math:`\partial n_t/\partial v_t' = \sigma'((v_t' - \theta)/\theta)
    /\theta`, the lower bound 1 above it (at it included) and 0 below, the rest 1 or
    :math:`-\theta`.

    Args:
        v: ``[N, C, H, W]`` membrane or ``None`` (zeros).
        current_seq: ``[T, N, C, H, W]`` input currents
            (:func:`~snnquant.functional.chip_neurons.speck_synapse` of every step).
        threshold, spike, v_min, pool: as for ``speck_iaf_step``.
        surrogate_function: the SpikingJelly surrogate :math:`\sigma`.
        backend: see the module documentation.

    Returns:
        ``(out_seq, v)``, float64; ``v`` itself when ``T`` is 0.
    """
    fn = "speck_iaf_multi_step"
    if spike not in ("multi", "single"):
        raise ValueError(f"{fn}: spike must be 'multi' or 'single', got {spike!r}")
    _check_tensor(fn, "current_seq", current_seq, (None,) * 5)
    _check_ints(fn, [("threshold", threshold, 1, 2 ** 31 - 1), ("v_min", v_min, -2 ** 31, 0),
                     ("pool", pool, 1, 64)])
    if current_seq.shape[3] % pool or current_seq.shape[4] % pool:
        raise ValueError(f"{fn}: pool {pool} must divide the neurons' height and width "
                         f"{tuple(current_seq.shape[3:])}")
    if v is not None:
        _check_tensor(fn, "v", v, tuple(current_seq.shape[1:]))
    if current_seq.shape[0] == 0:
        shape = current_seq.shape
        return torch.zeros(0, shape[1], shape[2], shape[3] // pool, shape[4] // pool,
                           dtype=torch.float64, device=current_seq.device), v
    launcher = _resolve(backend, current_seq, surrogate_function, "current_seq")
    if launcher is None:
        return _torch_loop(speck_iaf_step, v, current_seq, surrogate_function,
                           threshold=threshold, spike=spike, v_min=v_min, pool=pool)
    T, N = current_seq.shape[:2]
    n, s0, _ = _run(launcher, "speck", surrogate_function,
                    [threshold, 1 if spike == "multi" else 0, v_min], current_seq, 1,
                    state=(v, None))
    n = n.reshape(current_seq.shape)
    if pool > 1:
        n = F.avg_pool2d(n.flatten(0, 1), pool, divisor_override=1)
        n = n.reshape(T, N, *n.shape[1:])
    return n, s0.reshape(current_seq.shape[1:])
