"""The kernels' Python side without a GPU: optional CuPy, errors, argument checks, the CuPy launcher
driven by a stand-in ``cupy`` module (launch geometry, stream, argument list against the kernel
signatures in ``neuron.cu``, compile cache)."""

import re
import subprocess
import sys
import types
from contextlib import contextmanager

import numpy
import pytest
import torch
from spikingjelly.activation_based import surrogate

import snnquant.kernels as kernels
from snnquant.functional.neuron import NeuronParams
from snnquant.kernels import _fused, cupy_backend


def test_import_does_not_import_cupy():
    code = ("import sys, snnquant, snnquant.kernels, snnquant.kernels.host; "
            "print('cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@contextmanager
def _cupy_blocked(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` raise ImportError
    cupy_backend._cupy_import_error.cache_clear()
    try:
        yield
    finally:
        monkeypatch.delitem(sys.modules, "cupy")
        cupy_backend._cupy_import_error.cache_clear()


def test_cupy_missing_is_reported_with_install_hint(monkeypatch):
    with _cupy_blocked(monkeypatch):
        assert kernels.cupy_available() is False
        with pytest.raises(ImportError, match=r"pip install snnquant\[cuda12\]") as info:
            cupy_backend.import_cupy()
        assert isinstance(info.value, kernels.CuPyUnavailableError)
        assert "cupy-cuda12x" in str(info.value)


def test_cpu_tensors_are_refused_before_cupy_is_needed(monkeypatch):
    with _cupy_blocked(monkeypatch):
        with pytest.raises(ValueError, match="x_seq is on cpu.*move the tensors to CUDA") as info:
            kernels.fused_quant_neuron_multi_step(torch.zeros(3, 4), torch.zeros(4), neuron="if",
                                                  step=torch.tensor(0.5), qmin=-4, qmax=3)
        assert isinstance(info.value, RuntimeError)
        assert isinstance(info.value, kernels.CUDATensorsRequiredError)


def test_supports():
    assert kernels.supports(surrogate.Sigmoid(alpha=3.0), torch.float32)
    assert kernels.supports(surrogate.ATan(), torch.bfloat16)
    assert kernels.supports(surrogate.ATan(), torch.float16)
    assert kernels.supports(surrogate.Sigmoid(), torch.float64)
    assert not kernels.supports(surrogate.PiecewiseQuadratic(), torch.float32)
    assert not kernels.supports(surrogate.Sigmoid(spiking=False), torch.float32)
    assert not kernels.supports(surrogate.Sigmoid(), torch.int32)

    class MySigmoid(surrogate.Sigmoid):
        pass

    assert not kernels.supports(MySigmoid(), torch.float32)  # a subclass may change the math


class _NoLaunch:
    """Launcher for argument-check tests: must never be reached."""

    def forward(self, *args):
        raise AssertionError("launched despite bad arguments")

    backward = forward


GOOD = dict(neuron="lif", tau=2.0, step=torch.tensor(0.25), qmin=-8, qmax=7)


@pytest.mark.parametrize("change,error,match", [
    (dict(surrogate_function=surrogate.PiecewiseQuadratic()), ValueError,
     r"surrogate\.Sigmoid.*surrogate\.ATan.*backend='torch'"),
    (dict(neuron="alif"), ValueError, "neuron must be one of"),
    (dict(qmin=3, qmax=3), ValueError, "qmin must be < qmax, got qmin=3, qmax=3"),
    (dict(qmin=0.5), TypeError, "qmin must be an int, got 0.5"),
    (dict(step=-0.1), ValueError, "step must be a finite number > 0, got -0.1"),
    (dict(step=torch.tensor([0.1, 0.2])), ValueError, "step must be a one-element"),
    (dict(tau=0.0), ValueError, "tau must be a finite number > 0, got 0.0"),
    (dict(neuron="plif", w=None), TypeError, "w must be a one-element floating-point tensor"),
    (dict(v_threshold=float("nan")), ValueError, "v_threshold must be a finite number"),
    (dict(v_reset="0"), TypeError, "v_reset must be a real number"),
    (dict(detach_reset=1), TypeError, "detach_reset must be a bool"),
    (dict(store_v_seq=None), TypeError, "store_v_seq must be a bool"),
])
def test_bad_arguments_are_named(change, error, match):
    kwargs = dict(GOOD, **change)
    with pytest.raises(error, match=match):
        _run_fused(_NoLaunch(), torch.zeros(3, 4), torch.zeros(4), **_complete(kwargs))


def _complete(kwargs):
    full = dict(tau=2.0, w=None, decay_input=True, v_threshold=1.0, v_reset=0.0,
                surrogate_function=None, detach_reset=False, step_grad_scale=1.0,
                store_v_seq=False)
    full.update(kwargs)
    return full


def _run_fused(launcher, x_seq, v_init, **kwargs):
    """run_fused with keyword arguments: the tensors, and the rest as one NeuronParams."""
    step, w = kwargs.pop("step"), kwargs.pop("w", None)
    return _fused.run_fused(launcher, x_seq, v_init, step, w, NeuronParams(**kwargs))


def test_bad_tensors_are_named():
    with pytest.raises(TypeError, match="x_seq has dtype torch.int64"):
        _run_fused(_NoLaunch(), torch.zeros(3, 4, dtype=torch.int64), torch.zeros(4),
                         **_complete(GOOD))
    with pytest.raises(ValueError, match=r"v_init of shape \(5,\) does not broadcast"):
        _run_fused(_NoLaunch(), torch.zeros(3, 4), torch.zeros(5), **_complete(GOOD))
    with pytest.raises(ValueError, match="x_seq must have a leading time dimension"):
        _run_fused(_NoLaunch(), torch.zeros(()), torch.zeros(()), **_complete(GOOD))
    with pytest.raises(ValueError, match="step is on meta but x_seq is on cpu"):
        _run_fused(_NoLaunch(), torch.zeros(3, 4), torch.zeros(4),
                         **_complete(dict(GOOD, step=torch.tensor(0.5, device="meta"))))


# ------------------------------------------------------------------------------------------------
# The CuPy launcher against a stand-in cupy module
# ------------------------------------------------------------------------------------------------

def _kernel_parameters(name):
    """Kinds of the parameters of kernel ``name`` in neuron.cu: pointer, real, int, long long."""
    source = _fused.kernel_source()
    match = re.search(r"__global__ void " + name + r"\((.*?)\)\s*\{", source, re.S)
    kinds = []
    for parameter in match.group(1).split(","):
        parameter = " ".join(parameter.split())
        if "*" in parameter:
            kinds.append("pointer")
        elif parameter.endswith("long long N"):
            kinds.append("long long")
        elif parameter.endswith("int T"):
            kinds.append("int")
        elif "snq_compute<scalar_t>::type" in parameter:
            kinds.append("real")
        else:
            raise AssertionError(f"unknown parameter {parameter!r}")
    return kinds


def _argument_kinds(args, real):
    kinds = []
    for arg in args:
        if type(arg) is int:
            kinds.append("pointer")
        elif type(arg) is real:
            kinds.append("real")
        elif type(arg) is numpy.int32:
            kinds.append("int")
        elif type(arg) is numpy.int64:
            kinds.append("long long")
        else:
            raise AssertionError(f"unexpected kernel argument {arg!r} ({type(arg)})")
    return kinds


class FakeCuPy:
    """Records what the launcher asks of CuPy."""

    def __init__(self):
        fake = self
        self.modules = []
        self.launches = []
        self.devices = []

        class RawModule:
            def __init__(self, *, code, options, name_expressions):
                fake.modules.append(dict(code=code, options=options,
                                         name_expressions=name_expressions))
                self.name_expressions = name_expressions

            def get_function(self, name):
                assert name in self.name_expressions

                def kernel(grid, block, args, **kwargs):
                    fake.launches.append(dict(name=name, grid=grid, block=block, args=args,
                                              kwargs=kwargs, device=fake.devices[-1]))
                return kernel

        @contextmanager
        def device(index):
            fake.devices.append(index)
            yield

        self.RawModule = RawModule
        self.cuda = types.SimpleNamespace(Device=device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_cupy_launcher_arguments_match_kernel_signatures(monkeypatch, dtype):
    fake = FakeCuPy()
    monkeypatch.setattr(cupy_backend, "stream_for", lambda cupy, device: "current-stream")
    cache = _fused.KernelCache()
    launcher = cupy_backend.CuPyLauncher(fake, cache)
    x = torch.randn(5, 3, 300, dtype=dtype, requires_grad=True)
    w = torch.tensor(0.2, requires_grad=True)
    step = torch.tensor(0.25, requires_grad=True)
    for _ in range(2):
        spike_seq, v_last, v_seq = _run_fused(
            launcher, x, torch.zeros(()), neuron="plif", tau=2.0, w=w, decay_input=True,
            v_threshold=1.0, v_reset=None, surrogate_function=surrogate.ATan(alpha=3.0),
            detach_reset=True, step=step, qmin=-8, qmax=7, step_grad_scale=0.5, store_v_seq=True)
        # the fake kernels write nothing: only the plumbing is checked here
        (spike_seq.float().sum() + v_last.float().sum() + v_seq.float().sum()).backward()
    assert len(fake.modules) == 1 and len(cache) == 1  # compiled once per configuration
    module = fake.modules[0]
    assert module["code"] == _fused.kernel_source()
    assert module["options"] == cupy_backend.NVRTC_OPTIONS
    names = {launch["name"] for launch in fake.launches}
    assert names == set(module["name_expressions"])
    real = numpy.float64 if dtype == torch.float64 else numpy.float32
    for launch in fake.launches:
        kernel = "snq_forward" if launch["name"].startswith("snq_forward") else "snq_backward"
        assert _argument_kinds(launch["args"], real) == _kernel_parameters(kernel)
        assert launch["grid"] == ((900 + 255) // 256,) and launch["block"] == (256,)
        assert launch["kwargs"] == {"stream": "current-stream"}
        assert launch["args"][-2] == 5 and launch["args"][-1] == 900  # T, N
    forward = [launch for launch in fake.launches if launch["name"].startswith("snq_forward")]
    backward = [launch for launch in fake.launches if launch["name"].startswith("snq_backward")]
    assert len(forward) == 2 and len(backward) == 2
    assert "snq_forward<" in forward[0]["name"] and ", 2, true, false, true>" in forward[0]["name"]
    assert backward[0]["name"].endswith(", 2, true, false, true, 1>")
    # soft reset, alpha, null pointers where nothing is needed
    args = backward[0]["args"]
    assert args[-3] == real(3.0)  # alpha
    assert all(pointer != 0 for pointer in args[:12])  # PLIF decay_input: every input is needed


def test_cupy_launcher_passes_null_pointers_when_not_needed(monkeypatch):
    fake = FakeCuPy()
    monkeypatch.setattr(cupy_backend, "stream_for", lambda cupy, device: None)
    launcher = cupy_backend.CuPyLauncher(fake, _fused.KernelCache())
    x = torch.randn(4, 10)
    # inference: no h_seq; no v_seq
    _run_fused(launcher, x, torch.zeros(10), **_complete(GOOD))
    (forward,) = fake.launches
    assert forward["args"][6] == 0 and forward["args"][7] == 0  # v_seq, h_seq
    # training on x only: no step / k partial sums, no x or v_init re-read (LIF)
    fake.launches.clear()
    x.requires_grad_()
    spike_seq, _, _ = _run_fused(launcher, x, torch.zeros(10), **_complete(GOOD))
    spike_seq.sum().backward()
    backward = fake.launches[1]["args"]
    assert backward[0] != 0  # h_seq
    assert backward[1] == 0 and backward[2] == 0  # x_seq, v_init
    assert backward[5] != 0 and backward[6] == 0 and backward[7] == 0  # only grad_spike_seq
    assert backward[10] == 0 and backward[11] == 0  # no step / k partials
    # under no_grad nothing is saved, even though the step requires grad
    fake.launches.clear()
    with torch.no_grad():
        _run_fused(launcher, x, torch.zeros(10),
                         **_complete(dict(GOOD, step=torch.tensor(0.25, requires_grad=True))))
    assert fake.launches[0]["args"][7] == 0  # h_seq


def test_empty_neuron_dimension_launches_nothing(monkeypatch):
    fake = FakeCuPy()
    monkeypatch.setattr(cupy_backend, "stream_for", lambda cupy, device: None)
    launcher = cupy_backend.CuPyLauncher(fake, _fused.KernelCache())
    spikes, v_last, _ = _run_fused(launcher, torch.zeros(3, 0), torch.zeros(()),
                                         **_complete(GOOD))
    assert spikes.shape == (3, 0) and v_last.shape == (0,)
    assert fake.launches == []
