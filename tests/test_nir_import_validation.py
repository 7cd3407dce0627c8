"""from_nir validates every field before it allocates anything (issue 24, item 2).

Each bad file is made by exporting a small network with to_nir and editing one field of the NIR
graph (in memory, or in the written file with nir.write / h5py); each must raise one
NIRImportError naming the node, the field and the value.
"""

import time

import numpy as np
import pytest
import torch

from _nir_consumers import build_network

from snnquant.export import IntegerSNN, NIRImportError, from_nir, to_nir

nir = pytest.importorskip("nir")
h5py = pytest.importorskip("h5py")

DT = 1e-3


def _graph(arch="mlp", kind="lif"):
    desc, shape = build_network(arch, kind, 4, 0)
    return to_nir(desc, shape, dt=DT), desc, shape


def _refused(graph, *pieces):
    with pytest.raises(NIRImportError) as info:
        from_nir(graph)
    message = str(info.value)
    for piece in pieces:
        assert piece in message, message
    return message


def test_weight_outside_its_bit_width_is_refused_not_wrapped():
    graph, desc, _ = _graph()
    node = graph.nodes["0"]
    meta = node.metadata
    w = np.array(meta["weight_int"])
    w[0, 0] = 1000                                    # 4-bit layer: [-8, 7]
    meta["weight_int"] = w
    # made consistent: the NIR weight agrees with the edited integer
    scale = np.asarray(meta["weight_scale"]).reshape(-1, 1)
    node.weight = w * scale * float(meta["unit_factor"])
    _refused(graph, "node '0'", "weight_int", "1000", "[-8, 7]")


def test_unsigned_weights_keep_their_values():
    # an 8-bit layer with weights up to 200 is stored without wrapping (int16, not int8)
    graph, desc, _ = _graph("dense")
    node = graph.nodes["0"]
    meta = node.metadata
    w = np.abs(np.array(meta["weight_int"])) * 0 + 200
    meta["weight_int"], meta["weight_bits"] = w, 8
    node.weight = w * np.asarray(meta["weight_scale"]).reshape(-1, 1) * float(meta["unit_factor"])
    back = from_nir(graph)
    assert int(back.ops[0].weight.max()) == 200


@pytest.mark.parametrize("field,value,pieces", [
    ("input_shift", -1, ["input_shift=-1"]),
    ("v_bits", 1000, ["v_bits=1000", "[1, 32]"]),
    ("v_min", 5000, ["v_min=5000"]),
    ("v_reset_int", 99999, ["v_reset_int=99999"]),
    ("leak_shift", 100, ["leak_shift=100"]),
    ("leak_round_shift", 5, ["leak_round_shift=5"]),
    ("grid_shift", 70, ["grid_shift=70"]),
    ("decay_input", "yes", ["decay_input='yes'", "bool"]),
    ("membrane_scale", float("nan"), ["membrane_scale=nan"]),
    ("threshold_int", 1.5, ["threshold_int=1.5"]),
])
def test_neuron_fields_checked(field, value, pieces):
    graph, _, _ = _graph()
    graph.nodes["1"].metadata[field] = value
    _refused(graph, "node '1'", *pieces)


def test_v_min_above_v_max_is_refused():
    graph, _, _ = _graph()
    meta = graph.nodes["1"].metadata
    meta["v_min"], meta["v_max"] = 100, -100
    _refused(graph, "node '1'", "v_max=-100", "v_min=100")


@pytest.mark.parametrize("field,value,piece", [
    ("weight_bits", 0, "weight_bits=0"),
    ("weight_shift", np.array([-1] * 12), "weight_shift"),
    ("weight_multiplier", np.array([0] * 12), "weight_multiplier"),
    ("weight_scale", np.array([-0.5] * 12), "weight_scale"),
    ("bias_bits", 200, "bias_bits=200"),
    ("out_frac_bits", 5000, "out_frac_bits=5000"),
    ("in_frac_bits", 3, "in_frac_bits=3"),
])
def test_synapse_fields_checked(field, value, piece):
    graph, _, _ = _graph()
    graph.nodes["0"].metadata[field] = value
    _refused(graph, "node '0'", piece)


@pytest.mark.parametrize("dt", [0, 0.0, -1e-3, float("inf"), "1ms"])
def test_dt_checked(dt):
    graph, _, _ = _graph()
    graph.metadata["dt"] = dt
    _refused(graph, "graph metadata", "dt=")


@pytest.mark.parametrize("field,value", [
    ("input_max", -5), ("output_kind", "voltage"), ("mantissa_bits", 7),
    ("reference_dtype", "float8"), ("format_version", 99), ("output_frac_bits", 1.5),
])
def test_graph_fields_checked(field, value):
    graph, _, _ = _graph()
    graph.metadata[field] = value
    _refused(graph, "graph metadata", f"{field}=")


def test_shapes_checked_against_edges():
    graph, _, _ = _graph()
    # the second synapse must take the first neuron layer's 12 outputs
    graph.nodes["input"].input_type = {"input": np.array([15])}
    _refused(graph, "node '0'", "weight", "(15,)")
    graph, _, _ = _graph()
    node = graph.nodes["1"]
    node.v_threshold = np.ones(7)
    _refused(graph, "node '1'", "v_threshold", "(7,)", "(12,)")
    graph, _, _ = _graph("conv_pool")
    graph.nodes["3"].start_dim = 10 ** 9
    _refused(graph, "node '3'", "start_dim=1000000000")
    graph, _, _ = _graph("conv_pool")
    graph.nodes["2"].metadata["kernel_size"] = np.array([10 ** 6, 10 ** 6])
    graph.nodes["2"].kernel_size = np.array([10 ** 6, 10 ** 6])
    _refused(graph, "node '2'", "kernel_size")


def test_conv_input_shape_checked_against_edge():
    graph, _, _ = _graph("conv")
    graph.nodes["0"].input_shape = np.array([60000, 60000])
    _refused(graph, "node '0'", "input_shape=[60000, 60000]", "(6, 6)")


def test_huge_declared_shape_refused_before_reading(tmp_path):
    graph, _, _ = _graph()
    path = tmp_path / "huge.nir"
    nir.write(path, graph)
    with h5py.File(path, "r+") as f:
        del f["node/nodes/0/weight"]
        # 10^12 float64 values declared, nothing stored: the file stays small
        f.create_dataset("node/nodes/0/weight", shape=(10 ** 6, 10 ** 6), dtype="f8",
                         chunks=(1, 1024), compression="gzip")
    start = time.monotonic()
    with pytest.raises(NIRImportError, match=r"node '0': weight declares shape \(1000000, 1000000\)"):
        from_nir(path)
    assert time.monotonic() - start < 5


def test_huge_input_shape_refused():
    graph, _, _ = _graph()
    graph.nodes["input"].input_type = {"input": np.array([10 ** 5, 10 ** 5])}
    _refused(graph, "node 'input'", "input_type")


def test_unknown_node_type_named(tmp_path):
    graph, _, _ = _graph()
    path = tmp_path / "foo.nir"
    nir.write(path, graph)
    with h5py.File(path, "r+") as f:
        del f["node/nodes/1/type"]
        f["node/nodes/1/type"] = b"Foo"
    with pytest.raises(NIRImportError, match=r"node '1': type='Foo' is not a NIR node type"):
        from_nir(path)


def test_unknown_snnquant_op_named():
    graph, _, _ = _graph()
    graph.nodes["1"].metadata["snnquant_op"] = "dendrite"
    _refused(graph, "node '1'", "snnquant_op='dendrite'")


def test_edited_file_still_round_trips_when_valid(tmp_path):
    graph, desc, shape = _graph("conv_pool")
    path = tmp_path / "ok.nir"
    nir.write(path, graph)
    back = from_nir(path)
    x = torch.randint(0, 2, (6, 4) + tuple(shape))
    assert torch.equal(IntegerSNN(back)(x), IntegerSNN(desc)(x))


def test_many_compressed_datasets_are_bounded_in_total(tmp_path):
    """Issue 35 §5: twelve gzip datasets of 2^26 float64 each (a small file) passed the per-array
    check and allocated 6 GiB; the total is bounded (nir_import.MAX_BYTES, max_bytes=)."""
    from snnquant.export.frontend import nir_import
    graph, _, _ = _graph()
    path = tmp_path / "many.nir"
    nir.write(path, graph)
    with h5py.File(path, "r+") as f:
        for i in range(12):
            f.create_dataset(f"node/nodes/0/metadata/extra{i}", shape=(nir_import.MAX_ELEMENTS,),
                             dtype="f8", chunks=(1 << 16,), compression="gzip")
    assert path.stat().st_size < 1 << 20
    start = time.monotonic()
    with pytest.raises(NIRImportError, match=r"hold \d+ elements \(\d+ bytes as 64-bit values\), "
                                             r"more than max_bytes=1073741824.*max_bytes="):
        from_nir(path)
    assert time.monotonic() - start < 5
    small = tmp_path / "small.nir"
    nir.write(small, graph)
    with pytest.raises(NIRImportError, match=r"more than max_bytes=1000 "):
        from_nir(small, max_bytes=1000)
    assert from_nir(small, max_bytes=1 << 20).ops       # raised enough: read
    with pytest.raises(ValueError, match=r"max_bytes must be an int >= 1, got 0"):
        from_nir(small, max_bytes=0)


@pytest.mark.parametrize("link", ["external", "soft"])
def test_links_are_refused_not_followed(tmp_path, link):
    """Issue 35 §5: an HDF5 external link to a 2^30-element dataset in another file was not seen
    by the pre-scan and allocated 8 GiB."""
    graph, _, _ = _graph()
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f.create_dataset("big", shape=(1 << 30,), dtype="f8", chunks=(1 << 16,),
                         compression="gzip")
    path = tmp_path / "linked.nir"
    nir.write(path, graph)
    with h5py.File(path, "r+") as f:
        del f["node/nodes/0/weight"]
        if link == "external":
            f["node/nodes/0/weight"] = h5py.ExternalLink(str(other), "big")
        else:
            f.create_dataset("node/nodes/0/metadata/big", shape=(1 << 20,), dtype="f8")
            f["node/nodes/0/weight"] = h5py.SoftLink("/node/nodes/0/metadata/big")
    start = time.monotonic()
    with pytest.raises(NIRImportError, match=rf"'node/nodes/0/weight' is an? {link} link to"):
        from_nir(path)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("field,value,ir_field,pieces", [
    # threshold in [v_min, v_max + 1] = [-2048, 2048]: the IR's rule, the NIR field's name
    ("threshold_int", 5000, "threshold", ["threshold_int=5000", "[-2048, 2048]"]),
    # an exact leak has leak_multiplier 1 and leak_round_shift 0
    ("leak_multiplier", 2, "exact", ["exact=True", "leak_multiplier 1"]),
])
def test_ranges_are_the_ir_checks_named_in_nir_terms(field, value, ir_field, pieces):
    """Issue 45 §2: from_nir builds the operations and runs check_network; its error comes back
    naming the NIR node and metadata field (threshold_int, not the IR's threshold)."""
    from snnquant.export import IntegerNetworkError
    graph, _, _ = _graph()
    graph.nodes["1"].metadata[field] = value
    message = _refused(graph, "node '1'", *pieces, f"(operation 1, field {ir_field})")
    assert "operation 1 (" not in message          # the NIR wording, not the IR's
    with pytest.raises(NIRImportError) as info:
        from_nir(graph)
    cause = info.value.__cause__
    assert isinstance(cause, IntegerNetworkError)
    assert (cause.index, cause.field) == (1, ir_field) and cause.why.startswith(
        ("it ", "an exact"))


def test_bias_outside_bias_bits_is_refused():
    graph, _, _ = _graph()
    meta = graph.nodes["0"].metadata
    meta["bias_bits"] = 4                            # [-8, 7]
    b = np.array(meta["bias_int"])
    b[0] = 100
    meta["bias_int"] = b
    _refused(graph, "node '0'", "bias_int=", "holds 100", "4-bit range [-8, 7]")


def test_integer_network_error_names_field_and_operation():
    from snnquant.export import IntegerNetworkError, check_network
    desc, _ = build_network("mlp", "lif", 4, 0)
    desc.ops[1].v_init = 10 ** 6
    with pytest.raises(IntegerNetworkError, match=r"operation 1 .* v_init=1000000") as info:
        check_network(desc)
    assert (info.value.index, info.value.field) == (1, "v_init")
    assert info.value.why.startswith("it must be an int in [")


@pytest.mark.parametrize("value,piece", [
    (10 ** 30, "v_threshold disagrees"),             # a number: read, then against the NIR node
    (10 ** 400, "membrane_unit=" + repr(10 ** 400)[:20]),
    (-(10 ** 30), "membrane_unit=-1000000000000000000000000000000 must be a finite number > 0"),
], ids=["1e30", "1e400", "-1e30"])
def test_huge_python_int_in_a_real_field_is_refused_by_name(value, piece):
    """A Python int beyond int64 in a real-valued field (membrane_unit) raised numpy's TypeError
    from np.isfinite; it is a number: read if finite and > 0 as float64, else named."""
    graph, _, _ = _graph()
    graph.nodes["1"].metadata["membrane_unit"] = value
    _refused(graph, "node '1'", piece)
