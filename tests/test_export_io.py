"""Integer export: files (safetensors), NIR graphs and the deployment summary."""
import json
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

import snnquant
from snnquant import QuantConfig, quantize_model
from snnquant.export import (FORMAT_VERSION, ExportError, IntegerSNN, fold_batchnorm, load_integer,
                             save_integer, to_integer, to_nir)


def conv_net(weight_bits=4, soft=False, kind="lif"):
    torch.manual_seed(0)
    v_reset = None if soft else 0.0
    nrn = (lambda: neuron.LIFNode(tau=2.0, v_reset=v_reset)) if kind == "lif" else \
        (lambda: neuron.IFNode(v_reset=v_reset))
    net = nn.Sequential(layer.Conv2d(2, 4, 3, padding=1, bias=False), layer.BatchNorm2d(4), nrn(),
                        layer.MaxPool2d(2), layer.Conv2d(4, 4, 3, stride=1, padding=1), nrn(),
                        layer.AvgPool2d(2), layer.Flatten(), layer.Linear(4 * 2 * 2, 3), nrn())
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                m.weight.mul_(4)
                if m.bias is not None:
                    m.bias.data.fill_(0.5)
        net[1].running_mean.uniform_(-0.3, 0.3)
        net[1].running_var.uniform_(0.5, 1.5)
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=weight_bits, weight_quantizer="lsq_pow2",
                                           v_bits=8))
    return fold_batchnorm(q.eval())


def events(T=5, N=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 3, (T, N, 2, 8, 8), generator=g).float()


# ------------------------------------------------------------------------------------------------
# files

@pytest.mark.parametrize("bits", [2, 8])
def test_save_load_round_trip(tmp_path, bits):
    model = conv_net(weight_bits=bits)
    desc = to_integer(model)
    path = tmp_path / "net.safetensors"
    save_integer(desc, path)
    back = load_integer(path)
    assert back.format_version == FORMAT_VERSION and str(back) == str(desc)
    assert back.bits() == desc.bits() and back.input_max == desc.input_max
    for a, b in zip(desc.ops, back.ops):
        assert type(a) is type(b) and a.name == b.name
        for key, value in vars(a).items():
            other = getattr(b, key)
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, other) and value.dtype == other.dtype, key
            else:
                assert value == other, key
    x = events().long()
    assert torch.equal(IntegerSNN(back)(x), IntegerSNN(desc)(x))
    from safetensors import safe_open
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        keys = set(f.keys())
    assert meta["format_version"] == str(FORMAT_VERSION)
    assert json.loads(meta["bits"])["0"]["weight"] == bits
    assert ("ops.0.weight" in keys) == (bits == 8)
    assert ("ops.0.weight_packed" in keys) == (bits == 2)
    assert [p for p in os.listdir(tmp_path) if ".tmp" in p] == []


def _rewrite(path, out, **meta_changes):
    """Rewrite a file with changed metadata and a valid whole-file checksum."""
    from safetensors import safe_open

    from snnquant.export.backends import files
    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    meta.update(meta_changes)
    meta.pop("file_sha256")
    out.write_bytes(files._serialize(tensors, meta))


def test_load_refuses_other_version_and_corrupt_files(tmp_path):
    path = tmp_path / "net.safetensors"
    save_integer(to_integer(conv_net()), path)
    other = tmp_path / "v2.safetensors"
    _rewrite(path, other, format_version="6")
    with pytest.raises(ValueError, match=r"format_version .6..*reads format_version 1, 2, 3, 4 and 5"):
        load_integer(other)
    data = path.read_bytes()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="corrupt"):
        load_integer(truncated)
    flipped = bytearray(data)
    flipped[-3] ^= 0xFF
    bad = tmp_path / "flipped.safetensors"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="flipped.safetensors.*corrupt.*checksum"):
        load_integer(bad)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00hello world")
    with pytest.raises(ValueError, match="not an snnquant integer network file"):
        load_integer(junk)
    import safetensors.torch as st
    foreign = tmp_path / "foreign.safetensors"
    foreign.write_bytes(st.save({"w": torch.zeros(2)}))
    with pytest.raises(ValueError, match="not an snnquant integer network"):
        load_integer(foreign)
    broken = tmp_path / "broken.safetensors"
    _rewrite(path, broken, description="{\"ops\": 3}")
    with pytest.raises(ValueError, match="description cannot be read"):
        load_integer(broken)


def test_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "net.safetensors"
    desc = to_integer(conv_net())
    save_integer(desc, path)
    before = path.read_bytes()

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        save_integer(to_integer(conv_net(weight_bits=2)), path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["net.safetensors"]
    with pytest.raises(TypeError, match="IntegerNetwork"):
        save_integer(conv_net(), path)


def test_save_on_a_full_disk_names_the_file_and_keeps_the_previous_one(tmp_path, monkeypatch):
    import errno
    path = tmp_path / "net.safetensors"
    save_integer(small_desc(), path)
    before = path.read_bytes()
    real_write = os.write

    def full(fd, data):
        real_write(fd, bytes(data[:100]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match=r"net\.safetensors.*no space left on the device"):
        save_integer(to_integer(conv_net()), path)
    monkeypatch.undo()
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["net.safetensors"]


def small_desc():
    torch.manual_seed(0)
    net = nn.Sequential(layer.Linear(3, 2), neuron.LIFNode(tau=2.0))
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    q(torch.rand(2, 1, 3))
    return to_integer(q.eval())


def test_every_bit_flip_truncation_and_appended_byte_is_refused(tmp_path):
    from snnquant.export.backends import files
    path = tmp_path / "net.safetensors"
    save_integer(small_desc(), path)
    data = path.read_bytes()
    header_end = 8 + int.from_bytes(data[:8], "little")
    name = str(path)

    def refused(blob):
        try:
            files._from_bytes(bytes(blob), name)
        except ValueError as exc:
            return name in str(exc) and "corrupt" in str(exc)
        return False

    # every bit of the length prefix and of the JSON header (thresholds, shifts, bit widths, ...)
    header_bits = [i for i in range(8 * header_end)]
    g = torch.Generator().manual_seed(0)
    tensor_bits = (8 * header_end + torch.randperm(8 * (len(data) - header_end), generator=g)[:300]).tolist()
    loaded = []
    for bit in header_bits + tensor_bits:
        blob = bytearray(data)
        blob[bit // 8] ^= 1 << (bit % 8)
        if not refused(blob):
            loaded.append(bit)
    assert loaded == [], f"{len(loaded)} single-bit flips loaded, first at bit {loaded[:5]}"
    for cut in list(range(0, len(data), 37)) + [len(data) - 1]:
        assert refused(data[:cut]), cut
    for extra in (b"\0", b" ", b"x" * 9):
        assert refused(data + extra), extra
    # and through the real file: flipped, truncated, appended, empty
    for i, blob in enumerate([bytes([data[0] ^ 1]) + data[1:], data[:header_end + 3], data + b"\0",
                              data[:100] + bytes([data[100] ^ 4]) + data[101:], b""]):
        bad = tmp_path / f"bad{i}.safetensors"
        bad.write_bytes(blob)
        with pytest.raises(ValueError, match="bad" + str(i)):
            load_integer(bad)


def test_files_are_deterministic_and_have_the_usual_permissions(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_integer(to_integer(conv_net()), a)
    save_integer(to_integer(conv_net()), b)
    assert a.read_bytes() == b.read_bytes()
    umask = os.umask(0o022)
    os.umask(umask)
    assert a.stat().st_mode & 0o777 == 0o666 & ~umask
    old = os.umask(0o027)
    try:
        save_integer(to_integer(conv_net()), tmp_path / "c.safetensors")
    finally:
        os.umask(old)
    assert (tmp_path / "c.safetensors").stat().st_mode & 0o777 == 0o640


def test_older_files_with_a_tensor_checksum_still_load_with_a_warning(tmp_path):
    # the layout snnquant wrote before the whole-file checksum: safetensors' own writer and a
    # "checksum" of the tensors only
    import safetensors.torch as st

    from snnquant.export.backends import files
    desc = to_integer(conv_net())
    meta, tensors = desc.to_record()
    old = tmp_path / "old.safetensors"
    old.write_bytes(st.save(tensors, metadata={
        "format": files.FILE_FORMAT, "format_version": str(desc.format_version),
        "bits": json.dumps(meta["bits"]), "description": json.dumps(meta),
        "checksum": files._tensor_checksum(tensors)}))
    with pytest.warns(UserWarning, match="older snnquant.*header.*not verified"):
        back = load_integer(old)
    assert str(back) == str(desc)
    blob = bytearray(old.read_bytes())
    blob[-1] ^= 1
    old.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="old.safetensors.*checksum of its tensors"):
        load_integer(old)


# ------------------------------------------------------------------------------------------------
# NIR

def _run_nir(graph, x, T):
    """A small reference interpreter of the NIR graph with the quantized membrane of its metadata."""
    order, node = [], "input"
    nxt = dict(graph.edges)
    while node in nxt:
        node = nxt[node]
        order.append(node)
    x = x.double()
    N = x.shape[1]
    out = []
    states = {}
    spikes = {}
    for t in range(T):
        h = x[t]
        for name in order:
            n = graph.nodes[name]
            kind = type(n).__name__
            if kind == "Output":
                break
            if kind == "Affine":
                h = h @ torch.as_tensor(n.weight).T + torch.as_tensor(n.bias)
            elif kind == "Linear":
                h = h @ torch.as_tensor(n.weight).T
            elif kind == "Conv2d":
                h = F.conv2d(h, torch.as_tensor(n.weight), torch.as_tensor(n.bias), tuple(n.stride),
                             tuple(n.padding), tuple(n.dilation), int(n.groups))
            elif kind == "SumPool2d":
                h = F.avg_pool2d(h, tuple(n.kernel_size), tuple(n.stride), tuple(n.padding),
                                 divisor_override=1)
            elif kind == "AvgPool2d":
                h = F.avg_pool2d(h, tuple(n.kernel_size), tuple(n.stride), tuple(n.padding))
            elif kind == "Threshold":
                h = (h > torch.as_tensor(n.threshold)).double()
            elif kind == "Flatten":
                h = h.flatten(n.start_dim + 1, n.end_dim if n.end_dim < 0 else n.end_dim + 1)
            elif kind in ("IF", "LIF"):
                meta = n.metadata
                unit = float(meta["membrane_scale"]) * float(meta["unit_factor"])
                vr = torch.as_tensor(n.v_reset)
                v = states.get(name, vr.expand(N, *vr.shape).clone())
                dt = 2.0 ** -10
                if kind == "IF":
                    hv = v + dt * torch.as_tensor(n.r) * h
                else:
                    hv = v + dt / torch.as_tensor(n.tau) * ((torch.as_tensor(n.v_leak) - v)
                                                            + torch.as_tensor(n.r) * h)
                q = torch.clamp(torch.round(hv / unit), int(meta["v_min"]), int(meta["v_max"])) * unit
                s = q > torch.as_tensor(n.v_threshold)  # NIR's strict rule
                states[name] = torch.where(s, vr, q)
                h = s.double()
                spikes.setdefault(name, []).append(s.to(torch.int8))
        out.append(h)
    return torch.stack(out), {k: torch.stack(v) for k, v in spikes.items()}


@pytest.mark.parametrize("units", ["integer", "real"])
@pytest.mark.parametrize("kind", ["lif", "if"])
def test_nir_round_trip_and_dynamics(tmp_path, units, kind):
    nir = pytest.importorskip("nir")
    model = conv_net(kind=kind)
    desc = to_integer(model)
    path = tmp_path / "net.nir"
    graph = to_nir(desc, (2, 8, 8), units=units, dt=2.0 ** -10, path=path)
    back = nir.read(path)
    assert set(back.nodes) == set(graph.nodes) and sorted(back.edges) == sorted(graph.edges)
    conv = back.nodes["0"]
    syn = desc.layer("0")
    c = float(conv.metadata["unit_factor"])
    expected_w = syn.weight.double() * syn.weight_scale.reshape(-1, 1, 1, 1) * c
    assert torch.equal(torch.as_tensor(conv.weight), expected_w)
    assert torch.equal(torch.as_tensor(conv.bias), syn.bias.double() * 2.0 ** -syn.out_frac_bits * c)
    assert int(conv.metadata["weight_bits"]) == 4
    if units == "integer":
        assert torch.equal(torch.as_tensor(conv.weight).round(), torch.as_tensor(conv.weight))
    lif = back.nodes["2"]
    nop = desc.layer("2")
    assert type(lif).__name__ == kind.upper()
    unit = nop.membrane_scale * float(lif.metadata["unit_factor"])
    assert bool((torch.as_tensor(lif.v_threshold) == (nop.threshold - 0.5) * unit).all())
    assert bool((torch.as_tensor(lif.v_reset) == nop.v_reset * unit).all())
    if kind == "lif":
        assert bool((torch.as_tensor(lif.tau) == 2.0 * 2.0 ** -10).all())
    assert int(lif.metadata["v_bits"]) == 8 and int(lif.metadata["threshold_int"]) == nop.threshold
    assert type(back.nodes["3"]).__name__ == "SumPool2d" and "3_threshold" in back.nodes
    x = events()
    ref, ref_layers = IntegerSNN(desc)(x.long(), record=True)
    out, layers = _run_nir(back, x, x.shape[0])
    assert torch.equal(out.to(torch.int8), ref)
    for name in desc.neuron_names:
        assert 0 < float(ref_layers[name].float().mean()) < 1, name  # every layer spikes
        assert torch.equal(layers[name], ref_layers[name]), name


def test_nir_refuses_soft_reset_and_bad_arguments():
    pytest.importorskip("nir")
    model = conv_net(soft=True)
    with pytest.raises(ExportError, match=r"layer '2'.*soft reset"):
        to_nir(model, (2, 8, 8))
    with pytest.raises(ValueError, match="units"):
        to_nir(conv_net(), (2, 8, 8), units="bits")
    with pytest.raises(TypeError, match="source"):
        to_nir("model", (2, 8, 8))


# ------------------------------------------------------------------------------------------------
# summary

def _brute_force_conv_synops(x, out_channels, k, stride, padding):
    """Count (nonzero input, output position, output channel) connections one by one."""
    _, _, H, W = x.shape
    Ho = (H + 2 * padding - k) // stride + 1
    Wo = (W + 2 * padding - k) // stride + 1
    total = 0
    for n, c, i, j in (x != 0).nonzero().tolist():
        for y in range(Ho):
            for z in range(Wo):
                if 0 <= i - (y * stride - padding) < k and 0 <= j - (z * stride - padding) < k:
                    total += out_channels
    return total


def test_summary_synops_and_state_bytes():
    torch.manual_seed(0)
    net = nn.Sequential(layer.Conv2d(2, 3, 3, stride=2, padding=1), neuron.IFNode(), layer.Flatten(),
                        layer.Linear(3 * 4 * 4, 5), neuron.IFNode())
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=6))
    x = (torch.rand(4, 2, 2, 7, 7) > 0.6).float()
    s = snnquant.summary(q, x)
    conv, lif1, lin, lif2 = s.rows[0], s.rows[1], s.rows[2], s.rows[3]
    expected = _brute_force_conv_synops(x.flatten(0, 1), 3, 3, 2, 1) / 2
    assert conv["synops"] == expected
    spikes = {}
    work = snnquant.convert.copy_model(q).eval()
    sjf.reset_net(work)
    work[1].register_forward_hook(lambda m, i, o: spikes.setdefault("s", o))
    work(x)
    assert lin["synops"] == float((spikes["s"] != 0).sum()) * 5 / 2
    assert lif1["neurons"] == 3 * 4 * 4 and lif2["neurons"] == 5
    assert lif1["state_quant_bytes"] == 48 * 6 / 8 and lif1["state_fp32_bytes"] == 48 * 4
    assert s.total_synops == conv["synops"] + lin["synops"]
    assert s.total_state_quant_bytes == (48 + 5) * 6 / 8
    assert s.state_compression_ratio == pytest.approx(32 / 6)
    assert s.num_samples == 2 and lif1["spikes"] == float((spikes["s"] != 0).sum()) / 2
    text = str(s)
    assert "synaptic operations per sample" in text and "membrane state" in text
    # the model itself is untouched, and the single-step version of the network counts the same
    single = snnquant.convert.copy_model(q)
    sjf.set_step_mode(single, "s")
    s1 = snnquant.summary(single, x)
    assert [r["synops"] for r in s1.rows] == [r["synops"] for r in s.rows]
    plain = snnquant.summary(q)
    assert plain.total_synops is None and plain.rows[0]["synops"] is None
    assert plain.total_quant_bytes == s.total_quant_bytes
    with pytest.raises(ValueError, match="example_input"):
        snnquant.summary(q, torch.zeros(3))
