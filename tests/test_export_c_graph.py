"""The C runtime (``to_c``) on graphs (issue 22 §2): residual joins (add with shift alignment,
AND, IAND of spikes), branches, adaptive pools and ``VotingLayer``'s average, on SpikingJelly's
model zoo and on a handmade residual graph; compiled under strict flags (and UBSan where the
compiler links it) and compared with ``IntegerSNN`` on every sample and step, in both synapse
forms."""
import pytest
import torch
import torch.nn as nn

from snnquant.export import IntegerSNN, JoinOp, PoolOp, c_memory, to_c, to_integer
from test_export_c import assert_same, build
from test_export_graph import ZOO, _deployable, _InputSkip, _TwoBranches

#: Channel counts of 64 and more are divided by this in the C test's copies of the ResNets and
#: VGG (see :func:`_narrow`).
NARROW = 8


def _narrow(net: nn.Module, factor: int = NARROW) -> nn.Module:
    """The same network with every channel and feature count of 64 or more divided by ``factor``
    (the input's 3 channels and the 10 classes stay): every convolution, BatchNorm and linear
    layer is rebuilt narrower in place, blocks, joins, downsampling and pools untouched.

    Why: at full width the four large zoo networks hold about 42 M weights (spiking_resnet18 and
    sew_resnet18 11.2 M each at 32 x 32); gcc compiles about 1 M ``static const`` initialisers a
    second here (measured: 2.3 s for a 2 M-element int8 array at -O1) and the generated sources
    would be some 150 MB, far beyond this file's two minutes. The constructors offer no width
    argument (SpikingJelly hard-codes 64..512), so the C test narrows the built network instead.
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
    for synapses in ("events", "dense"):
        exe = build(desc, folder / synapses, input_shape=shape, synapses=synapses)
        assert assert_same(desc, exe, x) == 1.0, synapses
        mem = c_memory(desc, shape, synapses=synapses)
        header = (folder / synapses / "snn.h").read_text()
        assert f"#define SNN_RAM_BYTES {mem.ram_bytes}\n" in header
        assert f"#define SNN_ROM_BYTES {mem.rom_bytes}\n" in header


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_network_in_c_equals_integer_snn(name, tmp_path):
    """quantize_model (4-bit weights, 8-bit membranes), a training-mode pass, fold_batchnorm,
    to_integer, to_c: the compiled model's output (currents of the linear head, or
    ``VotingLayer``'s spike counts) equals IntegerSNN's on every sample and step. The ResNets and
    VGG are narrowed by :func:`_narrow` (why: see there); NMNISTNet is built at test size."""
    small = name != "NMNISTNet"
    model, x, shape = _deployable(name, _narrow if small else None)
    desc = to_integer(model, input_shape=shape)
    out, layers = IntegerSNN(desc)(x.long(), record=True)
    spiking = [k for k, s in layers.items() if k in desc.neuron_names and int(s.sum()) > 0]
    assert len(spiking) >= 2, spiking
    if name == "NMNISTNet":  # the output is VotingLayer's sums of 10 spikes (int64 counts)
        assert isinstance(desc.ops[-1], PoolOp) and desc.ops[-1].divisor == 10
    else:
        assert desc.is_graph == name.startswith(("spiking_resnet", "sew"))
        assert int(out.abs().sum()) > 0
    _assert_c_equals_integer_snn(desc, shape, x.long(), tmp_path)
