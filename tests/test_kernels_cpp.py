"""The cpp backend (``neuron.cu`` compiled for the CPU with -O3 and OpenMP) against the torch backend.

Spikes and membranes must be equal bit for bit (16-bit storage: the float32 reference rounded to
16 bits), gradients within the tolerances of the host-build tests (tests/test_kernels_host.py,
whose inputs hit rounding ties and both ends of the range). Every option of the kernels is run;
float32 crosses every neuron kind with every reset, and the other options rotate over those runs,
so that the test builds about 30 of the 320 configurations (each build takes about a second).

There is no skip: without a C++ compiler these tests fail, in CI as anywhere.
"""

import itertools
import math
import os
import re
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import surrogate

import snnquant.nn as qnn
from snnquant import QuantConfig, quantize_model
from snnquant.functional.neuron import quant_neuron_multi_step as reference_multi_step
from snnquant.kernels import _fused, cpp_backend, dispatch
from snnquant.kernels.cpp_backend import cpp_quant_neuron_multi_step

from test_kernels_host import NEURON_DECAY, QMAX, QMIN, STEP, SURROGATES, check_results, \
    make_inputs, run_both

REPO = Path(__file__).resolve().parents[1]


class _Cpp:
    """run_both() calls ``.quant_neuron_multi_step`` of its kernel object."""

    quant_neuron_multi_step = staticmethod(cpp_quant_neuron_multi_step)


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    # a fresh cache per test run: every library the tests use is built by them
    directory = tmp_path_factory.mktemp("snnquant_cpp_cache")
    previous = os.environ.get("SNNQUANT_CACHE_DIR")
    os.environ["SNNQUANT_CACHE_DIR"] = str(directory)
    cpp_backend.LIBRARY_CACHE.clear()
    yield directory
    cpp_backend.LIBRARY_CACHE.clear()
    if previous is None:
        del os.environ["SNNQUANT_CACHE_DIR"]
    else:
        os.environ["SNNQUANT_CACHE_DIR"] = previous


RESETS = [0.0, -0.3, None]  # hard on the grid, hard off the grid (snapped), soft
OPTIONS = list(itertools.product(SURROGATES, (False, True), (False, True)))  # sg, detach, store


def _grid():
    cases = []
    for i, ((neuron, decay), v_reset) in enumerate(itertools.product(NEURON_DECAY, RESETS)):
        sg, detach, store = OPTIONS[i % len(OPTIONS)]
        cases.append((torch.float32, neuron, decay, v_reset, sg, detach, store))
    for i, (neuron, decay) in enumerate(NEURON_DECAY):
        sg, detach, store = OPTIONS[(3 * i + 1) % len(OPTIONS)]
        cases.append((torch.float64, neuron, decay, RESETS[i % 3], sg, detach, store))
    return [pytest.param(*case, id=f"{str(case[0])[6:]}-{case[1]}-decay{int(case[2])}-"
                                   f"reset{case[3]}-{type(case[4]).__name__}-"
                                   f"detach{int(case[5])}-store{int(case[6])}")
            for case in cases]


GRID = _grid()


def _config_of(dtype, neuron, decay, v_reset, sg, detach, store):
    return _fused.KernelConfig(dtype, _fused.NEURON_CODES[neuron], decay if neuron != "if" else False,
                               v_reset is not None, detach,
                               _fused.SURROGATE_CODES[type(sg).__name__], store)


@pytest.fixture(scope="module")
def prebuilt(private_cache):
    # build the libraries of the whole grid two at a time (the compiler is single-threaded)
    configs = {_config_of(*p.values) for p in GRID}
    configs |= {_config_of(dtype, neuron, decay, v_reset, SURROGATES[0], False, True)
                for dtype in (torch.float16, torch.bfloat16) for neuron, decay in NEURON_DECAY
                for v_reset in (0.0, None)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(cpp_backend.build_library, sorted(configs, key=repr)))
    return configs


def test_grid_covers_every_option():
    values = [p.values for p in GRID]
    assert {v[1:3] for v in values} == set(NEURON_DECAY)
    assert {(v[0], v[3] is None) for v in values} >= {(d, s) for d in (torch.float32,
                                                                       torch.float64)
                                                      for s in (False, True)}
    for column in (4, 5, 6):
        for dtype in (torch.float32, torch.float64):
            assert len({repr(v[column]) for v in values if v[0] == dtype}) == 2
    # float32: every neuron kind with every reset
    assert {(v[1], v[2], v[3]) for v in values if v[0] == torch.float32} == {
        (n, d, r) for (n, d), r in itertools.product(NEURON_DECAY, RESETS)}


@pytest.mark.parametrize("dtype,neuron,decay_input,v_reset,surrogate_function,detach_reset,"
                         "store_v_seq", GRID)
def test_cpp_matches_torch_backend(prebuilt, dtype, neuron, decay_input, v_reset,
                                   surrogate_function, detach_reset, store_v_seq):
    # the learned step gradient and PLIF's w gradient are checked in every case
    kernel, reference = run_both(_Cpp, dtype=dtype, neuron=neuron, decay_input=decay_input,
                                 v_reset=v_reset, surrogate_function=surrogate_function,
                                 detach_reset=detach_reset, store_v_seq=store_v_seq)
    check_results(kernel, reference, dtype=dtype, neuron=neuron)
    assert kernel["step"].abs() > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("neuron,decay_input", NEURON_DECAY)
@pytest.mark.parametrize("v_reset", [0.0, None])
def test_cpp_16bit_storage(prebuilt, dtype, neuron, decay_input, v_reset):
    kernel, reference = run_both(_Cpp, dtype=dtype, neuron=neuron, decay_input=decay_input,
                                 v_reset=v_reset, surrogate_function=SURROGATES[0],
                                 detach_reset=False, store_v_seq=True)
    check_results(kernel, reference, dtype=dtype, neuron=neuron)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_blocks_and_threads_do_not_change_results(prebuilt, threads):
    # N not a multiple of the block size, several blocks, more than the parallel threshold
    generator = torch.Generator().manual_seed(7)
    x = torch.rand((5, 3 * 256 * 11 + 37), generator=generator, dtype=torch.float64) * 2.4 - 0.6
    x = (x / STEP * 4).round() * (STEP / 4)  # tie-prone
    x = x.float().requires_grad_()
    grad = torch.randn(x.shape, generator=generator)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        outs = []
        for fn in (cpp_quant_neuron_multi_step, reference_multi_step):
            step = torch.tensor(STEP, requires_grad=True)
            spikes, v_last, _ = fn(x, 0.0, neuron="lif", tau=2.0, step=step, qmin=QMIN, qmax=QMAX,
                                   surrogate_function=surrogate.ATan())
            gx, gstep = torch.autograd.grad(spikes, (x, step), grad)
            outs.append((spikes, v_last, gx, gstep))
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    torch.testing.assert_close(outs[0][2], outs[1][2], rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(outs[0][3], outs[1][3], rtol=1e-4, atol=1e-3)
    assert outs[0][0].sum() > 1000


def test_step_not_a_power_of_two_and_tau_three(prebuilt):
    generator = torch.Generator().manual_seed(12)
    x = torch.rand((10, 300), generator=generator) * 2.0 - 0.4
    kernel, reference = run_both(_Cpp, dtype=torch.float32, neuron="lif", decay_input=True,
                                 v_reset=None, surrogate_function=SURROGATES[1],
                                 detach_reset=False, store_v_seq=True, tau=3.0, v_threshold=0.6,
                                 step_value=0.024, qmin=-40, qmax=40, step_grad_scale=0.37,
                                 inputs=(x, torch.zeros(300)))
    check_results(kernel, reference, dtype=torch.float32, neuron="lif")


def test_inference_empty_and_non_contiguous(prebuilt):
    x, v_init = make_inputs(torch.float32, seed=6)
    with torch.no_grad():
        got = cpp_quant_neuron_multi_step(x.transpose(1, 2), 0.25, neuron="plif",
                                          w=torch.tensor(0.3), decay_input=False, v_reset=None,
                                          step=STEP, qmin=QMIN, qmax=QMAX, store_v_seq=True)
    want = reference_multi_step(x.transpose(1, 2).contiguous(), 0.25, neuron="plif",
                                w=torch.tensor(0.3), decay_input=False, v_reset=None,
                                step=STEP, qmin=QMIN, qmax=QMAX, store_v_seq=True)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    spikes, v_last, _ = cpp_quant_neuron_multi_step(torch.zeros(0, 3), torch.full((3,), 0.5),
                                                    neuron="lif", step=STEP, qmin=QMIN, qmax=QMAX)
    assert spikes.shape == (0, 3) and torch.equal(v_last, torch.full((3,), 0.5))


def test_cpu_only():
    with pytest.raises(ValueError, match="x_seq is on meta.*CPU tensors only"):
        cpp_quant_neuron_multi_step(torch.empty(2, 3, device="meta"), 0.0, neuron="if", step=0.5,
                                    qmin=-4, qmax=3)


# ---- the cache ---------------------------------------------------------------------------------

def _lif_config(store=False):
    return _fused.KernelConfig(torch.float32, 1, True, True, False, 0, store)


def test_cache_is_reused_and_keyed(prebuilt, private_cache, monkeypatch):
    config = _lif_config()
    path = cpp_backend.build_library(config)
    assert path.parent == private_cache and path.exists()
    calls = []
    real_run = cpp_backend._run
    monkeypatch.setattr(cpp_backend, "_run", lambda command, **kw: calls.append(command) or
                        real_run(command, **kw))
    assert cpp_backend.build_library(config) == path
    assert calls == []  # found in the cache: no compiler run
    # another configuration, other flags or another compiler identity: another file
    assert cpp_backend.library_path(_lif_config(store=True)) != path
    cpp_backend._compiler_identity.cache_clear()
    monkeypatch.setattr(cpp_backend, "CXX_FLAGS", cpp_backend.CXX_FLAGS + ("-g0",))
    assert cpp_backend.library_path(config) != path
    cpp_backend._compiler_identity.cache_clear()


def test_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("SNNQUANT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cpp_backend.cache_dir() == tmp_path / "xdg" / "snnquant" / "kernels"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cpp_backend.cache_dir() == tmp_path / "home" / ".cache" / "snnquant" / "kernels"


def test_a_second_process_loads_the_cached_library(prebuilt, private_cache):
    cpp_backend.build_library(_lif_config())
    code = textwrap.dedent("""
        import torch
        from snnquant.kernels import cpp_backend
        commands = []
        run = cpp_backend._run
        cpp_backend._run = lambda command, **kw: commands.append(command) or run(command, **kw)
        s, v, _ = cpp_backend.cpp_quant_neuron_multi_step(torch.rand(4, 3) * 2, 0.0, neuron='lif',
                                                          step=0.125, qmin=-12, qmax=11)
        print(int(s.numel()), sum('-shared' in c for c in commands))
    """)
    env = dict(os.environ, SNNQUANT_CACHE_DIR=str(private_cache),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "12 0"  # ran, and compiled nothing


def test_concurrent_builds_from_two_processes(tmp_path):
    # two processes build the same configuration into an empty cache at the same moment: both
    # succeed, agree, and leave one complete library (no partial file)
    code = textwrap.dedent("""
        import sys, time, torch
        from snnquant.kernels import cpp_backend
        while time.time() < float(sys.argv[1]):
            time.sleep(0.005)
        x = torch.linspace(-1, 3, 40).reshape(4, 10)
        s, v, _ = cpp_backend.cpp_quant_neuron_multi_step(x, 0.0, neuron='if', step=0.25,
                                                          qmin=-8, qmax=7, v_reset=None)
        print(s.sum().item(), v.sum().item())
    """)
    import time

    env = dict(os.environ, SNNQUANT_CACHE_DIR=str(tmp_path),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = str(time.time() + 3.0)
    procs = [subprocess.Popen([sys.executable, "-c", code, start], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
             for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0, err
    assert results[0][0] == results[1][0]
    libraries = sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".so")
    assert len(libraries) == 1
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".build-")]
    assert leftovers == []


def test_build_error_shows_the_compiler_output(monkeypatch, tmp_path):
    monkeypatch.setattr(cpp_backend, "CXX_FLAGS", cpp_backend.CXX_FLAGS + ("-DSNQ_BLOCK=nonsense",))
    cpp_backend._compiler_identity.cache_clear()
    try:
        with pytest.raises(cpp_backend.CppBuildError, match="nonsense"):
            cpp_backend.build_library(_lif_config(), directory=tmp_path)
    finally:
        cpp_backend._compiler_identity.cache_clear()
    assert [p for p in tmp_path.iterdir() if p.suffix == ".so"] == []


# ---- compiler present? backend choice ----------------------------------------------------------

def test_a_compiler_is_installed():
    # no skip anywhere in this file: a machine without a C++ compiler fails here first
    assert cpp_backend.cpp_compiler() is not None, cpp_backend.INSTALL_HINT


def test_missing_compiler_is_an_error_saying_what_to_install(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    assert not cpp_backend.cpp_available()
    with pytest.raises(cpp_backend.CppCompilerUnavailableError, match="install g\\+\\+") as info:
        cpp_quant_neuron_multi_step(torch.rand(3, 4), 0.0, neuron="if", step=0.5, qmin=-4,
                                    qmax=3)
    assert "/nonexistent/g++" in str(info.value)
    node = qnn.QuantLIFNode(step_mode="m", v_quant=8, backend="cpp")
    with pytest.raises(RuntimeError, match="install g\\+\\+"):
        node(torch.rand(3, 4))
    # 'auto' falls back to the torch backend
    assert dispatch.resolve_backend("auto", torch.rand(2, 3)) == "torch"
    auto = qnn.QuantLIFNode(step_mode="m", v_quant=8, backend="auto")
    x = torch.rand(4, 3, 5) * 2
    assert torch.equal(auto(x), qnn.QuantLIFNode(step_mode="m", v_quant=8, backend="torch")(x))


def test_default_backend_is_auto_and_runs_cpp_on_cpu(prebuilt):
    assert dispatch.DEFAULT_BACKEND == "auto"
    node = qnn.QuantLIFNode(step_mode="m", v_quant=8)
    assert node.backend == "auto" and QuantConfig().backend == "auto"
    x = torch.rand(4, 3, 5, requires_grad=True) * 2
    y = node(x)
    assert type(y.grad_fn.next_functions[0][0]).__name__ == "FusedQuantNeuronFunctionBackward"
    assert torch.equal(y, qnn.QuantLIFNode(step_mode="m", v_quant=8, backend="torch")(x))


def test_resolve_backend():
    x = torch.rand(2, 3)
    assert dispatch.resolve_backend("auto", x) == "cpp"
    assert dispatch.resolve_backend("auto", x, surrogate.Sigmoid()) == "cpp"
    assert dispatch.resolve_backend("auto", x, surrogate.PiecewiseQuadratic()) == "torch"
    assert dispatch.resolve_backend("auto", x.to(torch.int32)) == "torch"
    assert dispatch.resolve_backend("auto", torch.empty(2, device="meta")) == "torch"
    for name in ("torch", "cupy", "cpp"):
        assert dispatch.resolve_backend(name, x) == name
    with pytest.raises(ValueError, match="backend must be one of .*'numba'"):
        dispatch.resolve_backend("numba", x)


# ---- through the modules -----------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cpp", "auto"])
def test_quant_lif_node_cpp_matches_torch(prebuilt, backend):
    x = (torch.rand(6, 4, 33) * 2).requires_grad_()
    results = []
    for name in (backend, "torch"):
        node = qnn.QuantLIFNode(step_mode="m", v_quant=8, backend=name, store_v_seq=True)
        xi = x.detach().clone().requires_grad_()
        spikes = node(xi)
        (spikes * torch.linspace(-1, 1, spikes.numel()).reshape(spikes.shape)).sum().backward()
        results.append((spikes, node.v, node.v_seq, xi.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1]) and torch.equal(results[0][2], results[1][2])
    torch.testing.assert_close(results[0][3], results[1][3], rtol=2e-5, atol=2e-5)


def test_lsq_membrane_step_learns_through_cpp(prebuilt):
    grads = []
    for backend in ("cpp", "torch"):
        torch.manual_seed(3)
        node = qnn.QuantLIFNode(step_mode="m", backend=backend, surrogate_function=surrogate.ATan(),
                                v_quant=qnn.LSQQuantizer(8))
        x = torch.rand(5, 2, 40) * 2
        node(x).sum().backward()
        (step_param,) = [p for p in node.v_quant.parameters() if p.requires_grad]
        grads.append(step_param.grad.clone())
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)


def test_cpp_backend_refuses_cuda_like_tensors_and_no_grid():
    node = qnn.QuantLIFNode(step_mode="m", v_quant=8, backend="cpp")
    with pytest.raises(ValueError, match="x is on meta.*CPU tensors only"):
        node(torch.empty(2, 3, device="meta"))
    with pytest.raises(ValueError, match="backend='cpp'.*v_quant"):
        qnn.QuantLIFNode(step_mode="m", backend="cpp")(torch.rand(2, 3))
    with pytest.raises(ValueError, match="uniform"):
        qnn.QuantLIFNode(step_mode="m", backend="cpp",
                         v_quant=qnn.StateQuant(num_bits=4))(torch.rand(2, 3))


def test_quantize_model_and_example_accept_cpp_and_auto(prebuilt):
    from spikingjelly.activation_based import layer, neuron

    for backend in ("cpp", "auto"):
        net = torch.nn.Sequential(layer.Linear(8, 6),
                                  neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan()))
        sjf.set_step_mode(net, "m")
        quant, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8, backend=backend))
        assert quant[1].backend == backend
        quant(torch.rand(3, 2, 8)).sum().backward()
    with pytest.raises(ValueError, match="backend"):
        QuantConfig(backend="numba")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    example = subprocess.run([sys.executable, "-m", "snnquant", "train", "--help"],
                             capture_output=True, text=True, cwd=REPO, timeout=120, env=env)
    assert example.returncode == 0, example.stderr
    assert "cpp" in example.stdout and "auto" in example.stdout


def test_compiler_without_openmp_builds_single_threaded(monkeypatch, tmp_path):
    # a compiler that refuses -fopenmp (Apple's clang): the flag is left out, the build works
    real = cpp_backend.cpp_compiler()
    wrapper = tmp_path / "no-openmp-c++"
    wrapper.write_text("#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = -fopenmp ] && "
                       "{ echo 'unsupported option -fopenmp' >&2; exit 1; }; done\n"
                       f"exec {real} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    cpp_backend._compiler_identity.cache_clear()
    try:
        flags, identity = cpp_backend._compiler_identity(str(wrapper))
        assert "-fopenmp" not in flags and "no OpenMP" in identity
        path = cpp_backend.build_library(_lif_config(), directory=tmp_path / "cache")
        library = cpp_backend.KernelLibrary(path)
        x = torch.rand(4, 50) * 2
        spikes = torch.empty_like(x)
        v_last = torch.empty(50)
        v_init = torch.zeros(50)  # kept alive: the library reads it through a raw pointer
        step = torch.tensor([STEP])
        scalars = _fused.KernelScalars(tau=2.0, v_threshold=1.0, v_reset=0.0, qmin=float(QMIN),
                                       qmax=float(QMAX), alpha=4.0, step_grad_scale=1.0)
        library.forward(_lif_config(), 4, 50, x, v_init, step, None, spikes, v_last, None, None,
                        scalars)
        # a library holds one configuration: another is refused, nothing runs
        with pytest.raises(RuntimeError, match="rejected the configuration"):
            library.forward(_lif_config(store=True), 4, 50, x, v_init, step, None, spikes,
                            v_last, v_last, None, scalars)
        want = reference_multi_step(x, 0.0, neuron="lif", step=STEP, qmin=QMIN, qmax=QMAX)
        assert torch.equal(spikes, want[0]) and torch.equal(v_last, want[1])
    finally:
        cpp_backend._compiler_identity.cache_clear()


# ---- a cache that cannot be trusted or written (issue 24) --------------------------------------

def test_damaged_or_foreign_library_is_rebuilt_before_loading(tmp_path, monkeypatch):
    # a library cut to 0-80% of its length (or another one put in its place) is detected from
    # the SHA-256 recorded at build time and rebuilt; nothing is loaded here, so a detection
    # that failed could not crash this process
    config, other = _lif_config(), _lif_config(store=True)
    path = cpp_backend.build_library(config, directory=tmp_path)
    good = path.read_bytes()
    assert cpp_backend._checksum_path(path).exists() and cpp_backend.library_is_intact(path)
    foreign = cpp_backend.build_library(other, directory=tmp_path).read_bytes()
    compiles = []
    real_run = cpp_backend._run
    monkeypatch.setattr(cpp_backend, "_run", lambda command, **kw: compiles.append(command) or
                        real_run(command, **kw))
    for damaged in [good[:int(len(good) * f)] for f in (0.0, 0.01, 0.2, 0.5, 0.8)] + [foreign]:
        path.write_bytes(damaged)
        assert not cpp_backend.library_is_intact(path)
        compiles.clear()
        assert cpp_backend.build_library(config, directory=tmp_path) == path
        assert cpp_backend.library_is_intact(path) and len(path.read_bytes()) == len(good)
        assert sum("-shared" in command for command in compiles) == 1
    # a library without its record is not trusted either
    cpp_backend._checksum_path(path).unlink()
    compiles.clear()
    cpp_backend.build_library(config, directory=tmp_path)
    assert sum("-shared" in command for command in compiles) == 1


def test_cut_library_in_the_cache_runs_after_a_rebuild_without_crashing(tmp_path):
    # end to end, in a fresh process (a cut library loaded would end it with "Bus error")
    code = textwrap.dedent("""
        import torch
        from snnquant.kernels import cpp_backend
        x = torch.linspace(-1, 3, 40).reshape(4, 10)
        s, v, _ = cpp_backend.cpp_quant_neuron_multi_step(x, 0.0, neuron='if', step=0.25,
                                                          qmin=-8, qmax=7)
        print(int(s.sum().item()))
    """)
    env = dict(os.environ, SNNQUANT_CACHE_DIR=str(tmp_path),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                           cwd=REPO, timeout=300)
    assert first.returncode == 0, first.stderr
    (library,) = [p for p in tmp_path.iterdir() if p.suffix == ".so"]
    size = library.stat().st_size
    with open(library, "r+b") as handle:
        handle.truncate(size // 2)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, cwd=REPO, timeout=300)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    assert library.stat().st_size == size and cpp_backend.library_is_intact(library)


def test_library_is_fsynced_before_its_rename(tmp_path, monkeypatch):
    import snnquant._io as io_module

    events = []
    real_fsync, real_replace = io_module.os.fsync, io_module.os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")
                       if os.path.exists(f"/proc/self/fd/{fd}") else str(fd)))
        return real_fsync(fd)

    def replace(source, target):
        events.append(("replace", str(target)))
        return real_replace(source, target)

    monkeypatch.setattr(io_module.os, "fsync", fsync)
    monkeypatch.setattr(io_module.os, "replace", replace)
    path = cpp_backend.build_library(_lif_config(), directory=tmp_path)
    renamed = events.index(("replace", str(path)))
    synced = [i for i, (kind, name) in enumerate(events)
              if kind == "fsync" and name.startswith(str(path) + ".tmp-")]
    assert synced and synced[0] < renamed


def test_killed_builds_leave_nothing_for_long(tmp_path):
    from snnquant import _io

    config = _lif_config()
    target = cpp_backend.library_path(config, directory=tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    host = _io.host_name()
    # what a build killed during the compile leaves: the compiler's output under a temporary
    # name (this version compiles from stdin, without a folder) ...
    stale_file = tmp_path / f"snnquant_neuron_other.so.tmp-{host}-{dead}-0123abcd"
    stale_file.write_bytes(b"\x7fELF partial")
    live_file = tmp_path / f"snnquant_neuron_other.so.tmp-{host}-{os.getpid()}-89abcdef"
    live_file.write_bytes(b"\x7fELF a build under way")
    # ... and earlier versions' build folders
    old_dir, recent_dir = tmp_path / ".build-x1y2z3", tmp_path / ".build-a4b5c6"
    for folder in (old_dir, recent_dir):
        folder.mkdir()
        (folder / "entry.cpp").write_text("// partial\n")
    old = time.time() - 2 * cpp_backend.STALE_SECONDS
    os.utime(old_dir, (old, old))
    cpp_backend.build_library(config, directory=tmp_path)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert stale_file.name not in left and old_dir.name not in left
    assert live_file.name in left and recent_dir.name in left
    assert target.name in left and target.name + ".sha256" in left
    assert not [name for name in left if ".tmp-" in name and str(os.getpid()) not in name]


@pytest.fixture(params=["cache-dir-is-a-file", "xdg-under-sys"])
def unwritable_cache(request, tmp_path, monkeypatch):
    """An environment whose kernel cache folder cannot be written; yields that folder."""
    if request.param == "cache-dir-is-a-file":
        folder = tmp_path / "not-a-folder"
        folder.write_text("")
        variable, value = "SNNQUANT_CACHE_DIR", str(folder)
    else:
        variable, value, folder = "XDG_CACHE_HOME", "/sys/fs", Path("/sys/fs/snnquant/kernels")
        if cpp_backend.cache_problem(folder) is None:
            pytest.skip("/sys/fs is writable here")
    monkeypatch.delenv("SNNQUANT_CACHE_DIR", raising=False)
    monkeypatch.setenv(variable, value)
    cpp_backend._warn_once.cache_clear()
    return str(folder)


def test_unwritable_cache_auto_falls_back_with_one_warning(unwritable_cache):
    import warnings

    x = torch.rand(4, 3, 5) * 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        node = qnn.QuantLIFNode(step_mode="m", v_quant=8)  # backend='auto'
        y = node(x)
        node.reset()
        node(x)
        qnn.QuantLIFNode(step_mode="m", v_quant=8)(x)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert unwritable_cache in messages[0] and "SNNQUANT_CACHE_DIR" in messages[0]
    assert dispatch.resolve_backend("auto", x) == "torch"
    assert torch.equal(y, qnn.QuantLIFNode(step_mode="m", v_quant=8, backend="torch")(x))


def test_unwritable_cache_cpp_is_one_clear_error(unwritable_cache):
    node = qnn.QuantLIFNode(step_mode="m", v_quant=8, backend="cpp")
    with pytest.raises(cpp_backend.KernelCacheError) as info:
        node(torch.rand(4, 3, 5))
    assert unwritable_cache in str(info.value) and "SNNQUANT_CACHE_DIR" in str(info.value)
    with pytest.raises(cpp_backend.KernelCacheError, match="SNNQUANT_CACHE_DIR"):
        cpp_quant_neuron_multi_step(torch.rand(3, 4), 0.0, neuron="if", step=0.5, qmin=-4,
                                    qmax=3)


def test_data_cache_follows_xdg_cache_home_as_the_kernel_cache(monkeypatch, tmp_path):
    from snnquant.datasets.digits import default_data_dir

    monkeypatch.delenv("SNNQUANT_DATA", raising=False)
    monkeypatch.delenv("SNNQUANT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_data_dir() == tmp_path / "xdg" / "snnquant"
    assert cpp_backend.cache_dir().parent == default_data_dir()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_data_dir() == tmp_path / "home" / ".cache" / "snnquant"
    monkeypatch.setenv("SNNQUANT_DATA", str(tmp_path / "data"))
    assert default_data_dir() == tmp_path / "data"


def test_backend_is_resolved_once_and_again_when_the_device_or_backend_changes(
        monkeypatch):
    from snnquant.nn import neurons

    calls = []
    real = neurons.select_backend
    monkeypatch.setattr(neurons, "select_backend",
                        lambda *args: calls.append(args[0]) or real(*args))
    node = qnn.QuantLIFNode(step_mode="m", v_quant=8, backend="cpp")
    x = torch.rand(4, 3, 5, requires_grad=True) * 2
    for _ in range(3):
        node.reset()
        y = node(x)
    assert calls == ["cpp"]  # three forwards, one resolution
    assert type(y.grad_fn.next_functions[0][0]).__name__ == "FusedQuantNeuronFunctionBackward"
    with pytest.raises(ValueError, match="x is on meta.*CPU tensors only"):
        node(torch.empty(4, 3, 5, device="meta"))  # another device: resolved (and refused) again
    node.reset()
    node(x)
    node.backend = "torch"  # another backend: resolved again
    node.reset()
    y = node(x)
    assert type(y.grad_fn).__name__ == "QuantNeuronFunctionBackward"
    assert calls == ["cpp", "cpp", "torch"]  # the refused device left the CPU choice in place


def test_a_copied_neuron_resolves_its_backend_where_it_runs(monkeypatch):
    # the choice is not carried by deepcopy or torch.save: a machine without a compiler runs
    # the torch backend for a neuron saved where 'auto' meant 'cpp'
    import copy
    import io

    node = qnn.QuantLIFNode(step_mode="m", v_quant=8)
    x = torch.rand(4, 3, 5, requires_grad=True) * 2
    assert type(node(x).grad_fn.next_functions[0][0]).__name__ == \
        "FusedQuantNeuronFunctionBackward"
    node.reset()
    buffer = io.BytesIO()
    torch.save(node, buffer)
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    for copied in (copy.deepcopy(node), torch.load(io.BytesIO(buffer.getvalue()),
                                                   weights_only=False)):
        assert type(copied(x).grad_fn).__name__ == "QuantNeuronFunctionBackward"


def test_library_that_does_not_load_is_rebuilt_once_then_named(tmp_path, monkeypatch):
    """Issue 35 §6: a library replaced together with its .sha256 (so it looks intact) gave raw
    loader errors (invalid ELF header, undefined symbol); it is rebuilt once, and a second
    failure is a KernelCacheError naming the file."""
    import hashlib

    from snnquant.kernels._fused import KernelCache
    monkeypatch.setenv("SNNQUANT_CACHE_DIR", str(tmp_path))
    config = _lif_config()
    path = cpp_backend.build_library(config)
    assert path.parent == tmp_path
    good = path.read_bytes()
    other = tmp_path / "other.so"
    subprocess.run([cpp_backend.cpp_compiler(), "-shared", "-fPIC", "-x", "c++", "-", "-o",
                    str(other)], input="extern \"C\" int unrelated(void) { return 1; }",
                   text=True, check=True)

    def plant(data):   # a new file (never rewrite a mapped library in place: SIGBUS)
        (tmp_path / "planted").write_bytes(data)
        os.replace(tmp_path / "planted", path)
        cpp_backend._checksum_path(path).write_text(hashlib.sha256(data).hexdigest() + "\n")
        assert cpp_backend.library_is_intact(path)

    for foreign in (b"not a library at all" * 50, other.read_bytes()):
        plant(foreign)
        library = cpp_backend.CppLauncher(KernelCache()).library(config)
        assert path.read_bytes() == good and cpp_backend.library_is_intact(path)
        assert hasattr(library._lib, "snq_cpu_forward")
        cpp_backend._close(library._lib)  # as a new process finds it: not loaded yet
    # a build that keeps producing something that does not load: named, not a raw OSError
    real = cpp_backend.compile_into_cache

    def broken(target, *args, **kwargs):
        real(target, *args, **kwargs)
        plant(b"still not a library" * 50)
        return target
    monkeypatch.setattr(cpp_backend, "compile_into_cache", broken)
    with pytest.raises(cpp_backend.KernelCacheError,
                       match=rf"the cached library {re.escape(str(path))} does not load even "
                             rf"after it was rebuilt \(.*\); remove it, or set SNNQUANT_CACHE_DIR"):
        cpp_backend.CppLauncher(KernelCache()).library(config)
