"""One registry of layer and neuron kinds for convert and export; the bit width in the Grid; the
BatchNorm rescale in the quantizer interface; the integer neuron step as one operation list whose
bounds hold."""
import random

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import layer, neuron

from snnquant import QuantConfig, quantize_model
from snnquant.export import IntegerSNN, NeuronOp, fold_batchnorm, to_integer
from snnquant.export.ir.program import OPCODES, neuron_program
from snnquant.nn import QuantLinear, QuantizerBase, registry
from snnquant.nn.quantizers import (BinaryQuantizer, Grid, LSQQuantizer, MinMaxQuantizer,
                                    QuantizedBits, StateQuant, TernaryQuantizer, UniformQuantizer,
                                    WeightGridBiasQuantizer)


# ------------------------------------------------------------------------------------------------
# the bit width is part of Grid

def _all_subclasses(cls):
    out = set()
    for sub in cls.__subclasses__():
        out.add(sub)
        out |= _all_subclasses(sub)
    return out


def _quantizers_with_a_grid():
    w = torch.randn(6, 5)
    lsq = LSQQuantizer(4, per_channel=True, num_channels=6)
    lsq.ensure_initialized(w)
    minmax = MinMaxQuantizer(6)
    minmax(w)
    binary, ternary = BinaryQuantizer(num_channels=6), TernaryQuantizer(num_channels=6)
    binary.ensure_initialized(w)
    ternary.ensure_initialized(w)
    lin = QuantLinear(5, 6, weight_quant=LSQQuantizer(4, power_of_two=True))
    lin.weight_quant.ensure_initialized(lin.weight)
    bias = WeightGridBiasQuantizer(12).bind(lin)
    return [lsq, minmax, binary, ternary, bias, UniformQuantizer(5, step=0.25),
            QuantizedBits(4), StateQuant(num_bits=3)]


def test_every_grid_carries_the_quantizers_bit_width():
    quantizers = _quantizers_with_a_grid()
    own_grid = {c for c in _all_subclasses(QuantizerBase)
                if "grid" in vars(c) and c.__module__.startswith("snnquant.")}
    covered = {type(q) for q in quantizers}
    missing = {c.__name__ for c in own_grid if not any(issubclass(k, c) for k in covered)}
    assert not missing, f"add these quantizers to the test: {sorted(missing)}"
    for q in quantizers:
        g = q.grid()
        assert g is not None and g.bits == q.num_bits, (type(q).__name__, g)
    assert [q.grid().bits for q in quantizers[2:4]] == [1, 2]


class _ThreeBitGrid(QuantizerBase):
    """A user quantizer that tells its bit width only through its grid (no ``bits`` attribute)."""

    def quantize(self, x):
        return torch.clamp(torch.round(x / 0.25), -4, 3) * 0.25

    def grid(self):
        return Grid(torch.tensor(0.25), -4, 3, None, True, bits=3)


def test_export_reads_the_bit_width_from_the_grid():
    torch.manual_seed(0)
    net = nn.Sequential(layer.Linear(5, 4, bias=False), neuron.IFNode())
    qnet, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    qnet[0].weight_quant = _ThreeBitGrid()
    qnet(torch.rand(2, 5))
    assert to_integer(qnet.eval(), input_max=1).layer("0").weight_bits == 3


# ------------------------------------------------------------------------------------------------
# rescaling for BatchNorm folding is part of the quantizer interface

def test_rescale_channels_is_part_of_the_interface():
    assert QuantizerBase().rescale_channels(torch.ones(3)) is False
    lsq = LSQQuantizer(4)
    assert lsq.rescale_channels(torch.ones(3)) is False
    binary = BinaryQuantizer(num_channels=3)
    binary.ensure_initialized(torch.randn(3, 4))
    before = binary.alpha.detach().clone()
    assert binary.rescale_channels(torch.tensor([2.0, -1.0, 0.5])) is True
    assert torch.allclose(binary.alpha.detach(), before * torch.tensor([2.0, 1.0, 0.5]))


def test_fold_batchnorm_uses_the_interface_for_any_quantizer():
    class NoRescale(LSQQuantizer):
        calls = 0

        def rescale_channels(self, scale):
            NoRescale.calls += 1
            return super().rescale_channels(scale)

    torch.manual_seed(1)
    net = nn.Sequential(layer.Linear(5, 4), nn.BatchNorm1d(4), neuron.IFNode())
    qnet, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8, fold_batchnorm=False))
    qnet[0].weight_quant = NoRescale(4, power_of_two=True)
    qnet(torch.rand(8, 5))
    fold_batchnorm(qnet.eval())
    assert NoRescale.calls == 1


# ------------------------------------------------------------------------------------------------
# one registry of layer and neuron kinds

def test_convert_and_export_read_one_registry():
    for kind in registry.LAYER_KINDS:
        assert registry.layer_kind(kind.quant_cls.__new__(kind.quant_cls)) is kind
    for kind in registry.NEURON_KINDS:
        assert registry.neuron_kind(kind.quant_cls.__new__(kind.quant_cls)) is kind
    net = nn.Sequential(layer.Linear(6, 4), neuron.LIFNode(tau=2.0), layer.Linear(4, 3),
                        neuron.ParametricLIFNode(init_tau=2.0), layer.Linear(3, 2),
                        neuron.IFNode())
    net[3].w.requires_grad_(False)
    qnet, report = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    for module in net:
        kind = registry.layer_kind(module) or registry.neuron_kind(module)
        assert kind is not None
    assert [type(m) for m in qnet] == [(registry.layer_kind(m) or registry.neuron_kind(m)).quant_cls
                                       for m in net]
    qnet(torch.rand(3, 6))
    desc = to_integer(qnet.eval(), input_max=1)
    assert [op.kind for op in desc.ops] == ["linear", "lif", "linear", "lif", "linear", "if"]


class MyLinear(nn.Linear):
    """A layer kind the package does not know."""


def test_registering_a_layer_kind_is_one_entry(monkeypatch):
    torch.manual_seed(2)
    net = nn.Sequential(MyLinear(5, 4), neuron.IFNode())
    _, report = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    assert [s.name for s in report.skipped] == ["0"]
    linear = registry.LAYER_KINDS[0]
    entry = registry.LayerKind("linear", MyLinear, QuantLinear, 0, linear.from_float)
    monkeypatch.setattr(registry, "LAYER_KINDS", registry.LAYER_KINDS + (entry,))
    qnet, report = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    assert isinstance(qnet[0], QuantLinear) and not report.skipped
    x = (torch.rand(4, 3, 5) > 0.5).float()
    qnet(x[0])
    desc = to_integer(qnet.eval(), input_max=1)
    assert desc.layer("0").kind == "linear"
    assert IntegerSNN(desc)(x.to(torch.int64)).shape == (4, 3, 4)


# ------------------------------------------------------------------------------------------------
# the neuron step: one operation list, bounds that hold

def _random_neuron(rng):
    kind = rng.choice(["if", "lif"])
    bits = rng.randint(2, 8)
    v_min, v_max = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    th = rng.randint(1, v_max)
    hard = rng.random() < 0.5
    v_reset = rng.randint(v_min, th - 1) if hard else 0
    k = 0 if kind == "if" else rng.randint(1, 4)
    fixed = kind == "lif" and rng.random() < 0.4
    m = rng.randint(1, (1 << k) - 1) if fixed else 1
    r = (k - k // 2) if fixed else 0
    d = rng.randint(0, 4)
    return NeuronOp(name="n", kind=kind, v_bits=bits, v_min=v_min, v_max=v_max,
                    membrane_scale=1.0, threshold=th, reset_mode="hard" if hard else "soft",
                    v_reset=v_reset, v_init=v_reset if hard else 0, leak_shift=k,
                    decay_input=rng.random() < 0.5, input_shift=rng.randint(0, 2),
                    grid_shift=d, in_frac_bits=0, grid_frac_bits=0, leak_multiplier=m,
                    leak_round_shift=r, exact=not fixed)


@pytest.mark.parametrize("seed", range(40))
def test_every_register_stays_inside_its_proven_interval(seed):
    rng = random.Random(seed)
    op = _random_neuron(rng)
    program = neuron_program(op)
    assert all(ins.code in OPCODES for ins in program.instrs)
    x_max = rng.randint(1, 300)
    bounds, v_range = program.intervals((-x_max, x_max))
    gen = torch.Generator().manual_seed(seed)
    v = torch.full((512,), op.v_init, dtype=torch.int64)
    for _ in range(12):
        x = torch.randint(-x_max, x_max + 1, (512,), generator=gen)
        x[:8] = torch.tensor([x_max, -x_max] * 4)
        trace = {}
        v, _ = program.run(v, x, trace=trace)
        for reg, value in trace.items():
            lo, hi = bounds[reg]
            value = value.to(torch.int64)
            assert lo <= int(value.min()) and int(value.max()) <= hi, (reg, op)
        assert v_range[0] <= int(v.min()) and int(v.max()) <= v_range[1]
