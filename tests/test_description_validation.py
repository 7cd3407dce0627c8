"""One check of an IntegerNetwork (issue 35 §1): a description edited so that it disagrees with
itself is refused by every entry (load_integer, save_integer, IntegerSNN, to_c, to_nir, from_nir),
naming the operation's index and name, the field and the value."""
import dataclasses
import re

import pytest
import torch
import torch.nn as nn

import snnquant.nn as qnn
from snnquant.export import (IntegerNetworkError, IntegerNetwork, IntegerSNN, check_network,
                             load_integer, save_integer, to_c, to_integer)
from snnquant.export.backends import files as export_files
from snnquant.export.backends.simulator import op_shapes
from test_export_graph import _InputSkip   # sn(fc(x) + x): join shifts (0, 3)


class _Branches(nn.Module):
    """sn(a(x) + b(x)) with two 2-d convolutions, or with ``kind='and'`` sn(a(x)) * b(x)."""

    def __init__(self, step_b=2.0 ** -3):
        super().__init__()
        torch.manual_seed(5)
        self.a = qnn.QuantConv2d(2, 4, 3, padding=1, bias=False, step_mode="m",
                                 weight_quant=qnn.UniformQuantizer(8, step=2.0 ** -3))
        self.b = qnn.QuantConv2d(2, 4, 3, padding=1, bias=False, step_mode="m",
                                 weight_quant=qnn.UniformQuantizer(8, step=step_b))
        self.sn = qnn.QuantIFNode(v_quant=qnn.UniformQuantizer(8, step=2.0 ** -4), step_mode="m")
        with torch.no_grad():
            self.a.weight.uniform_(-0.3, 0.6)
            self.b.weight.uniform_(-0.3, 0.6)

    def forward(self, x):
        return self.sn(self.a(x) + self.b(x))


def _edited(desc, index, **changes):
    """``desc`` with operation ``index``'s fields replaced, bypassing the check (as a user who
    edits ``desc.ops`` in place does)."""
    ops = list(desc.ops)
    op = ops[index]
    ops[index] = dataclasses.replace(op, **changes) if changes else op
    out = object.__new__(IntegerNetwork)
    out.__dict__.update({**desc.__dict__, "ops": ops})
    return out


def _saved_unchecked(desc, path, monkeypatch):
    """Write ``desc`` with a valid checksum although it is inconsistent (the issue's case:
    edited in Python, then saved)."""
    with monkeypatch.context() as m:
        m.setattr(export_files, "check_network", lambda desc: None)
        save_integer(desc, path)
    return path


def _join_desc():
    return to_integer(_Branches().eval(), input_max=1)


def _refused_everywhere(desc, match, tmp_path, monkeypatch, input_shape, shapes_only=False):
    """Every entry refuses ``desc`` with ``match`` (``shapes_only``: what is wrong shows only
    with an input shape, so save_integer and load_integer, which have none, let it pass and the
    loaded network is refused at its first call)."""
    x = torch.zeros((2, 1) + tuple(input_shape), dtype=torch.int64)
    with pytest.raises(IntegerNetworkError, match=match):
        check_network(desc)
        op_shapes(desc, input_shape)
    with pytest.raises(IntegerNetworkError, match=match):
        IntegerSNN(desc)(x)
    with pytest.raises(IntegerNetworkError, match=match):
        IntegerSNN(desc, synapse_arithmetic="auto")(x)
    with pytest.raises(IntegerNetworkError, match=match):
        to_c(desc, tmp_path / "c", input_shape=input_shape)
    assert not (tmp_path / "c").exists() or not list((tmp_path / "c").iterdir())
    if not shapes_only:
        with pytest.raises(IntegerNetworkError, match=match):
            save_integer(desc, tmp_path / "refused.safetensors")
        assert not (tmp_path / "refused.safetensors").exists()
    path = _saved_unchecked(desc, tmp_path / "edited.safetensors", monkeypatch)
    try:
        loaded = load_integer(path)
    except IntegerNetworkError as exc:
        assert not shapes_only and "edited.safetensors" in str(exc)
        assert re.search(match, str(exc)), str(exc)
    else:
        assert shapes_only
        with pytest.raises(IntegerNetworkError, match=match):
            IntegerSNN(loaded)(x)
    pytest.importorskip("nir")
    from snnquant.export import to_nir
    with pytest.raises(IntegerNetworkError, match=match):
        to_nir(desc, input_shape)


def test_join_of_operands_with_different_shapes_is_refused(tmp_path, monkeypatch):
    desc = _join_desc()
    b = desc.ops.index(desc.layer("b"))
    # b now gives [4, 1, 1] where a gives [4, 8, 8]: broadcast silently before
    bad = _edited(desc, b, stride=(8, 8), padding=(0, 0))
    _refused_everywhere(bad, r"does not fit operation 2 \('add'\).*shapes \[\(4, 8, 8\), "
                             r"\(4, 1, 1\)\]", tmp_path, monkeypatch, (2, 8, 8), shapes_only=True)


def test_join_shifts_that_do_not_align_the_grids_are_refused(tmp_path, monkeypatch):
    desc = to_integer(_InputSkip().eval(), input_max=3)
    join = desc.ops.index(desc.layer("add"))
    assert desc.ops[join].shifts == (0, 3)
    bad = _edited(desc, join, shifts=(0, 0))
    _refused_everywhere(bad, r"operation 1 \('add'\) has shifts=\(0, 0\): they must put the "
                             r"operands' fractional bits \[3, 0\] on out_frac_bits=3",
                        tmp_path, monkeypatch, (8,))


def test_and_join_of_a_current_is_refused(tmp_path, monkeypatch):
    desc = _join_desc()
    join = desc.ops.index(desc.layer("add"))
    bad = _edited(desc, join, kind="and", shifts=(0, 0), out_frac_bits=0)
    _refused_everywhere(bad, r"operation 2 \('add'\) has kind='and': it joins spikes \(0/1\), "
                             r"but operand 0 holds values in \[-\d+, \d+\]",
                        tmp_path, monkeypatch, (2, 8, 8))


@pytest.mark.parametrize("field, value, match", [
    ("threshold", 300, r"has threshold=300: it must be an int in \[-128, 128\]"),
    ("v_min", 200, r"has v_min=200: it must be an int in \[-128, 255\]|has v_max=127: with "
                   r"v_min=200"),
    ("v_max", -100, r"has v_max=-100: with v_min=-128 it is not a range|has v_reset=0"),
    ("v_reset", -129, r"has v_reset=-129: it must be an int in \[-128, 127\]"),
    ("grid_shift", 1 << 70, r"has grid_shift=1180591620717411303424: it must be an int in "
                            r"\[0, 62\]"),
    ("leak_multiplier", 3, r"has leak_multiplier=3: it must be an int in \[1, 1\]"),
    ("in_frac_bits", 0, r"has in_frac_bits=0: it must be 3, the fractional bits of the current"),
])
def test_neuron_fields_are_checked(field, value, match, tmp_path, monkeypatch):
    desc = to_integer(_InputSkip().eval(), input_max=3)
    sn = desc.ops.index(desc.layer("sn"))
    if field == "leak_multiplier":
        bad = _edited(desc, sn)
        object.__setattr__(bad.ops[sn], field, value)   # the dataclass refuses it itself
    else:
        bad = _edited(desc, sn, **{field: value})
    _refused_everywhere(bad, r"operation 2 \('sn'\) " + match, tmp_path, monkeypatch, (8,))


def test_v_min_above_v_max_is_refused(tmp_path, monkeypatch):
    desc = to_integer(_InputSkip().eval(), input_max=3)
    sn = desc.ops.index(desc.layer("sn"))
    bad = _edited(desc, sn, v_min=100, v_max=50, v_reset=60, v_init=60, threshold=60)
    _refused_everywhere(bad, r"operation 2 \('sn'\) has v_max=50: with v_min=100 it is not a "
                             r"range of 8-bit integers", tmp_path, monkeypatch, (8,))


def test_malformed_descriptions_give_named_errors_not_raw_ones(tmp_path, monkeypatch):
    desc = to_integer(_InputSkip().eval(), input_max=3)
    # KeyError before: an operation reading a later one
    bad = _edited(desc, 0, inputs=(2,))
    _refused_everywhere(bad, r"operation 0 \('fc'\) has inputs=\(2,\): each must be an earlier",
                        tmp_path, monkeypatch, (8,))
    # "mat1 and mat2 shapes cannot be multiplied" before: weights of another width
    fc = desc.layer("fc")
    bad = _edited(desc, 0, weight=fc.weight[:, :5].clone(), weight_packed=None)
    _refused_everywhere(bad, r"input_shape=\(8,\) does not fit operation 0 \('fc'\)",
                        tmp_path, monkeypatch, (8,), shapes_only=True)
    # after a synapse, the features are known without an input shape: refused at load
    two = to_integer(torch.nn.Sequential(
        qnn.QuantLinear(8, 6, step_mode="m", weight_quant=qnn.UniformQuantizer(8, step=2.0 ** -3)),
        qnn.QuantIFNode(v_quant=qnn.UniformQuantizer(8, step=2.0 ** -4), step_mode="m"),
        qnn.QuantLinear(6, 4, step_mode="m", weight_quant=qnn.UniformQuantizer(8, step=2.0 ** -3)),
        qnn.QuantIFNode(v_quant=qnn.UniformQuantizer(8, step=2.0 ** -4), step_mode="m")).eval(),
        input_max=1)
    wide = two.ops[2].weight.repeat(1, 2)
    _refused_everywhere(_edited(two, 2, weight=wide, weight_packed=None),
                        r"operation 2 \('2'\) has weight=<tensor of shape \(4, 12\)>: of shape "
                        r"\(4, 12\) reads 12 features, the value it reads has 6",
                        tmp_path, monkeypatch, (8,))
    # OverflowError before: a shift beyond int64
    shift = fc.shift.clone()
    shift[0] = 70
    _refused_everywhere(_edited(desc, 0, shift=shift), r"operation 0 \('fc'\) has shift=.*"
                                                       r"holds 70, outside \[0, 62\]",
                        tmp_path, monkeypatch, (8,))
    # weights outside their bit width
    weight = fc.weight.to(torch.int16)
    weight[0, 0] = 1000
    _refused_everywhere(_edited(desc, 0, weight=weight, weight_packed=None),
                        r"operation 0 \('fc'\) has weight=.*holds 1000, outside the 8-bit range",
                        tmp_path, monkeypatch, (8,))


def test_construction_checks_the_inputs_and_the_exported_network_passes():
    desc = to_integer(_InputSkip().eval(), input_max=3)
    with pytest.raises(IntegerNetworkError, match=r"operation 0 \('fc'\) has inputs=\(1,\)"):
        IntegerNetwork(ops=[dataclasses.replace(desc.ops[0], inputs=(1,))] + desc.ops[1:],
                       input_max=3, output_kind="spikes")
    assert isinstance(IntegerNetworkError("x"), ValueError)
    check_network(desc)   # the exported network itself passes
    assert op_shapes(desc, (8,))[-1][1] == (8,)


def test_from_nir_refuses_what_the_description_check_refuses(tmp_path):
    pytest.importorskip("nir")
    from snnquant.export import NIRImportError, from_nir, to_nir
    desc = to_integer(_InputSkip().eval(), input_max=3)
    graph = to_nir(desc, (8,))
    node = graph.nodes["sn"]
    unit = float(node.metadata["membrane_unit"])
    node.metadata["threshold_int"] = 300            # above v_max, the NIR threshold to match
    node.v_threshold = node.v_threshold * 0 + (300 - 0.5) * unit
    with pytest.raises((NIRImportError, IntegerNetworkError), match=r"'sn'.*threshold.*300"):
        from_nir(graph)


# ---- issue 47, C: sizes bounded at load, before anything is allocated ---------------------------
def _conv_pool_desc():
    from test_export_io import conv_net

    return to_integer(conv_net())


def _index_of(desc, cls, **where):
    return next(i for i, op in enumerate(desc.ops) if isinstance(op, cls) and all(
        getattr(op, k) == v for k, v in where.items()))


def test_sizes_that_would_allocate_are_refused_at_load(tmp_path, monkeypatch):
    """A PoolOp output_size of 2^24, a sum-pool kernel of 2^14 and a conv padding of 2048 load
    today and allocate gigabytes at the first run: refused by check_network (and so by
    load_integer), naming the field, against the documented bound."""
    from snnquant.export.ir.network import PoolOp, SynapseOp
    from snnquant.export.ir.validation import MAX_EXTENT

    desc = _conv_pool_desc()
    pool = _index_of(desc, PoolOp)
    conv = _index_of(desc, SynapseOp, kind="conv2d")
    k = 1 << 14
    cases = [(pool, dict(output_size=(1 << 24, 1 << 24)), "output_size"),
             (pool, dict(kind="sum", kernel_size=(k, k), stride=(k, k), frac_bits_added=28),
              "kernel_size"),
             (conv, dict(padding=(2048, 2048)), "padding")]
    for index, changes, field in cases:
        bad = _edited(desc, index, **changes)
        with pytest.raises(IntegerNetworkError, match=rf"operation {index} .* has {field}="):
            check_network(bad)
        path = _saved_unchecked(bad, tmp_path / f"{field}.safetensors", monkeypatch)
        with pytest.raises(IntegerNetworkError, match=field):
            load_integer(path)
    assert MAX_EXTENT >= 64


def test_a_gather_index_beyond_the_bound_is_refused():
    from snnquant.export.ir.network import GatherOp

    op = GatherOp(name="g", shape=(2,), index=torch.tensor([0, 2 ** 62]))
    desc = _edited(_conv_pool_desc(), 0)
    desc.ops = list(desc.ops) + [dataclasses.replace(op, inputs=())]
    with pytest.raises(IntegerNetworkError, match="index"):
        check_network(desc)
