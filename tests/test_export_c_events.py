"""The event-driven form of the C runtime (``to_c(..., synapses='events')``) at its edges: index
lists of spikes when a layer fires every neuron or none, and kernel stamps of events on every
border position of a convolution; compared with ``IntegerSNN`` (strict flags, UBSan)."""
import dataclasses

import pytest
import torch

from snnquant.export import IntegerNetwork, IntegerSNN, NeuronOp, SynapseOp, c_memory

from test_export_c import _mlp_desc, assert_same, build


def _first_neuron(desc):
    return next(i for i, op in enumerate(desc.ops) if isinstance(op, NeuronOp))


def _firing(desc, fires):
    """``desc`` with its first neuron layer's threshold set so that it fires at every step
    (``'all'``: the threshold is ``v_min``), never (``'none'``: above ``v_max``) or as exported
    (``'some'``); returns the description and that layer's operation."""
    k = _first_neuron(desc)
    op = desc.ops[k]
    threshold = {"all": op.v_min, "none": op.v_max + 1, "some": op.threshold}[fires]
    ops = list(desc.ops)
    ops[k] = dataclasses.replace(op, threshold=threshold)
    return dataclasses.replace(desc, ops=ops), ops[k]


@pytest.mark.parametrize("arch,stride", [("mlp", 1), ("conv", 1), ("conv", 2), ("conv1d", 2)])
@pytest.mark.parametrize("fires", ["all", "none", "some"])
def test_index_list_of_a_layer_that_fires_all_none_or_some(arch, stride, fires, tmp_path):
    """The hidden layer's spikes feed only a linear layer, so they travel as an index list (its
    count and the indices): with every neuron firing (the list full: count = size), none (empty)
    and some, the C model equals IntegerSNN, and RAM_BYTES counts the list."""
    desc = _mlp_desc(arch=arch, stride=stride, pool=None)
    desc, op = _firing(desc, fires)
    shape = {"mlp": (12,), "conv": (2, 6, 6), "conv1d": (2, 8)}[arch]
    x = torch.randint(0, 3, (5, 6) + shape, generator=torch.Generator().manual_seed(1))
    _, layers = IntegerSNN(desc)(x, record=True)
    spikes = layers[op.name]
    if fires == "all":
        assert bool((spikes == 1).all())
    elif fires == "none":
        assert not bool(spikes.any())
    else:
        assert 0 < float(spikes.float().mean()) < 1
    exe = build(desc, tmp_path / "events", input_shape=shape)
    assert assert_same(desc, exe, x) == 1.0
    n = spikes[0, 0].numel()
    header = (tmp_path / "events" / "snn.h").read_text()
    k = _first_neuron(desc)
    assert f"int16_t a{k}[{n + 1}];" in header or f"uint8_t a{k}[{n + 1}];" in header
    events = c_memory(desc, shape)
    dense = c_memory(desc, shape, synapses="dense")
    # n + 1 list entries against n spike bytes, each buffer rounded up to 8 bytes
    assert events.list_bytes >= 0 and dense.list_bytes == 0
    assert events.ram_bytes == dense.ram_bytes + events.scratch_bytes + events.list_bytes
    assert f"#define SNN_RAM_BYTES {events.ram_bytes}\n" in header


def _conv_desc(kind, weight, stride, padding, dilation, groups, input_max):
    """One convolution whose currents are the output (units of the accumulator)."""
    c_out = weight.shape[0]
    op = SynapseOp(name="conv", kind=kind, weight=weight, weight_bits=8,
                   weight_scale=torch.ones(c_out), multiplier=torch.ones(c_out, dtype=torch.int64),
                   shift=torch.zeros(c_out, dtype=torch.int64), bias=None, bias_bits=None,
                   in_frac_bits=0, out_frac_bits=0, stride=stride, padding=padding,
                   dilation=dilation, groups=groups)
    return IntegerNetwork(ops=[op], input_max=input_max, output_kind="current",
                          output_frac_bits=0)


@pytest.mark.parametrize("stride,padding,dilation,groups", [
    ((1, 1), (1, 1), (1, 1), 1), ((2, 2), (1, 1), (1, 1), 1), ((1, 2), (2, 0), (2, 1), 2),
    ((2, 1), (0, 2), (1, 2), 1), ((1, 1), "same", (2, 2), 1), ((3, 2), (1, 2), (1, 1), 2)])
@pytest.mark.parametrize("scale", [1, 13_000])
def test_conv_stamp_of_an_event_at_every_position(stride, padding, dilation, groups, scale,
                                                  tmp_path):
    """One event per sample, at every input position (borders and corners included), of value
    -3..3 times ``scale`` (event counts, not only spikes; 39,000 does not fit the int16_t the
    stamp multiplies in when input_max allows it): the event-driven stamp, clipped at the
    borders once per event, gives IntegerSNN's currents at every output, as the dense form
    does."""
    c_in, h, w = 4, 5, 6
    weight = torch.arange(1, 4 * (c_in // groups) * 3 * 3 + 1).reshape(4, c_in // groups, 3, 3)
    weight = (weight % 15 - 7).to(torch.int64)
    desc = _conv_desc("conv2d", weight, stride, padding, dilation, groups, input_max=3 * scale)
    n = c_in * h * w
    x = torch.zeros(1, n, c_in, h, w, dtype=torch.int64)
    x.view(1, n, n)[0, torch.arange(n), torch.arange(n)] = (torch.arange(n) % 7 - 3) * scale
    x[0, 3::7] = 0          # a few samples without any event
    assert int(IntegerSNN(desc)(x).abs().sum()) > 0
    for form in ("events", "dense"):
        exe = build(desc, tmp_path / form, input_shape=(c_in, h, w), synapses=form)
        assert assert_same(desc, exe, x) == 1.0, form


def test_conv1d_stamp_of_an_event_at_every_position(tmp_path):
    weight = (torch.arange(3 * 2 * 4).reshape(3, 2, 4) % 9 - 4).to(torch.int64)
    desc = _conv_desc("conv1d", weight, (2,), (3,), (1,), 1, input_max=2)
    n = 2 * 9
    x = torch.zeros(1, n, 2, 9, dtype=torch.int64)
    x.view(1, n, n)[0, torch.arange(n), torch.arange(n)] = 2 - 2 * (torch.arange(n) % 3)
    exe = build(desc, tmp_path, input_shape=(2, 9))
    assert assert_same(desc, exe, x) == 1.0


@pytest.mark.parametrize("fires", ["all", "none", "some"])
def test_max_pool_of_spikes_travels_as_an_index_list(fires, tmp_path):
    """A max pool of spikes (its output is spikes) that only a linear layer reads writes an
    index list, also when every window or none holds a spike; a max pool of currents (values
    beyond 0/1) keeps its buffer."""
    desc = _mlp_desc(arch="conv", pool="max")
    desc, op = _firing(desc, fires)
    pool = next(i for i, o in enumerate(desc.ops) if o.__class__.__name__ == "PoolOp")
    x = torch.randint(0, 3, (5, 6, 2, 6, 6), generator=torch.Generator().manual_seed(2))
    exe = build(desc, tmp_path / "events", input_shape=(2, 6, 6))
    assert assert_same(desc, exe, x) == 1.0
    n = 4 * 3 * 3      # 4 channels, 6 x 6 pooled by 3 with stride 2 and padding 1
    header = (tmp_path / "events" / "snn.h").read_text()
    assert f"uint8_t a{pool}[{n + 1}];" in header
    current = _mlp_desc(arch="conv", pool="max_current")
    pool = next(i for i, o in enumerate(current.ops) if o.__class__.__name__ == "PoolOp")
    build(current, tmp_path / "current", input_shape=(2, 6, 6))
    text = (tmp_path / "current" / "snn.h").read_text()
    assert f"int32_t a{pool}[{n}];" in text and f"a{pool}[{n + 1}]" not in text


def test_neuron_registers_take_the_narrowest_type_the_bounds_allow(tmp_path):
    """A neuron layer's registers are int16_t when every proven bound is below 2^14, int32_t
    below 2^30, int64_t otherwise (NeuronProgram.c_type); the C model is exact with each."""
    from snnquant.export.ir.program import neuron_program

    program = neuron_program(next(op for op in _mlp_desc().ops if isinstance(op, NeuronOp)))
    assert program.c_type((-100, 100)) == "int16_t"
    assert program.c_type((-(1 << 20), 1 << 20)) == "int32_t"
    assert program.c_type((-(1 << 40), 1 << 40)) == "int64_t"
    x = torch.randint(0, 4, (6, 5, 12), generator=torch.Generator().manual_seed(3))
    for v_bits, c_type in ((8, "int16_t"), (16, "int32_t")):
        desc = _mlp_desc(v_bits=v_bits)
        exe = build(desc, tmp_path / c_type)
        assert assert_same(desc, exe, x) == 1.0
        source = (tmp_path / c_type / "snn.c").read_text()
        assert f"const {c_type} q_round = " in source, c_type


@pytest.mark.parametrize("kind,decay_input,soft", [("lif", True, False), ("lif", False, True),
                                                   ("if", True, False)])
def test_currents_beyond_the_saturating_range_are_clamped_exactly(kind, decay_input, soft,
                                                                  tmp_path):
    """Inputs up to 2^22 give currents far beyond what a membrane of 8 bits can take in: the C
    model clamps the current to NeuronProgram.saturating_range (outside it the charge saturates
    for every membrane), computes the neuron in int16_t, and still equals IntegerSNN, with
    currents beyond both ends of the range."""
    from snnquant.export.ir.program import neuron_program

    desc = dataclasses.replace(_mlp_desc(kind=kind, decay_input=decay_input, soft=soft),
                               input_max=1 << 22)
    op = desc.ops[_first_neuron(desc)]
    program = neuron_program(op)
    lo, hi = program.saturating_range((-(1 << 40), 1 << 40))
    assert -(1 << 14) < lo < 0 < hi < (1 << 14)
    assert program.saturating_range((-3, 5)) == (-3, 5)      # nothing to clamp
    v = torch.arange(op.v_min, op.v_max + 1)                 # the charge is saturated beyond
    for a, b in ((hi, hi + 12345), (lo, lo - 12345)):
        at_a, at_b = program.run(v, torch.full_like(v, a)), program.run(v, torch.full_like(v, b))
        assert torch.equal(at_a[0], at_b[0]) and torch.equal(at_a[1], at_b[1])
    g = torch.Generator().manual_seed(4)
    x = torch.randint(-(1 << 22), 1 << 22, (6, 5, 12), generator=g)
    x[:, :2] //= 1 << 16          # two samples with smaller currents, inside the range
    exe = build(desc, tmp_path)
    assert assert_same(desc, exe, x) == 1.0
    source = (tmp_path / "snn.c").read_text()
    assert f"(acc < {lo} ? {lo} : (acc > {hi} ? {hi} : acc))" in source    # in <name>_fire
    assert "const int16_t q_round = " in source or "const int16_t h = " in source
