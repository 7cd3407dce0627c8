"""Issue 47: the shapes of an integer network file are checked at load, against the input shape
the file holds (``IntegerNetwork.input_shape``), in integers: a hand-edited gather index, matmul
``inner``, sum dimensions or count, reshape, or input shape is refused by ``load_integer``
naming the operation and the field, with peak memory bounded (nothing allocated in proportion to
a declared size). ``infer_shapes`` is checked against the simulator's own shapes."""

import json
import math

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

from snnquant import QuantConfig, quantize_model
from snnquant.export import (IntegerNetworkError, GatherOp, IntegerSNN, MatMulOp, ReduceOp,
                             load_integer, save_integer, to_integer)
from snnquant.export.backends.simulator import op_shapes
from snnquant.export.ir.shapes import MAX_SAMPLE_ELEMENTS, infer_shapes
from test_input_bounds import _bounded

T = 2


class _Attention(nn.Module):
    """One spiking layer, then a reshape, a transpose (a gather with an index), a matrix product
    and a sum over a dimension: every operation whose shapes need the input's."""

    def __init__(self):
        super().__init__()
        self.fc, self.sn = layer.Linear(16, 16), neuron.IFNode(v_threshold=0.5)

    def forward(self, x):
        h = self.sn(self.fc(x)).reshape(x.shape[0], x.shape[1], 4, 4)
        return (h @ h.transpose(-1, -2)).sum(-1)


def _export():
    torch.manual_seed(0)
    net = _Attention()
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    x = (torch.rand(T, 2, 16, generator=torch.Generator().manual_seed(3)) > 0.3).float()
    sjf.reset_net(q)
    q.train()(x)
    q.eval()
    return x, to_integer(q, example_input=x, input_max=1)


def _first(desc, kind, indexed=None):
    return next(i for i, op in enumerate(desc.ops) if isinstance(op, kind) and (
        indexed is None or (op.index is not None) == indexed))


def _rewrite(path, edit_ops=None, edit_meta=None, edit_tensors=None):
    """Rewrite the file's description (and tensors) with a recomputed checksum: what anyone can
    do to a file."""
    from snnquant.export.backends import files

    data = path.read_bytes()
    meta, _ = files._read_header(data, str(path))
    meta = dict(meta)
    record = json.loads(meta["description"])
    if edit_ops is not None:
        edit_ops(record["ops"])
    if edit_meta is not None:
        edit_meta(record)
    meta["description"] = json.dumps(record, sort_keys=True)
    tensors = dict(files._safetensors().load(data))
    if edit_tensors is not None:
        edit_tensors(tensors)
    meta.pop(files._CHECKSUM_KEY)
    path.write_bytes(files._serialize(tensors, meta))


@pytest.fixture(scope="module")
def exported():
    return _export()


@pytest.fixture
def saved(exported, tmp_path):
    x, desc = exported
    path = tmp_path / "attention.safetensors"
    save_integer(desc, path)
    return path, desc


def test_the_export_holds_its_input_shape_and_the_file_keeps_it(exported, tmp_path):
    x, desc = exported
    assert desc.input_shape == (16,)
    kinds = {type(op) for op in desc.ops}
    assert {GatherOp, MatMulOp, ReduceOp} <= kinds
    path = tmp_path / "a.safetensors"
    save_integer(desc, path)
    back = load_integer(path)
    assert back.input_shape == (16,)
    assert torch.equal(IntegerSNN(back)(x.long()), IntegerSNN(desc)(x.long()))


def test_infer_shapes_equals_the_simulators_shapes(exported):
    _, desc = exported
    assert infer_shapes(desc, (16,)) == op_shapes(desc, (16,))


def _load_refused(path, match):
    out = _bounded(f"import snnquant.export; snnquant.export.load_integer({str(path)!r})")
    assert out.startswith("ValueError:") and str(path) in out, out
    for part in match:
        assert part in out, out
    return out


def test_a_gather_index_beyond_its_input_is_refused_at_load(saved):
    path, desc = saved
    g = _first(desc, GatherOp, indexed=True)
    key = f"ops.{g}.index"

    def edit(tensors):
        tensors[key] = tensors[key].clone()
        tensors[key][0] = 16                 # a sample of 16 values: positions 0..15
    _rewrite(path, edit_tensors=edit)
    _load_refused(path, [f"operation {g} ", "index=", "position 16"])


def test_a_reshape_that_does_not_fit_is_refused_at_load(saved):
    """The reshape (a gather without index) of the 16 spikes to (4, 4), edited to (5, 4)."""
    path, desc = saved
    r = _first(desc, GatherOp, indexed=False)

    def edit(ops):
        ops[r]["shape"] = [5, 4]
    _rewrite(path, edit_ops=edit)
    _load_refused(path, [f"operation {r} ", "shape=(5, 4)", "reshape keeps the 16 values"])


def test_a_transposed_reshape_that_does_not_fit_is_refused_at_load(saved):
    """The transpose (a gather with an index) edited to (2, 8) keeps its 16 positions, but the
    matrix product after it no longer has 4 values to sum over."""
    path, desc = saved
    g = _first(desc, GatherOp, indexed=True)
    m = _first(desc, MatMulOp)

    def edit(ops):
        ops[g]["shape"] = [2, 8]
    _rewrite(path, edit_ops=edit)
    _load_refused(path, [f"operation {m} ", "inner=4", "(4, 4) and (2, 8)"])


def test_a_matmul_inner_length_edit_is_refused_at_load(saved):
    path, desc = saved
    m = _first(desc, MatMulOp)

    def edit(ops):
        ops[m]["inner"] = 5
    _rewrite(path, edit_ops=edit)
    _load_refused(path, [f"operation {m} ", "inner=5", "over 4 and 4 values"])


@pytest.mark.parametrize("field, value, said", [("dims", [2], "a sample has 2 dimensions"),
                                                ("count", 5, "sum 4 values, not 5")])
def test_a_sum_dims_or_count_edit_is_refused_at_load(saved, field, value, said):
    path, desc = saved
    r = _first(desc, ReduceOp)

    def edit(ops):
        ops[r][field] = value
    _rewrite(path, edit_ops=edit)
    _load_refused(path, [f"operation {r} ", f"{field}=", said])


@pytest.mark.parametrize("shape, said", [
    ([10 ** 12], "input_shape=(1000000000000,)"),            # absurd: refused before anything
    ([10 ** 6, 10 ** 6], "more than MAX_SAMPLE_ELEMENTS"),
    ([32], "operation 0 ('fc') has weight="),                  # consistent-looking, wrong
    ([4, 4], "operation 0 ('fc') has weight="),
    ([0], "input_shape"), ([1.5], "input_shape"), ("16", "input_shape"), ([], "input_shape"),
    ([True], "input_shape")])
def test_an_edited_input_shape_is_refused_at_load(saved, shape, said):
    path, _ = saved

    def edit(record):
        record["input_shape"] = shape
    _rewrite(path, edit_meta=edit)
    _load_refused(path, [said])


def test_a_file_without_its_input_shape_needs_one_for_these_operations(saved, exported):
    """An older file (or one whose input_shape was removed) that holds a gather, a sum or a
    matmul is refused with what to do; given the shape, it loads and is checked with it."""
    path, desc = saved
    x, _ = exported
    _rewrite(path, edit_meta=lambda record: record.pop("input_shape"))
    with pytest.raises(ValueError, match="no input_shape.*load_integer\\(path, input_shape="):
        load_integer(path)
    back = load_integer(path, input_shape=(16,))
    assert back.input_shape == (16,)
    assert torch.equal(IntegerSNN(back)(x.long()), IntegerSNN(desc)(x.long()))
    with pytest.raises(IntegerNetworkError, match="operation 0 \\('fc'\\) has weight="):
        load_integer(path, input_shape=(15,))
    with pytest.raises(ValueError, match="input_shape must be"):
        load_integer(path, input_shape=(0,))
    good = path.with_name("good.safetensors")
    save_integer(desc, good)
    with pytest.raises(IntegerNetworkError, match="holds input_shape=\\(16,\\), not the given"):
        load_integer(good, input_shape=(4, 4))


def test_save_refuses_such_a_network_without_its_input_shape(exported, tmp_path):
    import dataclasses
    _, desc = exported
    bare = dataclasses.replace(desc, input_shape=None)
    with pytest.raises(IntegerNetworkError, match="cannot be written.*no input_shape"):
        save_integer(bare, tmp_path / "bare.safetensors")
    assert not (tmp_path / "bare.safetensors").exists()


def test_a_sequence_without_an_input_shape_still_loads(tmp_path):
    """Networks traced without an example input (the default) hold no input shape; their shapes
    follow from the input alone and are checked for each input shape at the first run."""
    from test_export_io import conv_net
    q = conv_net()
    desc = to_integer(q)
    assert desc.input_shape is None
    save_integer(desc, tmp_path / "c.safetensors")
    assert load_integer(tmp_path / "c.safetensors").input_shape is None


def test_an_oversized_value_inside_the_network_is_refused_in_integers(exported):
    """A reshape to more values than MAX_SAMPLE_ELEMENTS is refused by size before anything is
    allocated (infer_shapes runs before op_shapes sends a sample)."""
    import copy
    _, desc = exported
    bad = copy.deepcopy(desc)
    big = (1 << 15, 1 << 14)
    assert math.prod(big) > MAX_SAMPLE_ELEMENTS
    bad.input_shape = big
    with pytest.raises(IntegerNetworkError, match="MAX_SAMPLE_ELEMENTS"):
        infer_shapes(bad, big)


def test_a_valid_file_loads_within_the_memory_bound(saved):
    """Reading a file allocates what the file holds, not the 1 GiB a file may have (a single
    read(limit) reserved the whole bound first: MemoryError under a 256 MiB address-space limit)."""
    import os
    import subprocess
    import sys
    from _repo import ROOT
    from test_input_bounds import BOUNDED

    path, _ = saved
    code = f"import snnquant.export; snnquant.export.load_integer({str(path)!r})"
    done = subprocess.run([sys.executable, "-c", BOUNDED, code], capture_output=True, text=True,
                          timeout=120, cwd=str(ROOT), env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.stdout.strip() == "no error", done.stdout + done.stderr
