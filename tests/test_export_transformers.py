"""Issue 32 §2-§3: today's spiking architectures from SpikingJelly's model zoo deploy exactly:
MS-ResNet (membrane shortcut: joins of currents, a downsample convolution reading a current),
Spikformer (spike matrix products, the 0.125 attention scale, head splitting), the
Spike-driven Transformer (elementwise spike products, token sums, permutes) and QKFormer (token
sums, a mean over time before the head). At test size (16x16 or 32x32, T = 4, embedding 32,
depth 1), quantize_model (W4/V8), a training-mode pass whose BatchNorm statistics keep every
layer spiking, fold_batchnorm, to_integer on a captured run; then IntegerSNN equals the folded
fake-quantized model at every layer, step and sample, the file round trip keeps it, the C model
(strict flags, UBSan) equals IntegerSNN at every step, and to_nir refuses the first operation
NIR has no node for, by name."""
import json
import os
import warnings

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

from _zoo import TRANSFORMERS
from conftest import assert_spikes_equal, load_script
from snnquant import QuantConfig, quantize_model
from snnquant.export import (ExportError, FoldWarning, GatherOp, IntegerSNN,
                             compare_integer, MatMulOp, ReduceOp, ScaleOp,
                             fold_batchnorm, load_integer, save_integer, to_integer, to_nir)
from test_export_c import build, run_c

ZOO = load_script("benchmarks/zoo_deploy.py")
T, N = ZOO.T, 3


_CACHE = {}


def deployed(name):
    """``(folded model, spike input, description)``, built once per network."""
    if name not in _CACHE:
        torch.manual_seed(0)
        build, shape, _ = ZOO.networks()[TRANSFORMERS[name]]
        g = torch.Generator().manual_seed(1)
        x = (torch.rand((T, N) + shape, generator=g) > 0.5).float()
        # with the example input every BatchNorm trains folded (torch.fx stops at the shape
        # checks of the attention blocks' forward)
        q, report = quantize_model(ZOO.keep_spiking(build()),
                                   QuantConfig(weight_bits=4, v_bits=8), example_input=x)
        assert report.folded
        sjf.reset_net(q)
        q.train()(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FoldWarning)  # trained folded: folding changes nothing
            folded = fold_batchnorm(q.eval(), example_input=x)
        desc = to_integer(folded, example_input=x, input_max=1)
        _CACHE[name] = folded, x, desc
    return _CACHE[name]


@pytest.mark.parametrize("name", sorted(TRANSFORMERS))
def test_zoo_network_runs_exactly_in_integers(name):
    model, x, desc = deployed(name)
    out, y = assert_spikes_equal(desc, model, x)
    assert desc.output_kind == "current" and desc.exact
    divisor = 2.0 ** desc.output_frac_bits * (T if desc.output_time_mean else 1)
    assert torch.equal((out.double() / divisor).float(), y)
    assert out.unique().numel() > 2
    # what each network needed
    kinds = {type(op).__name__ for op in desc.ops}
    if name in ("ms_resnet", "max_resnet"):
        assert desc.output_time_mean and any(
            type(desc.ops[desc.op_inputs(i)[0]]).__name__ == "JoinOp"
            and type(op).__name__ == "SynapseOp" for i, op in enumerate(desc.ops))
    elif name == "spikformer":
        assert {"MatMulOp", "ScaleOp", "GatherOp", "ReduceOp"} <= kinds
        assert [op.exponent for op in desc.ops if isinstance(op, ScaleOp)] == [-3]
    elif name == "spike_driven_transformer":
        assert {"GatherOp", "ReduceOp"} <= kinds and desc.output_time_mean
    else:
        assert {"ReduceOp", "MatMulOp"} <= kinds and desc.output_time_mean


@pytest.mark.parametrize("name", sorted(TRANSFORMERS))
def test_zoo_network_file_round_trip(name, tmp_path):
    _, x, desc = deployed(name)
    path = tmp_path / f"{name}.safetensors"
    save_integer(desc, path)
    back = load_integer(path)
    assert str(back) == str(desc) and back.output_time_mean == desc.output_time_mean
    a, la = IntegerSNN(desc)(x.long(), record=True)
    b, lb = IntegerSNN(back)(x.long(), record=True)
    assert torch.equal(a, b) and all(torch.equal(la[k], lb[k]) for k in la)


@pytest.mark.parametrize("name", sorted(TRANSFORMERS))
def test_zoo_network_in_c_equals_integer_snn(name, tmp_path):
    """The C model's per-step output equals IntegerSNN's last layer at every step and sample
    (a network averaged over time: its steps, which the caller sums)."""
    _, x, desc = deployed(name)
    shape = tuple(x.shape[2:])
    exe = build(desc, tmp_path, input_shape=shape)
    _, layers = IntegerSNN(desc)(x.long(), record=True)
    ref = layers[desc.ops[-1].name].reshape(T, N, -1)
    got = run_c(exe, x.long())
    assert torch.equal(got, ref)
    assert ("sum the outputs of the T steps and divide by T" in (tmp_path / "snn.h").read_text()) \
        == desc.output_time_mean


@pytest.mark.parametrize("name", ["spikformer", "spike_driven_transformer", "qkformer"])
def test_to_nir_names_the_first_operation_nir_has_no_node_for(name):
    _, x, desc = deployed(name)
    first = next(i for i, op in enumerate(desc.ops)
                 if isinstance(op, (GatherOp, ReduceOp, MatMulOp, ScaleOp)))
    op = desc.ops[first]
    with pytest.raises(ExportError, match=rf"layer '{op.name}' \(operation {first}, "
                                          rf"{type(op).__name__}\): NIR has no node for it"):
        to_nir(desc, tuple(x.shape[2:]))


def test_to_nir_refuses_a_mean_over_time():
    _, x, desc = deployed("ms_resnet")
    with pytest.raises(ExportError, match=r"output is a mean over time steps"):
        to_nir(desc, tuple(x.shape[2:]))


def test_the_deploy_guides_zoo_table_is_what_the_script_measures():
    """One row of ``benchmarks/results/zoo_deploy.json`` (the table the deploy guide includes),
    measured again: the committed table is what the code does."""
    with open(os.path.join(ZOO.RESULTS, "zoo_deploy.json")) as f:
        rows = {r["network"]: r for r in json.load(f)["rows"]}
    assert set(rows) == set(ZOO.networks())
    name = "spikformer.Spikformer"
    again = ZOO.measure(name, *ZOO.networks()[name])
    assert {k: v for k, v in again.items() if k != "seconds"} == \
        {k: v for k, v in rows[name].items() if k != "seconds"}


def test_an_edited_description_of_the_new_operations_is_refused_by_name():
    import copy
    from snnquant.export import IntegerNetworkError, check_network
    _, x, desc = deployed("spikformer")
    kinds = {GatherOp: None, ReduceOp: None, MatMulOp: None, ScaleOp: None}
    for i, op in enumerate(desc.ops):
        if type(op) in kinds and kinds[type(op)] is None and (
                not isinstance(op, GatherOp) or op.index is not None):
            kinds[type(op)] = i
    bad = copy.deepcopy(desc)
    bad.ops[kinds[GatherOp]].index[0] = -1
    with pytest.raises(IntegerNetworkError,
                       match=rf"operation {kinds[GatherOp]} .*has index=.*>= 0"):
        check_network(bad)
    bad = copy.deepcopy(desc)
    bad.ops[kinds[MatMulOp]].out_frac_bits += 1
    with pytest.raises(IntegerNetworkError, match=rf"operation {kinds[MatMulOp]} .*out_frac_bits=.*"
                                               rf"it must be the operands'"):
        check_network(bad)
    bad = copy.deepcopy(desc)
    bad.ops[kinds[ReduceOp]].count += 1       # the shapes say otherwise
    with pytest.raises(IntegerNetworkError, match=rf"operation {kinds[ReduceOp]} .*not "
                                               rf"{bad.ops[kinds[ReduceOp]].count} values"):
        IntegerSNN(bad)(x.long())
    bad = copy.deepcopy(desc)
    bad.ops[kinds[ScaleOp]].exponent = 99
    with pytest.raises(IntegerNetworkError, match=rf"operation {kinds[ScaleOp]} .*exponent=99"):
        check_network(bad)


class _Tail(nn.Module):
    """A spiking layer ``h`` then ``tail(self, h, x)``: the forms a review found mishandled."""

    def __init__(self, tail):
        super().__init__()
        self.fc1, self.sn1 = layer.Linear(16, 16), neuron.IFNode(v_threshold=0.5)
        self.fc2, self.fc3 = layer.Linear(16, 6), layer.Linear(16, 6)
        self.tail = tail

    def forward(self, x):
        return self.tail(self, self.sn1(self.fc1(x)), x)


def _tail_export(tail, **kw):
    torch.manual_seed(0)
    net = _Tail(tail)
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    x = (torch.rand(T, 2, 16, generator=torch.Generator().manual_seed(3)) > 0.3).float()
    sjf.reset_net(q)
    q.train()(x)
    q.eval()
    return q, x, to_integer(q, example_input=x, input_max=1, **kw)


def test_a_network_ending_in_a_flattened_token_mean_outputs_its_fraction():
    """mean over 4 values then flatten: the output has 2 fractional bits (it was typed 0/1
    spikes, divided by 1 and cast to int8)."""
    q, x, desc = _tail_export(lambda m, h, x: h.reshape(T, 2, 4, 4).mean(-1).flatten(2))
    assert desc.output_kind == "current" and desc.output_divisor == 4
    assert compare_integer(q, x, desc).output == 1.0


@pytest.mark.parametrize("tail, message", [
    (lambda m, h, x: m.fc2(h.mean(0)) + m.fc3(h.mean(0)), "it joins a mean over time steps"),
    (lambda m, h, x: h.mean(0) * h, "it joins a mean over time steps"),
    (lambda m, h, x: m.fc2(h.mean(0).unsqueeze(1)), "a layout operation after a mean over time"),
    (lambda m, h, x: m.fc2(x.mean(0)) + m.fc3(h).mean(0), "it averages the network input"),
    (lambda m, h, x: h + h[..., :1], r"it adds values of the shapes \[\(16,\), \(1,\)\]"),
    (lambda m, h, x: h * h[:, :, None, None],   # [T, N, 16] * [T, N, 1, 1, 16]: [T, N, T, N, 16]
     r"samples of the shapes \[\(16,\), \(1, 1, 16\)\], of different ranks"),
    (lambda m, h, x: m.fc2(h / 3), "it divides by 3, which is not a positive power of two"),
])
def test_what_the_review_found_is_refused_by_name(tail, message):
    with pytest.raises(ExportError, match=message):
        _tail_export(tail)


def test_a_value_read_before_and_after_its_mean_over_time_stays_per_step():
    """The mean over time is a value of its own: another reader of the averaged tensor still
    runs per step (the mean used to relabel the tensor itself)."""
    q, x, desc = _tail_export(lambda m, h, x: (h.mean(0), m.fc3(h))[1])
    assert not desc.output_time_mean
    assert compare_integer(q, x, desc).output == 1.0
