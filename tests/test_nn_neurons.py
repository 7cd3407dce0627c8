"""Quantized neurons: parity with SpikingJelly, step-mode contract, one autograd node, dtypes."""
import copy
import itertools

import pytest
import torch
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import monitor, neuron, surrogate

from snnquant import nn as qnn
from snnquant.functional.neuron import quant_neuron_step_reference

PAIRS = [
    (qnn.QuantIFNode, neuron.IFNode, {}),
    (qnn.QuantLIFNode, neuron.LIFNode, {"tau": 3.0, "decay_input": True}),
    (qnn.QuantLIFNode, neuron.LIFNode, {"tau": 2.0, "decay_input": False}),
    (qnn.QuantParametricLIFNode, neuron.ParametricLIFNode, {"init_tau": 2.5, "decay_input": True}),
    (qnn.QuantParametricLIFNode, neuron.ParametricLIFNode, {"init_tau": 2.0, "decay_input": False}),
]
COMMON = list(itertools.product([0.0, None], [False, True], ["m", "s"]))


def _run(node, x, mode):
    if mode == "m":
        return node(x)
    return torch.stack([node(x[t]) for t in range(x.shape[0])])


@pytest.mark.parametrize("qcls,sjcls,kw", PAIRS, ids=lambda p: getattr(p, "__name__", ""))
@pytest.mark.parametrize("v_reset,detach_reset,mode", COMMON)
def test_no_quant_matches_spikingjelly(qcls, sjcls, kw, v_reset, detach_reset, mode):
    torch.manual_seed(0)
    x = torch.randn(6, 3, 40) * 1.5
    sg = surrogate.ATan(alpha=3.0)
    a = sjcls(v_reset=v_reset, detach_reset=detach_reset, surrogate_function=sg, step_mode=mode,
              store_v_seq=True, **kw)
    b = qcls(v_reset=v_reset, detach_reset=detach_reset, surrogate_function=sg, step_mode=mode,
             store_v_seq=True, v_quant=None, **kw)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    sa, sb = _run(a, xa, mode), _run(b, xb, mode)
    assert torch.equal(sa, sb)
    assert torch.equal(a.v, b.v)
    assert torch.equal(a.v_seq, b.v_seq)
    g = torch.randn_like(sa)
    ((sa * g).sum() + a.v.sum()).backward()
    ((sb * g).sum() + b.v.sum()).backward()
    assert torch.equal(xa.grad, xb.grad)
    if hasattr(a, "w"):
        torch.testing.assert_close(a.w.grad, b.w.grad)


@pytest.mark.parametrize("qcls,sjcls,kw", PAIRS, ids=lambda p: getattr(p, "__name__", ""))
@pytest.mark.parametrize("v_quant", [6, "lsq", "state", "minmax", "lsq_pc"])
@pytest.mark.parametrize("v_reset", [0.0, None])
def test_quantized_multi_step_equals_single_steps(qcls, sjcls, kw, v_quant, v_reset):
    torch.manual_seed(1)
    x = torch.randn(7, 2, 30)
    vq = {6: 6, "lsq": qnn.LSQQuantizer(6), "state": qnn.StateQuant(num_bits=5, uniform=False),
          "minmax": qnn.MinMaxQuantizer(6),
          "lsq_pc": qnn.LSQQuantizer(6, per_channel=True, channel_dim=-1)}[v_quant]
    m = qcls(v_reset=v_reset, step_mode="m", v_quant=vq, store_v_seq=True, **kw)
    s = copy.deepcopy(m)
    sjf.set_step_mode(s, "s")
    ym = m(x)
    ys = torch.stack([s(x[t]) for t in range(x.shape[0])])
    assert torch.equal(ym, ys)
    torch.testing.assert_close(m.v, s.v, rtol=0, atol=0)
    torch.testing.assert_close(m.v_seq, s.v_seq, rtol=0, atol=0)
    assert m.v_seq.shape == x.shape
    assert 0 < ym.mean() < 1


@pytest.mark.parametrize("neuron_kind", ["if", "lif", "plif"])
@pytest.mark.parametrize("v_reset,detach_reset", [(0.0, False), (None, True), (None, False)])
def test_quantized_neuron_follows_reference(neuron_kind, v_reset, detach_reset):
    torch.manual_seed(2)
    cls = {"if": qnn.QuantIFNode, "lif": qnn.QuantLIFNode, "plif": qnn.QuantParametricLIFNode}[neuron_kind]
    node = cls(v_reset=v_reset, detach_reset=detach_reset, step_mode="m", v_quant=5)
    x = torch.randn(5, 50, dtype=torch.float64).requires_grad_(True)
    node.to(torch.float64)
    spikes = node(x)
    step = node.v_quant.step
    v = torch.zeros((), dtype=torch.float64)
    ref = []
    xr = x.detach().clone().requires_grad_(True)
    for t in range(5):
        s, v = quant_neuron_step_reference(xr[t], v, neuron=neuron_kind, tau=2.0,
                                           w=getattr(node, "w", None), v_threshold=1.0,
                                           v_reset=v_reset, surrogate_function=node.surrogate_function,
                                           detach_reset=detach_reset, step=step, qmin=-16, qmax=15)
        ref.append(s)
    ref = torch.stack(ref)
    assert torch.equal(spikes, ref)
    torch.testing.assert_close(node.v, v)
    spikes.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)


def test_one_autograd_node_for_the_sequence():
    node = qnn.QuantLIFNode(step_mode="m", v_quant=8, backend="torch")
    x = torch.randn(16, 4, 10, requires_grad=True)
    y = node(x)
    assert type(y.grad_fn).__name__ == "QuantNeuronFunctionBackward"
    # the graph from the output back to x has a single node (the Function) on the path
    assert y.grad_fn.next_functions[0][0] is not None


def test_surrogate_and_masked_gradient_of_membrane():
    # H far outside the membrane range: the quantizer passes no gradient
    node = qnn.QuantIFNode(step_mode="m", v_quant=4, surrogate_function=surrogate.Sigmoid(alpha=4.0))
    x = torch.tensor([[-10.0, 0.5, 10.0]], requires_grad=True)
    node(x).sum().backward()
    assert x.grad[0, 0] == 0 and x.grad[0, 2] == 0 and x.grad[0, 1] > 0


def test_plif_tau_gets_gradient_through_quantized_path():
    node = qnn.QuantParametricLIFNode(step_mode="m", v_quant=8)
    node(torch.rand(8, 4, 20) * 2).sum().backward()
    assert node.w.grad is not None and node.w.grad != 0


def test_lsq_membrane_step_learns():
    node = qnn.QuantLIFNode(step_mode="m", v_quant=qnn.LSQQuantizer(4))
    node(torch.rand(8, 4, 20) * 2).sum().backward()
    assert bool(node.v_quant.initialized) and node.v_quant.step.grad is not None


def test_hard_reset_off_grid_snaps_initial_state():
    node = qnn.QuantLIFNode(step_mode="m", v_reset=0.1, v_quant=4)  # step 0.25
    node(torch.zeros(1, 3))
    # the initial state was snapped to the grid (0.0), then decays towards it: stays 0
    assert torch.equal(node.v, torch.zeros(3))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dtypes(dtype):
    node = qnn.QuantLIFNode(step_mode="m", v_quant=8).to(dtype)
    x = (torch.rand(4, 3, 16) * 2).to(dtype).requires_grad_(True)
    y = node(x)
    assert y.dtype == dtype and node.v.dtype == dtype
    y.sum().backward()
    assert x.grad.dtype == dtype


def test_autocast_bf16():
    lin = qnn.QuantLinear(16, 8, weight_quant=4, step_mode="m")
    node = qnn.QuantLIFNode(step_mode="m", v_quant=8)
    x = torch.rand(4, 2, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = node(lin(x))
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert lin.weight.grad is not None


def test_deepcopy_state_dict_monitor():
    net = torch.nn.Sequential(qnn.QuantLinear(8, 4, weight_quant=4), qnn.QuantLIFNode(v_quant=8))
    sjf.set_step_mode(net, "m")
    x = torch.rand(5, 2, 8) * 3
    mon = monitor.OutputMonitor(net, qnn.QuantLIFNode)
    y = net(x)
    assert len(mon.records) == 1 and torch.equal(mon.records[0], y)
    mon.remove_hooks()
    sjf.reset_net(net)  # as with SpikingJelly's neurons, deepcopy a net whose state is reset
    clone = copy.deepcopy(net)
    assert torch.equal(clone(x), net(x))
    fresh = torch.nn.Sequential(qnn.QuantLinear(8, 4, weight_quant=4), qnn.QuantLIFNode(v_quant=8))
    sjf.set_step_mode(fresh, "m")
    fresh.load_state_dict(net.state_dict())
    sjf.reset_net(net)
    assert torch.equal(fresh(x), net(x))


def test_bad_input():
    with pytest.raises(ValueError, match="backend"):
        qnn.QuantLIFNode(backend="numba")
    with pytest.raises(ValueError, match="v_quant"):
        qnn.QuantLIFNode(v_quant=1)
    node = qnn.QuantLIFNode(step_mode="m", v_quant=8)
    with pytest.raises(ValueError, match=r"\[T, N, \.\.\.\]"):
        node(torch.randn(5))


def test_cupy_backend_on_cpu_tensors_is_refused():
    node = qnn.QuantLIFNode(step_mode="m", v_quant=8, backend="cupy")
    with pytest.raises((RuntimeError, ImportError), match="(?i)cuda|cupy"):
        node(torch.rand(2, 3))


def test_auto_backend_uses_torch_on_cpu():
    a = qnn.QuantLIFNode(step_mode="m", v_quant=8, backend="auto")
    b = qnn.QuantLIFNode(step_mode="m", v_quant=8, backend="torch")
    x = torch.rand(4, 3, 5) * 2
    assert torch.equal(a(x), b(x))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_torch_backend_matches_cpu():
    node = qnn.QuantLIFNode(step_mode="m", v_quant=8)
    x = torch.rand(8, 4, 64) * 2
    y_cpu = node(x)
    sjf.reset_net(node)
    y_gpu = node.cuda()(x.cuda())
    assert torch.equal(y_cpu, y_gpu.cpu())


def test_minmax_membrane_range_follows_the_data():
    node = qnn.QuantLIFNode(step_mode="m", v_quant=qnn.MinMaxQuantizer(6, momentum=0.5))
    ranges = []
    for scale in (1.0, 4.0, 16.0):
        node(torch.randn(4, 2, 30) * scale)
        sjf.reset_net(node)
        ranges.append(float(node.v_quant.max_val - node.v_quant.min_val))
    assert ranges[0] < ranges[1] < ranges[2]


def test_soft_reset_subtracts_grid_threshold_on_both_paths():
    # the same uniform grid through the one-node path and through a per-step (MinMax eval) path
    x = torch.tensor([[1.25], [0.0]])
    a = qnn.QuantIFNode(step_mode="m", v_reset=None, v_quant=qnn.UniformQuantizer(8, 0.25))
    a(x)
    assert float(a.v) == 0.25  # 1.25 fires, minus theta_q = 1.0


@pytest.mark.parametrize("v_quant", [None, 8, "state"])
@pytest.mark.parametrize("mode", ["s", "m"])
def test_cupy_backend_refuses_cpu_tensors_on_every_path(v_quant, mode):
    vq = qnn.StateQuant(num_bits=4) if v_quant == "state" else v_quant
    node = qnn.QuantLIFNode(step_mode=mode, v_quant=vq, backend="cupy")
    with pytest.raises((RuntimeError, ImportError, ValueError), match="(?i)cuda|cupy"):
        node(torch.rand(2, 3))
