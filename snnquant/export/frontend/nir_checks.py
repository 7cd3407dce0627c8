"""The checks of a NIR graph that :func:`~snnquant.export.from_nir` reads, those that only the
graph can answer: its structure, the node types, the snnquant metadata's keys and their types
(an integer, a number, a flag, an array of the right shape), the shapes along the edges and the
file's size, before anything is allocated. The ranges of the fields and the fractional bits along
the edges are the IR's rules (:func:`~snnquant.export.ir.validation.check_network`, run on the
network read); :func:`translate` names their errors in the graph's terms. Each error
(:class:`NIRImportError`) names the node, the field and the value.
"""

from __future__ import annotations

import math
import re
from typing import List, Optional, Tuple

import numpy as np

from ...functional.int_limits import as_int
from ..ir.network import NETWORK_INPUT, IntegerNetworkError

__all__ = ["NIRImportError", "MAX_ELEMENTS", "MAX_BYTES", "validate_graph", "prescan_file",
           "translate", "IR_TO_NIR"]


SYNAPSE_KEYS = ("weight_bits", "weight_int", "weight_scale", "weight_multiplier", "weight_shift",
                "in_frac_bits", "out_frac_bits", "unit_factor")
NEURON_KEYS = ("v_bits", "v_min", "v_max", "membrane_scale", "membrane_unit", "threshold_int",
               "v_reset_int", "v_init_int", "reset_mode", "leak_shift", "leak_multiplier",
               "leak_round_shift", "decay_input", "input_shift", "grid_shift", "in_frac_bits",
               "grid_frac_bits", "exact", "rounding")
POOL_KEYS = ("pool_kind", "frac_bits_added", "kernel_size", "stride", "padding")


class NIRImportError(ValueError):
    """A NIR graph cannot be read as an snnquant integer network; the message says what is missing
    or inconsistent, and in which node."""


OP_ROLES = ("synapse", "neuron", "pool", "flatten", "join")


def missing_keys(meta, keys) -> List[str]:
    return [k for k in keys if k not in meta]


def require_keys(name: str, meta, keys, what: str):
    miss = missing_keys(meta, keys)
    if miss:
        raise NIRImportError(f"node {name!r} ({what}) lacks the snnquant metadata {miss}; "
                             f"from_nir reads graphs written by snnquant.export.to_nir")


def int_tuple(v) -> Tuple[int, ...]:
    return tuple(int(x) for x in np.asarray(v).reshape(-1))


# --- Validation: every field of the graph, before anything is allocated --------------------------

#: The most elements one array of a graph (a weight, a layer's activation) may hold; a file that
#: declares more is refused before it is read (about 512 MiB of float64).
MAX_ELEMENTS = 1 << 26
#: The most bytes all datasets of a ``.nir`` file may hold together, each element counted at
#: ``max(itemsize, 8)`` bytes (``from_nir(..., max_bytes=...)`` raises it): 1 GiB.
MAX_BYTES = 1 << 30
_SCALAR = object()


def node_where(name: Optional[str]) -> str:
    return "graph metadata" if name is None else f"node {name!r}"


def bad_field(name: Optional[str], field: str, value, why: str) -> NIRImportError:
    return NIRImportError(f"{node_where(name)}: {field}={_show(value)} {why}")


def _show(value) -> str:
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray) and value.ndim > 0:
        if value.size > 6:
            return f"array of shape {tuple(value.shape)}"
        return repr(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def scalar_int(value) -> Optional[int]:
    """``value`` as a Python int if it is one integral scalar (not a bool), else ``None``."""
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            return None
        value = value[()]
    if isinstance(value, np.bool_):
        return None
    return as_int(value, integral_float=True)


def check_int_field(name, field, value, low: int, high: int) -> int:
    v = scalar_int(value)
    if v is None or not low <= v <= high:
        raise bad_field(name, field, value, f"must be an integer in [{low}, {high}]")
    return v


def int_value(name, field, value) -> int:
    """``value`` as a Python int, or an error naming the field: its range is the IR's
    (:func:`~snnquant.export.ir.validation.check_network`, see :func:`translate`)."""
    v = scalar_int(value)
    if v is None:
        raise bad_field(name, field, value, "must be an integer")
    return v


def check_real(name, field, value, positive: bool = False) -> float:
    v = value[()] if isinstance(value, np.ndarray) and value.ndim == 0 else value
    try:  # a Python int beyond float64 (10**400) overflows; np.isfinite refuses one beyond int64
        f = None if isinstance(v, (bool, np.bool_)) or not isinstance(
            v, (int, float, np.integer, np.floating)) else float(v)
    except OverflowError:
        f = None
    if f is None or not math.isfinite(f) or (positive and not f > 0):
        raise bad_field(name, field, value, "must be a finite number" + (" > 0" if positive else ""))
    return f


def _flag(name, field, value) -> bool:
    v = value[()] if isinstance(value, np.ndarray) and value.ndim == 0 else value
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if scalar_int(v) in (0, 1):
        return bool(scalar_int(v))
    raise bad_field(name, field, value, "must be a bool")


def check_text(name, field, value, allowed) -> str:
    v = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v[()]
    if not isinstance(v, str) or v not in allowed:
        raise bad_field(name, field, value, f"must be one of {list(allowed)}")
    return v


def check_array(name, field, value, *, integer: bool, shape=None, low=None, high=None,
                positive: bool = False) -> np.ndarray:
    """A numeric array (int64 when ``integer``), checked for size, shape, finiteness and range."""
    try:
        a = np.asarray(value)
    except Exception:  # noqa: BLE001 - anything that is not an array is refused below
        a = np.asarray(None, dtype=object)
    if a.dtype.kind not in "biuf":
        raise bad_field(name, field, value, "must be a numeric array")
    if a.size > MAX_ELEMENTS:
        raise bad_field(name, field, value, f"has {a.size} elements, more than the {MAX_ELEMENTS} a "
                                       f"snnquant graph may hold")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise bad_field(name, field, value, f"has shape {tuple(a.shape)}, expected {tuple(shape)}")
    a = a.astype(np.float64) if a.dtype.kind in "bf" else a
    if a.dtype.kind == "f":
        bad = ~np.isfinite(a)
        if integer:
            bad |= np.isfinite(a) & ((a != np.round(a)) | (np.abs(a) >= 2.0 ** 63))
        if bad.any():
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            raise bad_field(name, field, value, f"holds {a[i]!r} at index {i}: it must hold finite "
                                           f"{'integers' if integer else 'numbers'}")
        if integer:
            a = a.astype(np.int64)
    elif a.dtype.kind == "u" and a.size and int(a.max()) >= 2 ** 63:
        raise bad_field(name, field, value, "holds values beyond int64")
    else:
        a = a.astype(np.int64) if integer else a.astype(np.float64)
    for limit, out in ((low, a < low if low is not None else None),
                       (high, a > high if high is not None else None)):
        if out is not None and out.any():
            i = tuple(int(j) for j in np.argwhere(out)[0])
            raise bad_field(name, field, value, f"holds {a[i].item()!r} at index {i}, outside "
                                           f"[{low}, {high}]")
    if positive and a.size and not (a > 0).all():
        i = tuple(int(j) for j in np.argwhere(~(a > 0))[0])
        raise bad_field(name, field, value, f"holds {a[i].item()!r} at index {i}: it must be > 0")
    return a


def node_meta(name: str, node) -> Tuple[dict, str]:
    """A node's snnquant metadata and its role (``snnquant_op``), or an error naming the node."""
    meta = dict(getattr(node, "metadata", None) or {})
    if "snnquant_op" not in meta:
        raise NIRImportError(f"node {name!r} ({type(node).__name__}) lacks the snnquant "
                             f"metadata ['snnquant_op', ...]; from_nir reads graphs written "
                             f"by snnquant.export.to_nir")
    role = meta["snnquant_op"]
    role = role.decode("utf-8", "replace") if isinstance(role, bytes) else str(role)
    if role not in OP_ROLES + ("part", "scale"):
        raise bad_field(name, "snnquant_op", role, "is unknown (synapse, neuron, pool, flatten, join, "
                                              "part or scale)")
    return meta, role


def _size(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _shape(name, field, value) -> Tuple[int, ...]:
    a = check_array(name, field, value, integer=True, low=1)
    if a.ndim != 1 or not 1 <= a.size <= 8:
        raise bad_field(name, field, value, "must be a per-sample shape (1 to 8 positive sizes)")
    shape = tuple(int(v) for v in a)
    if _size(shape) > MAX_ELEMENTS:
        raise bad_field(name, field, value, f"has {_size(shape)} elements per sample, more than "
                                       f"{MAX_ELEMENTS}")
    return shape


def _per_dim(name, field, value, n: int, low: int) -> Tuple[int, ...]:
    a = check_array(name, field, value, integer=True, low=low, high=MAX_ELEMENTS)
    if a.size == 1:
        return (int(a.reshape(-1)[0]),) * n
    if a.shape != (n,):
        raise bad_field(name, field, value, f"must hold 1 or {n} values")
    return tuple(int(v) for v in a)


def _window(name, shape, kernel, stride, padding, dilation, what: str) -> Tuple[int, ...]:
    """Output sizes of a convolution or pooling window over ``shape``'s spatial sizes."""
    out = []
    for size, k, s, p, d in zip(shape, kernel, stride, padding, dilation):
        o = (size + 2 * p - d * (k - 1) - 1) // s + 1
        if o < 1:
            raise NIRImportError(f"{node_where(name)}: the {what} kernel_size={kernel} (stride "
                                 f"{stride}, padding {padding}, dilation {dilation}) does not fit "
                                 f"its input of spatial size {tuple(shape)}")
        out.append(o)
    return tuple(out)


def _check_graph_metadata(gmeta) -> None:
    from ..ir.network import READABLE_FORMAT_VERSIONS

    check_real(None, "dt", gmeta["dt"], positive=True)
    int_value(None, "input_max", gmeta["input_max"])
    int_value(None, "output_frac_bits", gmeta["output_frac_bits"])
    ref = check_text(None, "reference_dtype", gmeta["reference_dtype"], ("float32", "float64"))
    mantissa = {"float32": 24, "float64": 53}[ref]
    if scalar_int(gmeta["mantissa_bits"]) != mantissa:
        raise bad_field(None, "mantissa_bits", gmeta["mantissa_bits"],
                        f"must be {mantissa}, the significand of reference_dtype {ref!r}")
    if scalar_int(gmeta["format_version"]) not in READABLE_FORMAT_VERSIONS:
        raise bad_field(None, "format_version", gmeta["format_version"],
                        f"must be one of {list(READABLE_FORMAT_VERSIONS)}")


def _check_synapse(name, node, meta, nir, shape) -> Tuple[int, ...]:
    """Check a synapse node's NIR fields and metadata types against its input ``shape``; return
    its output shape."""
    require_keys(name, meta, SYNAPSE_KEYS, "synapse")
    int_value(name, "weight_bits", meta["weight_bits"])
    weight_nir = check_array(name, "weight", node.weight, integer=False)
    w = check_array(name, "weight_int", meta["weight_int"], integer=True, shape=weight_nir.shape)
    if w.size == 0:
        raise bad_field(name, "weight_int", w, "is empty")
    if isinstance(node, (nir.Affine, nir.Linear)):
        if w.ndim != 2 or len(shape) != 1 or w.shape[1] != shape[0]:
            raise bad_field(name, "weight", weight_nir, f"of shape {tuple(w.shape)} does not take the "
                                                   f"input of shape {shape} on its edge")
        out = (int(w.shape[0]),)
    elif isinstance(node, (nir.Conv1d, nir.Conv2d)):
        n = 1 if isinstance(node, nir.Conv1d) else 2
        groups = check_int_field(name, "groups", node.groups, 1, MAX_ELEMENTS)
        if w.ndim != n + 2 or len(shape) != n + 1 or w.shape[1] * groups != shape[0] \
                or w.shape[0] % groups:
            raise bad_field(name, "weight", weight_nir, f"of shape {tuple(w.shape)} with groups={groups} "
                                                   f"does not take the input of shape {shape} on "
                                                   f"its edge")
        if getattr(node, "input_shape", None) is not None:
            declared = check_array(name, "input_shape", node.input_shape, integer=True)
            if tuple(declared.reshape(-1)) != tuple(shape[1:]):
                raise bad_field(name, "input_shape", node.input_shape, f"differs from the spatial "
                                                                  f"size {shape[1:]} on its edge")
        stride = _per_dim(name, "stride", node.stride, n, 1)
        dilation = _per_dim(name, "dilation", node.dilation, n, 1)
        padding = node.padding.decode() if isinstance(node.padding, bytes) else node.padding
        kernel = tuple(int(k) for k in w.shape[2:])
        if isinstance(padding, str):
            check_text(name, "padding", padding, ("same", "valid"))
            spatial = shape[1:] if padding == "same" else _window(
                name, shape[1:], kernel, stride, (0,) * n, dilation, "convolution")
        else:
            pad = _per_dim(name, "padding", padding, n, 0)
            spatial = _window(name, shape[1:], kernel, stride, pad, dilation, "convolution")
        out = (int(w.shape[0]),) + tuple(spatial)
    else:
        raise NIRImportError(f"node {name!r}: a synapse must be Affine, Linear, Conv1d or "
                             f"Conv2d, got {type(node).__name__}")
    channels = (int(w.shape[0]),)
    for field in ("weight_scale", "weight_multiplier", "weight_shift"):
        check_array(name, field, meta[field], integer=field != "weight_scale",
                    shape=channels if np.asarray(meta[field]).size != 1 else None)
    check_real(name, "unit_factor", meta["unit_factor"], positive=True)
    fields = ("in_frac_bits", "out_frac_bits") + (("bias_bits",) if "bias_bits" in meta else ())
    for field in fields:
        int_value(name, field, meta[field])
    if "bias_int" in meta:
        check_array(name, "bias_int", meta["bias_int"], integer=True, shape=channels)
        check_array(name, "bias", node.bias, integer=False, shape=channels)
    if _size(out) > MAX_ELEMENTS:
        raise NIRImportError(f"node {name!r}: its output of shape {out} has more than "
                             f"{MAX_ELEMENTS} elements")
    return out


def _check_neuron(name, node, meta, nir, shape) -> None:
    require_keys(name, meta, NEURON_KEYS, "neuron")
    if not isinstance(node, (nir.IF, nir.LIF)):
        raise NIRImportError(f"node {name!r}: a neuron must be IF or LIF, got {type(node).__name__}")
    params = ("r", "v_threshold", "v_reset") + (("tau", "v_leak") if isinstance(node, nir.LIF)
                                                 else ())
    for field in params:
        a = check_array(name, field, getattr(node, field), integer=False)
        if a.ndim and tuple(a.shape) != tuple(shape):
            raise bad_field(name, field, a, f"has shape {tuple(a.shape)}, but the edge into the node "
                                       f"carries {shape}")
    for field in ("v_bits", "v_min", "v_max", "v_reset_int", "v_init_int", "threshold_int",
                  "leak_shift", "leak_multiplier", "leak_round_shift", "input_shift", "grid_shift",
                  "in_frac_bits", "grid_frac_bits"):
        int_value(name, field, meta[field])
    check_real(name, "membrane_scale", meta["membrane_scale"], positive=True)
    check_real(name, "membrane_unit", meta["membrane_unit"], positive=True)
    _flag(name, "decay_input", meta["decay_input"])
    _flag(name, "exact", meta["exact"])


def _check_pool(name, node, meta, nir, shape) -> Tuple[int, ...]:
    require_keys(name, meta, POOL_KEYS, "pool")
    check_text(name, "pool_kind", meta["pool_kind"], ("max", "sum"))
    ks = _per_dim(name, "kernel_size", meta["kernel_size"], 2, 1)
    stride = _per_dim(name, "stride", meta["stride"], 2, 1)
    padding = _per_dim(name, "padding", meta["padding"], 2, 0)
    int_value(name, "frac_bits_added", meta["frac_bits_added"])
    if len(shape) != 3:
        raise NIRImportError(f"node {name!r}: 2-d pooling needs an input [C, H, W], the edge "
                             f"into it carries {shape}")
    if isinstance(node, nir.Conv2d):
        check_array(name, "weight", node.weight, integer=False,
                    shape=(shape[0], shape[0]) + tuple(ks))
    spatial = _window(name, shape[1:], ks, stride, padding, (1, 1), "pooling")
    if "output_size" in meta and int_tuple(meta["output_size"]) != spatial:
        raise bad_field(name, "output_size", meta["output_size"], f"differs from the {spatial} that "
                                                             f"the pooling gives its input {shape}")
    return (shape[0],) + spatial


def _check_flatten(name, node, shape) -> Tuple[int, ...]:
    n = len(shape)
    start = check_int_field(name, "start_dim", node.start_dim, -n, n - 1)
    end = check_int_field(name, "end_dim", node.end_dim, -n, n - 1)
    start, end = start % n, end % n
    if start > end:
        raise bad_field(name, "end_dim", node.end_dim, f"is before start_dim={start} for an input "
                                                  f"of shape {shape}")
    return shape[:start] + (_size(shape[start:end + 1]),) + shape[end + 1:]


def _edge_shape(graph, node_name: str, key: str, field: str):
    types = getattr(graph.nodes[node_name], field, None) or {}
    value = types.get(key) if isinstance(types, dict) else None
    return None if value is None else _shape(node_name, f"{field}[{key!r}]", value)


def validate_graph(graph, nir, entries: list) -> None:
    """Check every field of the graph against its type (the dtypes that will hold the values)
    and its shape, and the shapes along the edges (join operands included), raising one
    :class:`NIRImportError` that names the node, the field and the value. The fields' ranges and
    the fractional bits along the edges are left to
    :func:`~snnquant.export.ir.validation.check_network` on the network read."""
    gmeta = dict(graph.metadata or {})
    _check_graph_metadata(gmeta)
    shape = _edge_shape(graph, "input", "input", "input_type")
    if shape is None:
        shape = _edge_shape(graph, "input", "output", "output_type")
    if shape is None:
        raise NIRImportError("node 'input': input_type holds no shape")
    shapes = {NETWORK_INPUT: shape}
    for e in entries:
        name, meta, role = e.name, e.meta, e.role
        node = None if name is None else graph.nodes[name]
        shape = shapes[e.inputs[0]]
        if role == "synapse":
            shape = _check_synapse(name, node, meta, nir, shape)
        elif role == "neuron":
            _check_neuron(name, node, meta, nir, shape)
        elif role == "pool":
            shape = (_check_voting(name, node, meta, nir, shape) if "dims" in meta
                     else _check_pool(name, node, meta, nir, shape))
        elif role == "flatten":
            if not isinstance(node, nir.Flatten):
                raise NIRImportError(f"node {name!r}: flatten must be a Flatten node")
            shape = _check_flatten(name, node, shape)
        else:
            shape = _check_join(e, shapes)
        for part in e.parts:
            part_node = graph.nodes[part]
            for field in ("threshold", "v_threshold", "v_reset", "r"):
                if hasattr(part_node, field):
                    a = check_array(part, field, getattr(part_node, field), integer=False)
                    if a.ndim and tuple(a.shape) != tuple(shape):
                        raise bad_field(part, field, a, f"has shape {tuple(a.shape)}, but the edge "
                                                   f"into the node carries {shape}")
        shapes[e.index] = shape
    if not entries:
        raise NIRImportError("the graph has no operations between 'input' and 'output'")
    out = _edge_shape(graph, "output", "output", "output_type")
    if out is not None and out != shape:
        raise NIRImportError(f"node 'output': output_type {out} differs from the shape {shape} "
                             f"that the last node gives")


def _check_join(e, shapes) -> Tuple[int, ...]:
    """A join's operands have one shape; its shifts and out_frac_bits are integers."""
    meta, where = e.meta, e.where
    operand_shapes = [shapes[j] for j in e.inputs]
    if len(set(operand_shapes)) != 1:
        raise NIRImportError(f"{where}: the join's operands {list(e.inputs)} have the shapes "
                             f"{operand_shapes}; a join needs one shape")
    check_array(e.name, "shifts", meta.get("shifts"), integer=True, shape=(len(e.inputs),))
    int_value(e.name, "out_frac_bits", meta.get("out_frac_bits"))
    return operand_shapes[0]


def _check_voting(name, node, meta, nir, shape) -> Tuple[int, ...]:
    """A 1-d average over groups of ``kernel_size`` features (SpikingJelly's VotingLayer)."""
    ks = _per_dim(name, "kernel_size", meta["kernel_size"], 1, 1)
    int_value(name, "frac_bits_added", meta["frac_bits_added"])
    int_value(name, "divisor", meta.get("divisor", 1))
    if len(shape) != 1 or shape[0] % ks[0]:
        raise NIRImportError(f"node {name!r}: an average over groups of {ks[0]} features needs "
                             f"an input [F] with F a multiple of {ks[0]}, the edge carries {shape}")
    check_array(name, "weight", node.weight, integer=False, shape=(shape[0] // ks[0], shape[0]))
    return (shape[0] // ks[0],)


#: The NIR metadata key of an IR field, per operation kind, where the names differ (the others
#: are the same: ``weight_bits``, ``v_bits``, ``leak_shift``, ``in_frac_bits``, ...).
IR_TO_NIR = {
    "synapse": {"weight": "weight_int", "multiplier": "weight_multiplier",
                "shift": "weight_shift", "bias": "bias_int"},
    "neuron": {"threshold": "threshold_int", "v_reset": "v_reset_int", "v_init": "v_init_int"},
    "pool": {},
    "flatten": {},
    "join": {"kind": "join_kind"},
}


def translate(error: IntegerNetworkError, graph, entries: list) -> NIRImportError:
    """The IR's :class:`~snnquant.export.IntegerNetworkError` on the network read from
    ``graph`` (:func:`~snnquant.export.ir.validation.check_network`, which checks the fields'
    ranges and the fractional bits along the edges) as a :class:`NIRImportError` naming the
    NIR node and metadata field (:data:`IR_TO_NIR`) and the value as the graph holds it."""
    if error.field is None:
        return NIRImportError(f"the network read from the graph is refused: {error}")
    why = re.sub(r"^(it|they) ", "", error.why)  # "field=value must be ...", as the checks above
    if error.index is None:
        gmeta = dict(graph.metadata or {})
        return bad_field(None, error.field, gmeta.get(error.field, "?"), why)
    e = entries[error.index]
    key = IR_TO_NIR[e.role].get(error.field, error.field)
    node = None if e.name is None else graph.nodes[e.name]
    if key in e.meta:
        value = e.meta[key]
    elif node is not None and hasattr(node, key):
        value = getattr(node, key)
    else:
        return NIRImportError(f"{e.where} ({e.role}): {error}")
    where = node_where(e.name) if e.name is not None else e.where
    return NIRImportError(f"{where}: {key}={_show(value)} {why} (operation {error.index}, field "
                          f"{error.field})")


def _node_types(nir) -> set:
    todo, seen = [nir.NIRNode], set()
    while todo:
        cls = todo.pop()
        seen.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return seen


def prescan_file(path: str, nir, max_bytes: int) -> None:
    """Check a ``.nir`` file's links, declared dataset sizes and node types before ``nir.read``
    reads it: an array declared with a huge shape (stored compressed or as a fill value, the file
    stays small), many large arrays together, or a link to a dataset in another file would
    otherwise be allocated first and fail with ``MemoryError``. Every dataset counts, compressed
    or not, at ``max(itemsize, 8)`` bytes per element (what it takes once converted to int64 or
    float64); links (external or soft) are refused: ``nir.write`` writes none."""
    import h5py

    known = _node_types(nir)
    problems: List[NIRImportError] = []
    total = {"elements": 0, "bytes": 0}

    def walk(group, prefix: str) -> None:
        for key in group:
            if problems:
                return
            link, where = group.get(key, getlink=True), f"{prefix}{key}"
            if isinstance(link, (h5py.ExternalLink, h5py.SoftLink)):
                target = (f"{link.filename}:{link.path}" if isinstance(link, h5py.ExternalLink)
                          else link.path)
                kind = "an external" if isinstance(link, h5py.ExternalLink) else "a soft"
                problems.append(NIRImportError(
                    f"{where!r} is {kind} link to {target!r}; a NIR file holds its arrays "
                    f"itself (nir.write writes no links), so from_nir does not follow it"))
                return
            obj = group[key]
            if isinstance(obj, h5py.Group):
                walk(obj, where + "/")
            else:
                visit(where, obj)

    def visit(key, obj):
        if not isinstance(obj, h5py.Dataset):
            return
        parts = key.split("/")
        name = parts[2] if len(parts) > 3 and parts[1] == "nodes" else None
        field = parts[-1] if name is None else "/".join(parts[3:])
        field = field[len("metadata/"):] if field.startswith("metadata/") else field
        size = int(obj.size or 0)
        total["elements"] += size
        total["bytes"] += size * max(int(obj.dtype.itemsize), 8)
        if size > MAX_ELEMENTS:
            problems.append(NIRImportError(
                f"{node_where(name)}: {field} declares shape {tuple(obj.shape)} ({obj.size} "
                f"elements), more than the {MAX_ELEMENTS} a snnquant graph may hold"))
        elif total["bytes"] > max_bytes:
            problems.append(NIRImportError(
                f"the file's datasets up to {key!r} hold {total['elements']} elements "
                f"({total['bytes']} bytes as 64-bit values), more than max_bytes={max_bytes} "
                f"(nir_import.MAX_BYTES by default); pass from_nir(..., max_bytes=...) to read "
                f"a larger graph"))
        elif name is not None and field == "type" and obj.shape == ():
            value = obj[()]
            value = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            if value not in known:
                problems.append(bad_field(name, "type", value, f"is not a NIR node type (nir "
                                                          f"{nir.__version__} knows "
                                                          f"{sorted(known)})"))

    try:
        with h5py.File(path, "r") as handle:
            walk(handle, "")
    except (OSError, ValueError) as exc:
        raise NIRImportError(f"could not read the NIR file {path!r}: {exc or type(exc).__name__}") \
            from exc
    if problems:
        raise NIRImportError(f"{problems[0]} (in {path!r})")
