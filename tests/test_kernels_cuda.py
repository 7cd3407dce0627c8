"""The cupy backend on a GPU against the torch backend (marker ``cuda``).

Skipped, with the reason, where there is no CUDA device or no CuPy. Inputs put charges on rounding
ties and beyond both ends of the range (step 1/8, inputs on a 1/32 grid, some far out of range);
tau = 2 keeps the torch reference's ``/ tau`` (a multiplication by 0.5 on CUDA) exact.
"""

import itertools
import math

import pytest
import torch
from spikingjelly.activation_based import surrogate

from snnquant.functional.neuron import quant_neuron_multi_step as torch_backend
from snnquant.kernels import cupy_available, fused_quant_neuron_multi_step

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(not cupy_available(),
                       reason="CuPy is not installed (pip install snnquant[cuda12] or [cuda13])"),
]

STEP = 0.125
QMIN, QMAX = -12, 11
NEURON_DECAY = [("if", False), ("lif", True), ("lif", False), ("plif", True), ("plif", False)]
SURROGATES = [surrogate.Sigmoid(alpha=4.0), surrogate.ATan(alpha=2.0)]


def make_inputs(dtype, *, T=16, shape=(33, 65), seed=0):
    generator = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    on_grid = torch.randint(-24, 25, (T, n), generator=generator).to(torch.float64) * (STEP / 4)
    noise = torch.rand((T, n), generator=generator, dtype=torch.float64) * 1.6 - 0.7
    x = torch.where(torch.arange(n) % 3 == 2, noise, on_grid)
    x[:, 0], x[:, 1] = 4.0, -4.0
    v_init = torch.randint(-8, 9, shape, generator=generator).to(torch.float64) * (STEP / 2)
    return x.reshape(T, *shape).to(dtype).cuda(), v_init.to(dtype).cuda()


def run(fn, x, v_init, *, run_dtype, compute, grads, w_value, **kwargs):
    xi = x.to(run_dtype).detach().requires_grad_()
    vi = v_init.to(run_dtype).detach().requires_grad_()
    step = torch.tensor(STEP, dtype=compute, device="cuda", requires_grad=True)
    w = torch.tensor(w_value, dtype=compute, device="cuda", requires_grad=True)
    spike_seq, v_last, v_seq = fn(xi, vi, w=w, step=step, qmin=QMIN, qmax=QMAX, **kwargs)
    loss = (spike_seq.double() * grads[0]).sum() + (v_last.double() * grads[2]).sum()
    if v_seq is not None:
        loss = loss + (v_seq.double() * grads[1]).sum()
    loss.backward()
    return dict(spike_seq=spike_seq.detach(), v_last=v_last.detach(),
                v_seq=None if v_seq is None else v_seq.detach(), x=xi.grad, v_init=vi.grad,
                step=step.grad, w=w.grad)


# store_v_seq = (i + i // 2) even: each of its values meets both surrogates and both detach_reset
# values; 240 configurations (each compiled once by CuPy, then cached on disk by CuPy)
GRID = [
    pytest.param(dtype, neuron, decay, v_reset, sg, detach, (i + i // 2) % 2 == 0,
                 id=f"{str(dtype)[6:]}-{neuron}-decay{int(decay)}-reset{v_reset}-"
                    f"{type(sg).__name__}-detach{int(detach)}-store{int((i + i // 2) % 2 == 0)}")
    for i, (dtype, (neuron, decay), v_reset, sg, detach) in enumerate(itertools.product(
        (torch.float32, torch.float64, torch.float16, torch.bfloat16), NEURON_DECAY,
        (0.0, -0.3, None), SURROGATES, (False, True)))
]


@pytest.mark.parametrize("dtype,neuron,decay_input,v_reset,surrogate_function,detach_reset,"
                         "store_v_seq", GRID)
def test_cupy_matches_torch_backend(dtype, neuron, decay_input, v_reset, surrogate_function,
                                    detach_reset, store_v_seq):
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    x, v_init = make_inputs(dtype)
    generator = torch.Generator(device="cuda").manual_seed(1)
    # upstream gradients representable in the storage dtype, so that both sides receive the same
    grads = [torch.randn(shape, generator=generator, device="cuda",
                         dtype=torch.float64).to(dtype).double()
             for shape in (x.shape, x.shape, x.shape[1:])]
    kwargs = dict(neuron=neuron, tau=2.0, decay_input=decay_input,
                  v_threshold=1.0 if v_reset == 0.0 else 0.9, v_reset=v_reset,
                  surrogate_function=surrogate_function, detach_reset=detach_reset,
                  store_v_seq=store_v_seq,
                  # k = sigmoid(w) is rounded to the storage dtype: with 16-bit storage use w = 0
                  w_value=-0.4 if dtype == compute else 0.0)
    got = run(fused_quant_neuron_multi_step, x, v_init, run_dtype=dtype, compute=compute,
              grads=grads, **kwargs)
    # 16-bit storage computes in float32: the reference runs in float32 on the same values
    want = run(torch_backend, x, v_init, run_dtype=compute, compute=compute, grads=grads,
               **kwargs)
    assert got["spike_seq"].dtype == dtype
    assert torch.equal(got["spike_seq"], want["spike_seq"].to(dtype))
    tight = dict(rtol=1e-6, atol=1e-6) if dtype != torch.float64 else dict(rtol=1e-12, atol=1e-12)
    for name in ("v_last", "v_seq"):
        if want[name] is None:
            assert got[name] is None
        else:
            torch.testing.assert_close(got[name], want[name].to(dtype), **tight)
    if dtype == torch.float64:
        rtol, atol = 1e-9, 1e-10
    elif dtype == torch.float32:
        rtol, atol = 2e-5, 2e-5
    elif dtype == torch.float16:  # float32 inside, one rounding on store
        rtol, atol = 1e-3, 1e-5
    else:
        rtol, atol = 8e-3, 1e-5
    torch.testing.assert_close(got["x"], want["x"].to(dtype), rtol=rtol, atol=atol)
    torch.testing.assert_close(got["v_init"], want["v_init"].to(dtype), rtol=rtol, atol=atol)
    sum_rtol = 1e-9 if dtype == torch.float64 else max(rtol, 1e-4)
    torch.testing.assert_close(got["step"], want["step"], rtol=sum_rtol, atol=atol * 10)
    if neuron == "plif":
        torch.testing.assert_close(got["w"], want["w"], rtol=sum_rtol, atol=atol * 10)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_close_to_torch_backend_in_16bit(dtype):
    # the torch backend rounds every operation to 16 bits, the kernels only the stored values:
    # the two agree on nearly every spike
    x, v_init = make_inputs(dtype, seed=3)
    kwargs = dict(neuron="lif", tau=2.0, v_reset=0.0, step=torch.tensor(STEP, device="cuda"),
                  qmin=QMIN, qmax=QMAX)
    got = fused_quant_neuron_multi_step(x, v_init, **kwargs)[0]
    want = torch_backend(x, v_init, **kwargs)[0]
    assert (got == want).float().mean() > 0.99


def test_no_host_synchronisation_and_current_stream():
    x, v_init = make_inputs(torch.float32, seed=4)
    x.requires_grad_()
    step = torch.tensor(STEP, device="cuda", requires_grad=True)
    w = torch.tensor(0.1, device="cuda", requires_grad=True)
    want = torch_backend(x.detach(), v_init, neuron="plif", w=w.detach(), step=step.detach(),
                         qmin=QMIN, qmax=QMAX)
    fused_quant_neuron_multi_step(x, v_init, neuron="plif", w=w, step=step, qmin=QMIN,
                                  qmax=QMAX)  # compile outside the checked region
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising torch call raises
    try:
        with torch.cuda.stream(side):
            spike_seq, v_last, _ = fused_quant_neuron_multi_step(
                x, v_init, neuron="plif", w=w, step=step, qmin=QMIN, qmax=QMAX)
            (spike_seq.sum() + v_last.sum()).backward()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    side.synchronize()
    assert torch.equal(spike_seq, want[0]) and torch.equal(v_last, want[1])
    assert x.grad is not None and step.grad is not None and w.grad is not None


def test_non_contiguous_odd_sizes_and_cache():
    from snnquant.kernels.cupy_backend import KERNEL_CACHE

    x, _ = make_inputs(torch.float32, shape=(37, 29), seed=5)
    x_nc = x.transpose(1, 2)
    kwargs = dict(neuron="lif", tau=2.0, decay_input=False, v_reset=None,
                  step=torch.tensor(STEP, device="cuda"), qmin=QMIN, qmax=QMAX, store_v_seq=True)
    got = fused_quant_neuron_multi_step(x_nc, 0.0, **kwargs)
    cached = len(KERNEL_CACHE)
    got_again = fused_quant_neuron_multi_step(x_nc, 0.0, **kwargs)
    assert len(KERNEL_CACHE) == cached
    want = torch_backend(x_nc.contiguous(), torch.zeros((), device="cuda"), **kwargs)
    for a, b, c in zip(got, got_again, want):
        assert torch.equal(a, c) and torch.equal(b, c)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_second_device():
    x, v_init = make_inputs(torch.float32, seed=6)
    x, v_init = x.to("cuda:1"), v_init.to("cuda:1")
    kwargs = dict(neuron="if", step=torch.tensor(STEP, device="cuda:1"), qmin=QMIN, qmax=QMAX)
    got = fused_quant_neuron_multi_step(x, v_init, **kwargs)
    want = torch_backend(x, v_init, **kwargs)
    assert got[0].device == x.device
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_module_backends_agree():
    from snnquant.nn import QuantLIFNode

    x, _ = make_inputs(torch.float32, seed=7)
    outputs = []
    for backend in ("torch", "cupy"):
        node = QuantLIFNode(tau=2.0, step_mode="m", v_quant=4, backend=backend).cuda()
        xi = x.detach().requires_grad_()
        out = node(xi)
        out.sum().backward()
        outputs.append((out.detach(), xi.grad))
    assert torch.equal(outputs[0][0], outputs[1][0])
    torch.testing.assert_close(outputs[0][1], outputs[1][1], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("module", ["QuantIFNode", "QuantLIFNode", "QuantParametricLIFNode"])
@pytest.mark.parametrize("v_reset", [0.0, None])
def test_every_module_auto_runs_cupy_and_matches_torch(module, v_reset):
    # through the modules, with store_v_seq: 'auto' picks the kernels on CUDA, and 'cupy' and
    # 'auto' give the torch backend's spikes, membranes (within the tight tolerance above) and
    # gradients (within the documented one), the learnable PLIF weight's included
    from snnquant import nn as qnn
    from snnquant.kernels import resolve_backend

    x = make_inputs(torch.float32, seed=8)[0] + 0.75  # about 10% (LIF) to 50% (IF) spikes
    assert resolve_backend("auto", x, surrogate.Sigmoid()) == "cupy"
    weights = torch.linspace(-1, 1, x.numel(), device="cuda").reshape(x.shape)
    outputs = {}
    for backend in ("torch", "cupy", "auto"):
        node = getattr(qnn, module)(step_mode="m", v_reset=v_reset, v_quant=8,
                                    backend=backend, store_v_seq=True).cuda()
        xi = x.detach().requires_grad_()
        spikes = node(xi)
        (spikes * weights).sum().backward()
        w_grad = node.w.grad.clone() if module == "QuantParametricLIFNode" else None
        outputs[backend] = (spikes.detach(), node.v_seq.detach(), xi.grad, w_grad)
    want = outputs["torch"]
    for backend in ("cupy", "auto"):
        got = outputs[backend]
        assert torch.equal(got[0], want[0]), backend
        assert 0.05 < float(got[0].mean()) < 0.9
        torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got[2], want[2], rtol=2e-5, atol=2e-5)
        if w_grad is not None:
            torch.testing.assert_close(got[3], want[3], rtol=1e-4, atol=2e-4)
