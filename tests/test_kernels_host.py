"""The fused neuron kernels' arithmetic, checked on the CPU (no GPU needed).

``neuron.cu`` is compiled for the host with g++ (``snnquant.kernels.host``) once per session and
run through the same autograd Function the CuPy launcher uses. It is compared with the torch
backend, ``snnquant.functional.neuron.quant_neuron_multi_step``, on inputs built to hit rounding
ties and both ends of the quantization range: spikes and membranes must be equal bit for bit
(16-bit storage: equal to the float32 reference rounded to 16 bits), gradients close.
"""

import itertools
import math

import os

import pytest
import torch
from spikingjelly.activation_based import surrogate

from snnquant.functional.neuron import quant_neuron_multi_step as reference_multi_step
from snnquant.kernels import _fused
from snnquant.kernels.host import HostKernels, host_compiler

# In CI (CI=true) the host build is the only check of the kernel arithmetic: a missing compiler
# is a failure there, not a skip.
pytestmark = pytest.mark.skipif(host_compiler() is None and not os.environ.get("CI"),
                                reason="no C++ compiler (g++ or $CXX) for the host build")


@pytest.fixture(scope="session")
def host_kernels(tmp_path_factory):
    return HostKernels.build(tmp_path_factory.mktemp("snnquant_kernels_host"))


# ------------------------------------------------------------------------------------------------
# Inputs: values on the grid of step/8 so that charges land exactly on ties (k + 1/2 levels) and
# a spread wide enough to saturate at qmin and qmax.
# ------------------------------------------------------------------------------------------------
STEP = 0.125
QMIN, QMAX = -12, 11  # range [-1.5, 1.375]: the threshold 1.0 and v_reset -0.3 inside


def make_inputs(dtype, *, T=9, shape=(6, 7), seed=0):
    generator = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    on_grid = torch.randint(-24, 25, (T, n), generator=generator).to(torch.float64) * (STEP / 4)
    noise = torch.rand((T, n), generator=generator, dtype=torch.float64) * 1.6 - 0.7
    # 2/3 of the neurons see grid-aligned (tie-prone) input, 1/3 arbitrary values
    x = torch.where(torch.arange(n) % 3 == 2, noise, on_grid)
    x[:, 0] = 4.0  # drives H far above qmax * step: saturation, spike every step
    x[:, 1] = -4.0  # far below qmin * step
    x = x.reshape(T, *shape).to(dtype)
    v_init = (torch.randint(-8, 9, shape, generator=generator).to(torch.float64) * (STEP / 2)).to(dtype)
    return x, v_init


def run_both(host_kernels, *, dtype, neuron, decay_input, v_reset, surrogate_function,
             detach_reset, store_v_seq, tau=2.0, step_grad_scale=1.0, seed=0, v_threshold=None,
             step_value=STEP, qmin=QMIN, qmax=QMAX, inputs=None):
    """Forward + backward with the host kernels and the reference; returns both results."""
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    x, v_init = make_inputs(dtype, seed=seed) if inputs is None else inputs
    if v_threshold is None:
        # on the grid for the hard reset to 0; off the grid otherwise, where the soft reset
        # subtracts theta_q = ceil(v_threshold / step) * step = 1.0, not v_threshold itself
        v_threshold = 1.0 if v_reset == 0.0 else 0.9
    generator = torch.Generator().manual_seed(seed + 1)
    # upstream gradients representable in the storage dtype, so that both sides receive the same
    grads = [torch.randn(x.shape, generator=generator, dtype=torch.float64).to(dtype).double()
             for _ in range(2)]
    grad_v_last = torch.randn(x.shape[1:], generator=generator,
                              dtype=torch.float64).to(dtype).double()
    results = []
    for impl in ("kernel", "reference"):
        # the reference computes in the kernels' compute dtype; 16-bit storage is converted after
        run_dtype = dtype if impl == "kernel" else compute
        xi = x.to(run_dtype).detach().requires_grad_()
        vi = v_init.to(run_dtype).detach().requires_grad_()
        step = torch.tensor(step_value, dtype=compute, requires_grad=True)
        # k = sigmoid(w) is rounded to the storage dtype (as in the reference): with 16-bit
        # storage use w = 0, k = 1/2, which every dtype holds exactly
        w = torch.tensor(-0.4 if dtype == compute else 0.0, dtype=compute, requires_grad=True)
        kwargs = dict(neuron=neuron, tau=tau, w=w, decay_input=decay_input,
                      v_threshold=v_threshold, v_reset=v_reset,
                      surrogate_function=surrogate_function, detach_reset=detach_reset,
                      step=step, qmin=qmin, qmax=qmax,
                      step_grad_scale=step_grad_scale, store_v_seq=store_v_seq)
        fn = host_kernels.quant_neuron_multi_step if impl == "kernel" else reference_multi_step
        spike_seq, v_last, v_seq = fn(xi, vi, **kwargs)
        loss = (spike_seq.to(torch.float64) * grads[0]).sum() + \
            (v_last.to(torch.float64) * grad_v_last).sum()
        if store_v_seq:
            loss = loss + (v_seq.to(torch.float64) * grads[1]).sum()
        loss.backward()
        results.append(dict(spike_seq=spike_seq.detach(), v_last=v_last.detach(),
                            v_seq=None if v_seq is None else v_seq.detach(), x=xi.grad,
                            v_init=vi.grad, step=step.grad,
                            w=w.grad if neuron == "plif" else None))
    return results


NEURON_DECAY = [("if", False), ("lif", True), ("lif", False), ("plif", True), ("plif", False)]
RESETS = [0.0, -0.3, None]  # hard on the grid, hard off the grid (snapped), soft
SURROGATES = [surrogate.Sigmoid(alpha=4.0), surrogate.ATan(alpha=2.0)]


def _close(actual, expected, rtol, atol, what):
    torch.testing.assert_close(actual.to(torch.float64), expected.to(torch.float64), rtol=rtol,
                               atol=atol, msg=lambda m: f"{what}: {m}")


def check_results(kernel, reference, *, dtype, neuron):
    # spikes and membranes: bit-for-bit (16-bit storage: the float32 reference value, rounded)
    assert kernel["spike_seq"].dtype == dtype
    assert torch.equal(kernel["spike_seq"], reference["spike_seq"].to(dtype)), "spikes differ"
    for name in ("v_last", "v_seq"):
        if reference[name] is None:
            assert kernel[name] is None
            continue
        assert kernel[name].dtype == dtype
        assert torch.equal(kernel[name], reference[name].to(dtype)), f"{name} differs"
    if dtype == torch.float64:
        rtol, atol = 1e-9, 1e-10
    elif dtype == torch.float32:
        rtol, atol = 2e-5, 2e-5
    elif dtype == torch.float16:  # float32 inside, one rounding on store
        rtol, atol = 1e-3, 1e-5
    else:
        rtol, atol = 8e-3, 1e-5
    _close(kernel["x"], reference["x"].to(dtype), rtol, atol, "grad x_seq")
    _close(kernel["v_init"], reference["v_init"].to(dtype), rtol, atol, "grad v_init")
    # step / w gradients are sums over all neurons and steps: a looser relative tolerance
    sum_rtol = max(rtol, 1e-4) if dtype != torch.float64 else 1e-9
    _close(kernel["step"], reference["step"], sum_rtol, atol * 10, "grad step")
    if neuron == "plif":
        _close(kernel["w"], reference["w"], sum_rtol, atol * 10, "grad w")


# float32 / float64: the whole matrix (neuron x decay_input x reset x surrogate x detach_reset),
# store_v_seq alternating so that both values meet every other option.
# store_v_seq = (i + i // 2) odd/even pairs each of its values with both surrogates and both
# detach_reset values
FULL_GRID = [
    pytest.param(dtype, neuron, decay, v_reset, sg, detach, (i + i // 2) % 2 == 0,
                 id=f"{str(dtype)[6:]}-{neuron}-decay{int(decay)}-reset{v_reset}-"
                    f"{type(sg).__name__}-detach{int(detach)}-store{int((i + i // 2) % 2 == 0)}")
    for i, (dtype, (neuron, decay), v_reset, sg, detach) in enumerate(itertools.product(
        (torch.float32, torch.float64), NEURON_DECAY, RESETS, SURROGATES, (False, True)))
]


@pytest.mark.parametrize("dtype,neuron,decay_input,v_reset,surrogate_function,detach_reset,"
                         "store_v_seq", FULL_GRID)
def test_host_kernels_match_reference(host_kernels, dtype, neuron, decay_input, v_reset,
                                      surrogate_function, detach_reset, store_v_seq):
    kernel, reference = run_both(host_kernels, dtype=dtype, neuron=neuron, decay_input=decay_input,
                                 v_reset=v_reset, surrogate_function=surrogate_function,
                                 detach_reset=detach_reset, store_v_seq=store_v_seq)
    check_results(kernel, reference, dtype=dtype, neuron=neuron)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("neuron,decay_input", NEURON_DECAY)
@pytest.mark.parametrize("v_reset", [0.0, None])
def test_host_kernels_16bit_storage(host_kernels, dtype, neuron, decay_input, v_reset):
    # 16-bit storage computes in float32: equal to the float32 reference, rounded on store
    kernel, reference = run_both(host_kernels, dtype=dtype, neuron=neuron, decay_input=decay_input,
                                 v_reset=v_reset, surrogate_function=SURROGATES[0],
                                 detach_reset=False, store_v_seq=True)
    check_results(kernel, reference, dtype=dtype, neuron=neuron)


def test_inputs_hit_ties_and_range_limits():
    # the exactness tests above only mean something if the charges sit on rounding ties and
    # outside the range: check that the float32 LIF run does produce both
    x, v_init = make_inputs(torch.float32)
    hits = {"tie": 0, "below": 0, "above": 0}
    v = v_init.clone()
    v_reset_q = 0.0
    for t in range(x.shape[0]):
        h = v + (x[t] - (v - v_reset_q)) / 2.0
        ratio = h / STEP
        hits["tie"] += int(((ratio - torch.floor(ratio)) == 0.5).sum())
        hits["below"] += int((ratio < QMIN).sum())
        hits["above"] += int((ratio > QMAX).sum())
        hq = torch.clamp(torch.round(ratio), QMIN, QMAX) * STEP
        spike = (hq >= 1.0).float()
        v = hq * (1 - spike) + v_reset_q * spike
    assert hits["tie"] >= 20 and hits["below"] >= 9 and hits["above"] >= 9, hits


def test_tau_other_than_two_and_step_grad_scale(host_kernels):
    kernel, reference = run_both(host_kernels, dtype=torch.float32, neuron="lif", decay_input=True,
                                 v_reset=0.0, surrogate_function=SURROGATES[1],
                                 detach_reset=False, store_v_seq=True, tau=3.0,
                                 step_grad_scale=0.37, seed=5)
    check_results(kernel, reference, dtype=torch.float32, neuron="lif")


@pytest.mark.parametrize("neuron,decay_input", NEURON_DECAY)
def test_fine_grid_exposes_charge_arithmetic(host_kernels, neuron, decay_input):
    # step = 2^-24 with a range of +-2^24 levels: for |H| in [0.5, 1) the grid is float32's own
    # spacing, so the quantizer is transparent there and v_seq shows the charge bit for bit
    # (1/tau = 1/3 must be a division, as in the reference, not a multiplication by 0.333...)
    generator = torch.Generator().manual_seed(11)
    x = torch.rand((12, 400), generator=generator) * 0.9 + 0.3
    v_init = torch.rand((400,), generator=generator) * 0.4 + 0.5
    kernel, reference = run_both(host_kernels, dtype=torch.float32, neuron=neuron,
                                 decay_input=decay_input, v_reset=None,
                                 surrogate_function=SURROGATES[0], detach_reset=False,
                                 store_v_seq=True, tau=3.0, v_threshold=1.0,
                                 step_value=2.0 ** -24, qmin=-(2 ** 24), qmax=2 ** 24,
                                 inputs=(x, v_init))
    check_results(kernel, reference, dtype=torch.float32, neuron=neuron)
    v_seq = reference["v_seq"]
    assert ((v_seq.abs() >= 0.5) & (v_seq.abs() < 1.0)).float().mean() > 0.25


@pytest.mark.parametrize("v_reset", [-0.3, None])
def test_step_not_a_power_of_two(host_kernels, v_reset):
    # s = 0.024: PyTorch evaluates v_reset / s and v_threshold / s as reciprocal(s) * value, which
    # gives round(-0.3 / s) = -13 and ceil(0.6 / s) = 26, where a true division gives -12 and 25
    generator = torch.Generator().manual_seed(12)
    x = torch.rand((10, 300), generator=generator) * 2.0 - 0.4
    v_init = torch.zeros(300)
    kernel, reference = run_both(host_kernels, dtype=torch.float32, neuron="lif",
                                 decay_input=True, v_reset=v_reset,
                                 surrogate_function=SURROGATES[1], detach_reset=False,
                                 store_v_seq=True, v_threshold=0.6, step_value=0.024, qmin=-40,
                                 qmax=40, inputs=(x, v_init))
    check_results(kernel, reference, dtype=torch.float32, neuron="lif")
    assert kernel["spike_seq"].sum() > 100


def test_grad_step_scale_is_applied(host_kernels):
    base, _ = run_both(host_kernels, dtype=torch.float64, neuron="if", decay_input=False,
                       v_reset=0.0, surrogate_function=SURROGATES[0], detach_reset=False,
                       store_v_seq=False, step_grad_scale=1.0)
    scaled, _ = run_both(host_kernels, dtype=torch.float64, neuron="if", decay_input=False,
                         v_reset=0.0, surrogate_function=SURROGATES[0], detach_reset=False,
                         store_v_seq=False, step_grad_scale=0.25)
    assert base["step"].abs() > 0
    torch.testing.assert_close(scaled["step"], base["step"] * 0.25)
    torch.testing.assert_close(scaled["x"], base["x"])


def test_partial_outputs_and_unused_grads(host_kernels):
    # only the spikes are used: grad of v_last / v_seq arrive as None (no zero tensors needed)
    x, v_init = make_inputs(torch.float32, seed=3)
    outs = []
    for fn in (host_kernels.quant_neuron_multi_step, reference_multi_step):
        xi = x.clone().requires_grad_()
        step = torch.tensor(STEP, requires_grad=True)
        spike_seq, v_last, v_seq = fn(xi, v_init, neuron="lif", tau=2.0, step=step, qmin=QMIN,
                                      qmax=QMAX, store_v_seq=True)
        (spike_seq * torch.linspace(-1, 1, spike_seq.numel()).reshape(spike_seq.shape)).sum() \
            .backward()
        outs.append((xi.grad, step.grad))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-4, atol=1e-4)
    assert outs[0][0].abs().sum() > 0


def test_non_contiguous_input_and_broadcast_v_init(host_kernels):
    x, _ = make_inputs(torch.float32, shape=(6, 7), seed=4)
    x_nc = x.transpose(1, 2)  # [T, 7, 6], not contiguous
    assert not x_nc.is_contiguous()
    v_init = torch.full((1, 6), 0.25)  # broadcast over the 7 rows
    kwargs = dict(neuron="plif", w=torch.tensor(0.3), decay_input=False, v_reset=None,
                  step=torch.tensor(STEP), qmin=QMIN, qmax=QMAX, store_v_seq=True)
    got = host_kernels.quant_neuron_multi_step(x_nc, v_init, **kwargs)
    want = reference_multi_step(x_nc.contiguous(), v_init, **kwargs)
    assert got[0].shape == x_nc.shape and got[1].shape == x_nc.shape[1:]
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(got[2], want[2])
    # a number as v_init means a constant initial membrane
    got_number = host_kernels.quant_neuron_multi_step(x_nc, 0.25, **kwargs)
    assert torch.equal(got_number[0], got[0])


def test_inference_mode_skips_saving(host_kernels):
    x, v_init = make_inputs(torch.float32, seed=6)
    step = torch.tensor(STEP, requires_grad=True)
    with torch.no_grad():
        spikes, v_last, _ = host_kernels.quant_neuron_multi_step(x, v_init, neuron="if",
                                                                 step=step, qmin=QMIN, qmax=QMAX)
    want = reference_multi_step(x, v_init, neuron="if", step=step.detach(), qmin=QMIN, qmax=QMAX)
    assert not spikes.requires_grad
    assert torch.equal(spikes, want[0]) and torch.equal(v_last, want[1])


def test_empty_sequences(host_kernels):
    step = torch.tensor(STEP)
    spikes, v_last, v_seq = host_kernels.quant_neuron_multi_step(
        torch.zeros(0, 3), torch.full((3,), 0.5), neuron="lif", step=step, qmin=QMIN, qmax=QMAX,
        store_v_seq=True)
    assert spikes.shape == (0, 3) and v_seq.shape == (0, 3)
    assert torch.equal(v_last, torch.full((3,), 0.5))
    spikes, v_last, _ = host_kernels.quant_neuron_multi_step(
        torch.zeros(4, 0), torch.zeros(()), neuron="lif", step=step, qmin=QMIN, qmax=QMAX)
    assert spikes.shape == (4, 0) and v_last.shape == (0,)


def test_16bit_conversions_match_torch(host_kernels):
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    # every half / bfloat16 bit pattern to float32
    want_half = bits.view(torch.float16).float()
    got_half = host_kernels.half_bits_to_float(bits)
    same = (got_half == want_half) | (torch.isnan(got_half) & torch.isnan(want_half))
    assert bool(same.all())
    want_bf16 = bits.view(torch.bfloat16).float()
    got_bf16 = host_kernels.bfloat16_bits_to_float(bits)
    same = (got_bf16 == want_bf16) | (torch.isnan(got_bf16) & torch.isnan(want_bf16))
    assert bool(same.all())
    # float32 to 16 bits: midpoints between neighbours (ties), neighbours of midpoints, and spread
    generator = torch.Generator().manual_seed(0)
    finite = bits.view(torch.float16).float()
    finite = finite[torch.isfinite(finite)].sort().values
    mids = (finite[:-1].double() + finite[1:].double()) / 2
    values = torch.cat([
        mids.float(), torch.nextafter(mids.float(), torch.tensor(math.inf)),
        torch.nextafter(mids.float(), torch.tensor(-math.inf)),
        torch.randn(100_000, generator=generator) * 1e3,
        torch.tensor([65504.0, 65519.99, 65520.0, 7e4, -7e4, 1e-8, -1e-8, 3e-5, 0.0, -0.0,
                      math.inf, -math.inf]),
    ])
    got = host_kernels.float_to_half_bits(values)
    want = values.half().view(torch.int16)
    assert torch.equal(got, want)
    got = host_kernels.float_to_bfloat16_bits(values)
    want = values.bfloat16().view(torch.int16)
    assert torch.equal(got, want)
    nan_bits = host_kernels.float_to_half_bits(torch.tensor([math.nan]))
    assert bool(torch.isnan(nan_bits.view(torch.float16)).all())
    nan_bits = host_kernels.float_to_bfloat16_bits(torch.tensor([math.nan]))
    assert bool(torch.isnan(nan_bits.view(torch.bfloat16)).all())


def test_host_rejects_cuda_tensors(host_kernels):
    with pytest.raises(ValueError, match="CPU tensors only"):
        host_kernels.check_device("x_seq", torch.empty(0, device="meta"))


def test_all_configs_have_distinct_instantiations():
    configs = _fused.all_configs()
    assert len(configs) == 320
    assert len({c.forward_name + c.backward_name for c in configs}) == 320
    assert len({c.forward_name for c in configs}) == 80
    assert len({c.backward_name for c in configs}) == 160
