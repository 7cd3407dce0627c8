"""The C runtime (``to_c``) on graphs (issue 22 §2): residual joins (add with shift alignment,
AND, IAND of spikes), branches, adaptive pools and ``VotingLayer``'s average, on SpikingJelly's
model zoo and on a handmade residual graph; compiled under strict flags (and UBSan where the
compiler links it) and compared with ``IntegerSNN`` on every sample and step, in both synapse
forms."""
import subprocess

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

from conftest import neuron_outputs
from snnquant import QuantConfig, quantize_model
from snnquant.export import IntegerSNN, PoolOp, c_memory, to_c, to_integer
from test_export_c import DRIVER, STRICT, assert_same, build, compiler
from test_export_graph import (ZOO, _active, _deployable, _InputSkip, _JoinedWithItself,
                               _TwoBranches)

#: Channel counts of 64 and more are divided by this in the C test's copies of the ResNets and
#: VGG (see :func:`_narrow`): weights / 16.
NARROW = 4


def _narrow(net: nn.Module, factor: int = NARROW) -> nn.Module:
    """The same network with every channel and feature count of 64 or more divided by ``factor``
    (the input's 3 channels and the 10 classes stay): every convolution, BatchNorm and linear
    layer is rebuilt narrower in place, blocks, joins, downsampling and pools untouched.

    Why: at full width the four large zoo networks hold about 42 M weights (spiking_resnet18 and
    sew_resnet18 11.2 M each at 32 x 32). Measured here on one core for spiking_resnet18 alone:
    to_c writes 40 MB of C in 6 s and gcc -O1 with UBSan compiles it in 17 s, per synapse form;
    the six networks in both forms would take minutes, not this file's two. Halving the widths
    still costs 1.5 s + 5 s per network and form; a quarter (:data:`NARROW`) keeps the file at
    about 30 s. The constructors offer no width argument (SpikingJelly hard-codes 64..512), so
    the test narrows the built network instead.
    """
    def width(c):
        return c // factor if c >= 64 else c

    for parent in list(net.modules()):
        for child_name, m in list(parent.named_children()):
            if isinstance(m, nn.Conv2d):
                new = type(m)(width(m.in_channels), width(m.out_channels), m.kernel_size,
                              stride=m.stride, padding=m.padding, dilation=m.dilation,
                              groups=m.groups, bias=m.bias is not None)
            elif isinstance(m, nn.BatchNorm2d):
                new = type(m)(width(m.num_features), eps=m.eps, momentum=m.momentum)
            elif isinstance(m, nn.Linear):
                new = type(m)(width(m.in_features), width(m.out_features), bias=m.bias is not None)
            else:
                continue
            setattr(parent, child_name, new)
    return net




def _assert_c_equals_integer_snn(desc, shape, x, folder):
    """Both synapse forms compile (strict flags, UBSan) and equal IntegerSNN on ``x``; their
    memory macros are c_memory's (sizeof(state) == RAM_BYTES is checked by the compiler)."""
    mem = {}
    for synapses in ("events", "dense"):
        exe = build(desc, folder / synapses, input_shape=shape, synapses=synapses)
        assert assert_same(desc, exe, x) == 1.0, synapses
        mem[synapses] = c_memory(desc, shape, synapses=synapses)
        header = (folder / synapses / "snn.h").read_text()
        assert f"#define SNN_RAM_BYTES {mem[synapses].ram_bytes}\n" in header
        assert f"#define SNN_ROM_BYTES {mem[synapses].rom_bytes}\n" in header
    assert mem["events"].ram_bytes == (mem["dense"].ram_bytes + mem["events"].scratch_bytes
                                       + mem["events"].list_bytes)
    assert mem["dense"].list_bytes == 0


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_network_in_c_equals_integer_snn(name, tmp_path):
    """quantize_model (4-bit weights, 8-bit membranes), a training-mode pass, fold_batchnorm,
    to_integer, to_c: the compiled model's output (currents of the linear head, or
    ``VotingLayer``'s spike counts) equals IntegerSNN's on every sample and step, with every
    neuron layer spiking (:func:`_active`). The ResNets and VGG are narrowed by :func:`_narrow`
    (why: see there); NMNISTNet is built at test size."""
    if name == "NMNISTNet":
        model, x, shape = _deployable(name, _active)
    else:
        model, x, shape = _deployable(name, lambda net: _active(_narrow(net)))
    desc = to_integer(model, input_shape=shape)
    out, layers = IntegerSNN(desc)(x.long(), record=True)
    silent = [k for k in desc.neuron_names if int(layers[k].sum()) == 0]
    assert not silent, f"layers that never spike check nothing: {silent}"
    assert out.unique().numel() > 2      # the output varies over steps and samples
    if name == "NMNISTNet":  # the output is VotingLayer's sums of 10 spikes (int64 counts)
        assert isinstance(desc.ops[-1], PoolOp) and desc.ops[-1].divisor == 10
        assert int(out.max()) > 1
    else:
        assert desc.is_graph == name.startswith(("spiking_resnet", "sew"))
    _assert_c_equals_integer_snn(desc, shape, x.long(), tmp_path)



@pytest.mark.heavy
def test_full_width_spiking_resnet18_in_c(tmp_path):
    """spiking_resnet18 at full width (11.2 M weights, 40 MB of C) in the default event-driven
    form equals IntegerSNN: the narrowing above only keeps the file's time down. Compiled at
    -O0 without UBSan (13 s here instead of 17 s per form at -O1 with UBSan); the other three
    large zoo networks at full width take about as long each and were checked the same way by
    hand, not in CI."""
    model, x, shape = _deployable("spiking_resnet18", _active)
    desc = to_integer(model, input_shape=shape)
    assert sum(op.weight.numel() for op in desc.ops if hasattr(op, "weight")) > 11_000_000
    folder = tmp_path / "full"
    _, source = to_c(desc, folder, "snn", input_shape=shape)
    (folder / "driver.c").write_text(DRIVER.format(name="snn", NAME="SNN"))
    cmd = [compiler(), *STRICT, "-O0", str(source), str(folder / "driver.c"), "-o",
           str(folder / "driver")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0 and not res.stderr, res.stderr[:2000]
    assert assert_same(desc, folder / "driver", x.long()) == 1.0

def test_handmade_residual_graph_in_c(tmp_path):
    """Two currents on the grids 2^-2 and 2^-6 joined by shifts (4, 0), and the network input
    joined to a current (shifts (0, 3)): the C model equals IntegerSNN."""
    x = (torch.rand(16, 5, 8, generator=torch.Generator().manual_seed(0)) > 0.5).long()
    desc = to_integer(_TwoBranches(2.0 ** -2, 2.0 ** -6).eval(), input_max=1)
    assert desc.layer("add").shifts == (4, 0)
    assert int(IntegerSNN(desc)(x).sum()) > 0
    _assert_c_equals_integer_snn(desc, (8,), x, tmp_path / "two")
    text = (tmp_path / "two" / "events" / "snn.c").read_text()
    assert "(int32_t)in0[j] * 16 + (int32_t)in1[j]" in text      # the shift alignment
    # both branches' currents are alive when the join runs, beside its own output: three buffers
    header = (tmp_path / "two" / "events" / "snn.h").read_text()
    assert "} buf2;" in header and "buf3" not in header
    skip = to_integer(_InputSkip().eval(), input_max=3)
    assert skip.layer("add").inputs == (0, -1)
    x = torch.randint(0, 4, (6, 3, 8), generator=torch.Generator().manual_seed(2))
    _assert_c_equals_integer_snn(skip, (8,), x, tmp_path / "skip")


def test_join_reading_one_value_twice_in_c(tmp_path):
    """Issue 35 §2: c = fc(x); sn(c + c): the C model and IntegerSNN (which raised KeyError)
    give the same spikes."""
    desc = to_integer(_JoinedWithItself().eval(), input_max=1)
    x = (torch.rand(16, 5, 8, generator=torch.Generator().manual_seed(0)) > 0.5).long()
    assert int(IntegerSNN(desc)(x).sum()) > 0
    _assert_c_equals_integer_snn(desc, (8,), x, tmp_path / "twice")


def test_adaptive_pool_and_voting_layer_in_c(tmp_path):
    """An adaptive average pool from 6 x 6 to 4 x 4 (windows of 2 starting at 0, 1, 3, 4: not
    one stride) and a VotingLayer over 10 neurons (a divisor that is not a power of two): the C
    output is the integer sums of spikes, as IntegerSNN's, and the header says what to divide by."""
    net = nn.Sequential(layer.Conv2d(2, 4, 3, padding=1), neuron.IFNode(),
                        layer.AdaptiveAvgPool2d((4, 4)), layer.Flatten(), layer.Linear(64, 20),
                        neuron.IFNode(), layer.VotingLayer(10))
    sjf.set_step_mode(net, "m")
    torch.manual_seed(1)
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, weight_quantizer="lsq_pow2", v_bits=8))
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(6, 3, 2, 6, 6, generator=g) > 0.4).float()
    sjf.reset_net(q)
    q.train()(x)
    with torch.no_grad():
        q[4].weight.abs_()      # excitatory read-out: the vote counts are not all zero
    q.eval()
    desc = to_integer(q, input_shape=(2, 6, 6))
    pool = desc.layer("2")
    assert pool.output_size == (4, 4) and pool.kernel_size == (2, 2)
    assert desc.ops[-1].divisor == 10 and desc.output_divisor == 10
    out = IntegerSNN(desc)(x.long())
    assert int(out.max()) > 1            # counts, not 0/1 spikes
    y, _ = neuron_outputs(q, x)
    assert torch.equal((out.double() / 10).float(), y)   # the float model's vote, rounded
    _assert_c_equals_integer_snn(desc, (2, 6, 6), x.long(), tmp_path)
    header = (tmp_path / "events" / "snn.h").read_text()
    assert "sums of spikes" in header and "divided by 10" in header
