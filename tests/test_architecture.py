"""The architecture contract: one quantizer interface (Grid), hand-built layers equal to
quantize_model's, configuration-checked state dicts, a hot path without host synchronisation that
compiles, and any positive threshold exported exactly."""
import ast
import gc
import pathlib

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

import snnquant
import snnquant.nn as qnn
from snnquant import QuantConfig, quantize_model
from snnquant.export import ExportError, compare_integer, integer_agreement, to_integer
from snnquant.nn import Grid, QuantizerBase
from conftest import assert_no_host_reads

# The source the scans read: the package these tests import (a clone's snnquant/ or an installed
# wheel's), never a folder guessed from where the tests are.
PACKAGE = pathlib.Path(snnquant.__file__).resolve().parent


def _sources():
    """Every .py file of the package; refuses to let a scan pass over nothing."""
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20 and (PACKAGE / "convert.py") in files, \
        f"no snnquant source to scan under {PACKAGE} (found {len(files)} files)"
    return files


def _where(path, line):
    return f"{path.relative_to(PACKAGE.parent)}:{line}"


# ------------------------------------------------------------------------------------------------
# one interface


class HalfStepQuantizer(QuantizerBase):
    """A quantizer the package does not know: a fixed signed grid with step 2^-3, 5 bits."""

    def __init__(self, step_mode="s"):
        super().__init__(step_mode)
        self.register_buffer("step", torch.tensor(0.125))

    def quantize(self, x):
        return snnquant.functional.lsq_quantize(x, self.step.to(x.dtype), -16, 15)

    def grid(self):
        return Grid(self.step, -16, 15, None, True)


def test_new_quantizer_outside_the_package_exports_exactly():
    torch.manual_seed(0)
    net = nn.Sequential(
        qnn.QuantLinear(12, 8, bias=False, weight_quant=HalfStepQuantizer(), step_mode="m"),
        qnn.QuantIFNode(v_quant=8, step_mode="m"),
        qnn.QuantLinear(8, 4, bias=False, weight_quant=HalfStepQuantizer(), step_mode="m"),
        qnn.QuantLIFNode(tau=2.0, v_quant=8, step_mode="m"),
    ).eval()
    with torch.no_grad():
        for m in net:
            if hasattr(m, "weight"):
                m.weight.uniform_(-1.5, 1.5)
    x = torch.randint(0, 3, (6, 16, 12)).float()
    desc = to_integer(net)
    assert desc.layer("0").weight_bits == 5  # [-16, 15] from its grid (it has no num_bits)
    assert float(desc.layer("0").weight_scale[0]) == 0.125
    report = compare_integer(net, x, desc)
    assert report.exact and report.samples == 1.0
    assert int(report_spikes(net, x)) > 0  # the network does something


def report_spikes(net, x):
    sjf.reset_net(net)
    with torch.no_grad():
        out = net(x)
    sjf.reset_net(net)
    return out.sum()


def test_every_quantizer_describes_its_grid():
    lsq = qnn.LSQQuantizer(4, per_channel=True, num_channels=3, power_of_two=True)
    lsq.ensure_initialized(torch.randn(3, 5))
    g = lsq.grid()
    assert isinstance(g, Grid) and g.channel_dim == 0 and g.power_of_two and g.step.shape == (3,)
    assert (g.qmin, g.qmax) == (-8, 7) and lsq.is_initialized
    u = qnn.UniformQuantizer(6, step=0.25).grid()
    assert u.per_tensor and u.power_of_two and (u.qmin, u.qmax) == (-32, 31)
    assert not qnn.UniformQuantizer(6, step=0.3).grid().power_of_two
    mm = qnn.MinMaxQuantizer(4, symmetric=True)
    assert mm.grid() is None and not mm.is_initialized
    mm.ensure_initialized(torch.tensor([-1.0, 0.5]))
    assert mm.is_initialized and mm.grid().qmin == -7 and mm.grid().qmax == 7
    sq = qnn.StateQuant(num_bits=3).grid()
    assert sq.step is None and sq.levels.numel() == 8 and not sq.is_uniform
    assert qnn.QuantizedBits(4).grid().power_of_two
    assert qnn.Round().grid() is None and qnn.Round().is_initialized
    with pytest.raises(Exception):
        g.qmin = 0  # frozen


def _quantizer_class_names():
    """Every class of snnquant/nn/quantizers/ (observers included) and every QuantizerBase
    subclass of the package, read from the code."""
    import importlib
    import inspect
    import pkgutil

    import snnquant.nn.quantizers as package
    names = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        names |= {n for n, c in vars(module).items()
                  if inspect.isclass(c) and c.__module__ == module.__name__}
    todo = [QuantizerBase]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("snnquant.nn.quantizers"):
            names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names - {"QuantizerBase", "Grid"}  # the interface itself may be asked for


def test_no_isinstance_on_quantizer_classes_outside_their_package():
    names = _quantizer_class_names()
    assert {"BinaryQuantizer", "TernaryQuantizer", "MinMaxObserver", "LSQQuantizer",
            "UniformQuantizer", "Round"} <= names  # the list comes from the code, not from here
    offenders = []
    for path in _sources():
        if "quantizers" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                used = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} | \
                       {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
                if used & names:
                    offenders.append(_where(path, node.lineno))
    assert not offenders, offenders


def test_no_private_cross_module_imports():
    offenders = []
    for path in _sources():
        if "datasets" in path.parts:  # not part of the quantization architecture
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        offenders.append(f"{_where(path, node.lineno)} {alias.name}")
    assert not offenders, offenders


def test_moved_names_stay_importable():
    with pytest.warns(DeprecationWarning, match=r"from snnquant import summary"):
        from snnquant.convert import summary as s1
    from snnquant.nn.quantizers import LSQQuantizer, check_bits  # noqa: F401
    from snnquant.summary import Summary, summary
    assert s1 is summary and snnquant.summary is summary and snnquant.Summary is Summary
    assert snnquant.copy_model is snnquant.utils.copy_model
    from snnquant.functional import _validation
    # one bit-width check with one signature (the functional-side check_bits(fn, name, value) is gone)
    assert check_bits is snnquant.functional.check_bit_width and not hasattr(_validation, "check_bits")
    from snnquant.nn.neurons import make_membrane_quantizer, uniform_membrane_step
    assert make_membrane_quantizer is qnn.quantizers.make_membrane_quantizer
    assert uniform_membrane_step is qnn.uniform_membrane_step
    from snnquant.convert import MEMBRANE_QUANTIZERS
    assert MEMBRANE_QUANTIZERS == ("uniform", "threshold_centered", "lsq")


# ------------------------------------------------------------------------------------------------
# one set of defaults


def test_hand_built_layer_equals_quantize_model_layer_and_exports():
    torch.manual_seed(0)
    hand = qnn.QuantLinear(16, 10, weight_quant=4)
    made, _ = quantize_model(nn.Sequential(nn.Linear(16, 10)), QuantConfig(weight_bits=4))
    made = made[0]
    assert hand.weight_quant.config() == made.weight_quant.config()
    assert hand.bias_quant.config() == made.bias_quant.config()
    assert hand.bias_quant.num_bits == 16 and hand.weight_quant.power_of_two
    assert qnn.QuantLinear(4, 2, weight_quant=4, bias_quant=None).bias_quant is None
    assert qnn.QuantLinear(4, 2, weight_quant=None).bias_quant is None
    assert qnn.QuantLinear(4, 2, bias=False, weight_quant=4).bias_quant is None
    net = nn.Sequential(qnn.QuantLinear(16, 10, weight_quant=4, step_mode="m"),
                        qnn.QuantIFNode(v_quant=8, step_mode="m")).eval()
    x = torch.randint(0, 2, (4, 8, 16)).float()
    assert integer_agreement(net, x) == 1.0


# ------------------------------------------------------------------------------------------------
# state_dict configuration


def _lin(**kw):
    return nn.Sequential(qnn.QuantLinear(4, 8, weight_quant=qnn.LSQQuantizer(4, **kw)))


@pytest.mark.parametrize("strict", [True, False])
def test_state_dict_per_channel_into_per_tensor_is_refused(strict):
    src = _lin(per_channel=True, num_channels=8)
    src[0].weight_quant.ensure_initialized(src[0].weight)
    with pytest.raises(ValueError, match=r"'0\.weight_quant'.*per_channel=True.*per_channel=False"):
        _lin().load_state_dict(src.state_dict(), strict=strict)
    with pytest.raises(ValueError, match=r"'0\.weight_quant'.*per_channel=False.*per_channel=True"):
        _lin(per_channel=True, num_channels=8).load_state_dict(_lin().state_dict(), strict=strict)


@pytest.mark.parametrize("strict", [True, False])
def test_state_dict_lsq_into_lsq_pow2_is_refused(strict):
    with pytest.raises(ValueError, match=r"'0\.weight_quant'.*power_of_two=False.*power_of_two=True"):
        _lin(power_of_two=True).load_state_dict(_lin().state_dict(), strict=strict)
    with pytest.raises(ValueError, match=r"signed=False.*signed=True"):
        _lin().load_state_dict(_lin(signed=False).state_dict(), strict=strict)
    mm = nn.Sequential(qnn.QuantLinear(4, 8, weight_quant=qnn.MinMaxQuantizer(4)))
    with pytest.raises(ValueError, match=r"saved with a MinMaxQuantizer.*kind='LSQQuantizer'"):
        _lin().load_state_dict(mm.state_dict(), strict=strict)


def test_state_dict_same_config_loads_and_old_state_dicts_still_load():
    src = _lin(power_of_two=True)
    src(torch.randn(2, 4))
    dst = _lin(power_of_two=True)
    dst.load_state_dict(src.state_dict())
    assert torch.equal(dst[0].weight_quant.step, src[0].weight_quant.step)
    old = {k: v for k, v in src.state_dict().items() if not k.endswith("quant_config")}
    _lin(power_of_two=True).load_state_dict(old)  # saved before configurations were stored


def test_observer_statistics_follow_model_dtype_after_load():
    q32 = qnn.MinMaxQuantizer(4)
    q32(torch.randn(10))
    q64 = qnn.MinMaxQuantizer(4).double()
    q64.load_state_dict(q32.state_dict())
    assert q64.min_val.dtype == torch.float64 and q64.max_val.dtype == torch.float64
    q64.train()
    q64(torch.randn(10, dtype=torch.float64))
    assert q64.min_val.dtype == torch.float64


# ------------------------------------------------------------------------------------------------
# any threshold exports exactly


def test_uniform_membrane_step_is_a_power_of_two():
    from snnquant.nn import uniform_membrane_step
    for vth in (1.0, 0.5, 4.0):
        for bits in (4, 8, 12):
            assert uniform_membrane_step(vth, bits) == vth * 2.0 ** (2 - bits)  # unchanged rule
    for vth in (1.3, 0.7, 3.3, 1e-3):
        s = uniform_membrane_step(vth, 8)
        assert s == 2.0 ** round(__import__("math").log2(s))
        assert 128 * s >= 2 * vth > 64 * s  # smallest power of two that covers [-2Vth, 2Vth)
    q = qnn.QuantLIFNode(v_threshold=1.3, v_quant=8).v_quant
    cfg_q = quantize_model(nn.Sequential(neuron.LIFNode(v_threshold=1.3)),
                           QuantConfig(weight_bits=None, v_bits=8))[0][0].v_quant
    assert float(q.step) == float(cfg_q.step) == 2.0 ** -5


@pytest.mark.parametrize("soft", [False, True])
def test_threshold_1_3_lif_tau_4_exports_exactly(soft):
    torch.manual_seed(3)
    net = nn.Sequential(layer.Linear(20, 12, step_mode="m"),
                        neuron.LIFNode(tau=4.0, v_threshold=1.3, v_reset=None if soft else 0.0,
                                      step_mode="m"),
                        layer.Linear(12, 5, step_mode="m"),
                        neuron.LIFNode(tau=4.0, v_threshold=1.3, step_mode="m"))
    with torch.no_grad():
        net[0].weight.mul_(6.0)
        net[2].weight.mul_(8.0)
    model, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    x = torch.randint(0, 3, (8, 32, 20)).float()
    model.train()
    model(x)
    sjf.reset_net(model)
    model.eval()
    desc = to_integer(model)
    report = compare_integer(model, x, desc)
    assert report.exact and report.samples == 1.0, str(report)
    assert int(report_spikes(model, x)) > 0


# ------------------------------------------------------------------------------------------------
# to_integer messages


def _two_layer(cfg):
    torch.manual_seed(0)
    net = nn.Sequential(layer.Linear(10, 6, step_mode="m"), neuron.IFNode(step_mode="m"),
                        layer.Linear(6, 4, step_mode="m"), neuron.IFNode(step_mode="m"))
    model, _ = quantize_model(net, cfg)
    model(torch.rand(3, 4, 10))
    sjf.reset_net(model)
    return model.eval()


def test_lsq_per_channel_weights_blame_the_weight_step_not_the_bias():
    cfg = QuantConfig(weight_bits=2, weight_quantizer="lsq", per_channel=True, v_bits=8,
                      overrides={"0": {"weight_quantizer": "lsq_pow2"}})
    model = _two_layer(cfg)
    with torch.no_grad():
        model[2].bias.fill_(3.0)  # a bias that is exact on the weight grid (16 bits are set)
    with pytest.raises(ExportError) as info:
        to_integer(model)
    text = str(info.value)
    assert "layer '2'" in text and "weight step" in text and "not a power of two" in text
    assert "lsq_pow2" in text and "bias_bits" not in text


def test_lsq_membrane_does_not_advise_a_power_of_two_threshold():
    model = _two_layer(QuantConfig(weight_bits=4, v_bits=8, membrane_quantizer="lsq"))
    with pytest.raises(ExportError) as info:
        to_integer(model)
    text = str(info.value)
    assert "membrane step" in text and "learned" in text
    assert "v_threshold" not in text


# ------------------------------------------------------------------------------------------------
# the hot path




def _csnn(v_quant_2=None):
    torch.manual_seed(0)
    return nn.Sequential(
        qnn.QuantConv2d(1, 4, 3, padding=1, weight_quant=4, step_mode="m"),
        layer.BatchNorm2d(4, step_mode="m"),
        qnn.QuantLIFNode(tau=2.0, v_quant=8, step_mode="m"),
        layer.MaxPool2d(2, step_mode="m"),
        layer.Flatten(step_mode="m"),
        qnn.QuantLinear(4 * 4 * 4, 10, weight_quant=4, step_mode="m"),
        qnn.QuantParametricLIFNode(v_quant=v_quant_2 or qnn.LSQQuantizer(8), step_mode="m"),
    )


@pytest.mark.parametrize("membrane", ["lsq", "minmax"])
def test_training_step_reads_nothing_on_the_host(membrane):
    net = _csnn(qnn.MinMaxQuantizer(8) if membrane == "minmax" else None)
    assert_no_host_reads(net, torch.rand(3, 2, 1, 8, 8))


def test_compiled_csnn_has_no_graph_break_and_equals_eager():
    net = _csnn()
    x = torch.rand(2, 2, 1, 8, 8)
    net(x)  # initialise the LSQ steps
    sjf.reset_net(net)
    # SpikingJelly's reset_net keeps a global WeakKeyDictionary of networks; traced inside the
    # compiled function, its guards index that dictionary and fail (StopIteration) when another
    # test's network is collected in between: the reset stays outside what is compiled
    gc.collect()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled_net = _csnn()
    compiled_net.load_state_dict(net.state_dict())
    compiled = torch.compile(compiled_net, backend="aot_eager", fullgraph=True)
    sjf.reset_net(net)
    out_eager = net(x)
    out_eager.sum().backward()
    sjf.reset_net(compiled_net)
    out_compiled = compiled(x)
    out_compiled.sum().backward()
    # fullgraph=True already raises on a break; the counters say it in so many words
    assert dict(torch._dynamo.utils.counters["graph_break"]) == {}
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    torch.testing.assert_close(out_compiled, out_eager, rtol=0, atol=0)
    for (name, p), (_, pc) in zip(net.named_parameters(), compiled_net.named_parameters()):
        assert (p.grad is None) == (pc.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(pc.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------------------
# quantized weights: once per forward, cached in eval mode


class _CountingQuantizer(HalfStepQuantizer):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def quantize(self, x):
        self.calls += 1
        return super().quantize(x)


def test_weights_quantized_once_per_forward_and_cached_in_eval():
    q = _CountingQuantizer()
    lin = qnn.QuantLinear(4, 3, weight_quant=q, bias_quant=None, step_mode="m")
    x = torch.rand(5, 2, 4)
    lin(x)
    assert q.calls == 1  # not once per time step
    lin.eval()
    with torch.no_grad():
        y1 = lin(x)
        lin(x)
        assert q.calls == 2  # cached
        lin.weight.add_(1.0)  # the weight changed: quantize again
        y2 = lin(x)
        assert q.calls == 3 and not torch.equal(y1, y2)
        q.step.fill_(0.25)  # the step changed
        lin(x)
        assert q.calls == 4
    lin(x)  # with autograd: never served from the cache
    assert q.calls == 5


# ------------------------------------------------------------------------------------------------
# small things once


@pytest.mark.parametrize("kind", ["uniform", "threshold_centered", "lsq"])
def test_one_membrane_quantizer_factory(kind):
    from snnquant.nn.quantizers import make_membrane_quantizer
    made, _ = quantize_model(nn.Sequential(neuron.LIFNode(v_threshold=0.75)),
                             QuantConfig(weight_bits=None, v_bits=6, membrane_quantizer=kind))
    hand = make_membrane_quantizer(6, 0.75, kind)
    assert type(made[0].v_quant) is type(hand) and made[0].v_quant.config() == hand.config()
    if kind == "uniform":
        assert float(made[0].v_quant.grid().step) == float(hand.grid().step) == 2.0 ** -4
    assert qnn.QuantLIFNode(v_threshold=0.75, v_quant=6).v_quant.config() == \
        make_membrane_quantizer(6, 0.75).config()
    with pytest.raises(ValueError, match="kind"):
        make_membrane_quantizer(6, 0.75, "exponential")


def test_one_bit_width_check_everywhere():
    import numpy as np
    from snnquant.convert import QuantConfigTypeError
    from snnquant.functional import BitWidthTypeError
    with pytest.raises(QuantConfigTypeError, match=r"weight_bits.*4\.0.*float"):
        QuantConfig(weight_bits=4.0)
    with pytest.raises(ValueError, match=r"v_bits must be None or an int in \[2, 32\], got 1"):
        QuantConfig(v_bits=1)
    cfg = QuantConfig(weight_bits=np.int64(4))  # the one check accepts any integer, stored as int
    assert type(cfg.weight_bits) is int and cfg.weight_bits == 4
    for make in (lambda: qnn.LSQQuantizer(2.5), lambda: snnquant.functional.check_bit_width("8"),
                 lambda: snnquant.functional.state_quant(num_bits=3.0)):
        with pytest.raises(BitWidthTypeError):
            make()
    with pytest.raises(TypeError):
        qnn.UniformQuantizer(True, step=0.5)
    assert snnquant.functional.pow2_exponent(0.25) == -2
    assert snnquant.functional.pow2_exponent(0.3) is None
    assert snnquant.functional.pow2_exponent(1) is None  # an int is not a float step


# ------------------------------------------------------------------------------------------------
# the floors (docs/architecture.rst), read from the real imports

#: Bottom to top. A part imports only parts on lower floors (and the infrastructure, which
#: imports no other part); ``datasets`` stands beside the stack and imports none of it.
FLOORS = (
    ("functional",),
    ("kernels",),
    ("nn",),
    ("utils",),
    ("capture",),
    ("targets",),
    ("export", "measure"),
    ("deployability",),
    ("convert",),
    ("summary", "calibrate", "sensitivity", "distill", "lower_bits"),
)
#: The command line stands on top of everything (datasets included); no part imports it.
APPLICATIONS = ("cli", "__main__")
INFRASTRUCTURE = ("_io", "_filelock", "_paths", "_version")
#: The one import between parts of one floor: sensitivity *is* post-training quantization of one
#: layer at a time, so it runs calibrate on each candidate.
SAME_FLOOR = {("sensitivity", "calibrate")}


def _module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph():
    """``{module: {(imported snnquant module, line)}}`` from every import statement of the
    package, at the top of a file or inside a function (a late import is still a dependency)."""
    files = _sources()
    modules = {_module_name(p) for p in files}
    graph = {}
    for path in files:
        me = _module_name(path)
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {(a.name, node.lineno) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module
                for a in node.names:  # `from . import functional` imports the module functional
                    sub = f"{source}.{a.name}"
                    found.add((sub if sub in modules else source, node.lineno))
        graph[me] = {(m, line) for m, line in found if m in modules and m != me}
    return graph


def _part(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<the package root>"


def _part_imports(graph, part):
    return {(_part(m), f"{src}:{line}") for src, deps in graph.items() if _part(src) == part
            for m, line in deps if _part(m) != part}


def test_import_graph_reads_the_real_imports():
    graph = _import_graph()
    # a scan that found nothing would pass every floor check below
    assert any(m.startswith("snnquant.nn") for m, _ in graph["snnquant.convert"])
    assert any(m == "snnquant.nn.quantizers.base" for m, _ in graph["snnquant.calibrate"])
    assert any(m == "snnquant.calibrate" for m, _ in graph["snnquant.sensitivity"])  # a late import


def test_every_part_imports_only_lower_floors():
    graph = _import_graph()
    floor = {part: i for i, parts in enumerate(FLOORS) for part in parts}
    parts = {_part(m) for m in graph} - {"<the package root>"}
    placed = set(floor) | set(INFRASTRUCTURE) | {"datasets"} | set(APPLICATIONS)
    assert parts == placed, f"parts on no floor: {sorted(parts - placed)}; floors naming no part: " \
                            f"{sorted(placed - parts)}"
    offenders = []
    for part in parts:
        for used, where in _part_imports(graph, part):
            if part in APPLICATIONS:
                continue
            if used in APPLICATIONS:
                offenders.append(f"{where} ({part} imports {used})")
            elif used in INFRASTRUCTURE and part not in INFRASTRUCTURE:
                continue
            if part == "datasets" or used == "datasets" or part in INFRASTRUCTURE:
                offenders.append(f"{where} ({part} imports {used})")
            elif used == "<the package root>" or floor[used] > floor[part] or \
                    (floor[used] == floor[part] and (part, used) not in SAME_FLOOR):
                offenders.append(f"{where} ({part} imports {used})")
    assert not offenders, offenders


def test_convert_imports_neither_summary_nor_export():
    used = {u for u, _ in _part_imports(_import_graph(), "convert")}
    assert not used & {"summary", "export", "calibrate", "sensitivity", "measure"}, used


def test_convert_reaches_summary_only_through_its_deprecation_shim():
    """The old spelling ``from snnquant.convert import summary`` is a module ``__getattr__``
    (docs/architecture.rst, "Old spellings"): the only code of convert.py that names summary, so
    the import scan above rightly sees no edge from convert to summary."""
    tree = ast.parse((PACKAGE / "convert.py").read_text())
    shim = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"]
    assert len(shim) == 1
    inside = {id(n) for n in ast.walk(shim[0])}
    naming = [n.lineno for n in ast.walk(tree) if id(n) not in inside and (
        (isinstance(n, ast.Constant) and isinstance(n.value, str) and "snnquant.summary" in n.value)
        or (isinstance(n, ast.Name) and n.id in ("summary", "Summary"))
        or (isinstance(n, ast.Attribute) and n.attr in ("summary", "Summary")))]
    assert naming == [], f"convert.py names summary outside its shim at lines {naming}"
    assert any(isinstance(n, ast.Constant) and n.value == "snnquant.summary"
               for n in ast.walk(shim[0]))


def test_summary_calibrate_and_sensitivity_sit_beside_each_other():
    graph = _import_graph()
    top = {"summary", "calibrate", "sensitivity"}
    edges = {(part, used) for part in top for used, _ in _part_imports(graph, part) if used in top}
    assert edges <= SAME_FLOOR, edges
    assert not any(used in top for used, _ in _part_imports(graph, "summary"))
    assert not any(used in top for used, _ in _part_imports(graph, "calibrate"))
    assert not any(used == "summary" for used, _ in _part_imports(graph, "sensitivity"))


def test_no_import_cycles_between_modules():
    graph = {m: {d for d, _ in deps} for m, deps in _import_graph().items()}
    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, cycles
