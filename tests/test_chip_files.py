"""Chip files (save_xylo/load_xylo, save_loihi/load_loihi, save_speck/load_speck) are checked
field by field on load and on save, by the rules the layers apply, after their checksum: a
checksum anyone can recompute proves only that the file is whole. Every refusal is one
ValueError naming the file and the field (issue 47, B)."""

import json
import re

import numpy as np
import pytest
import torch
import torch.nn as nn

from snnquant.targets import (LoihiLIFLayer, SpeckIAFLayer, XyloLIFLayer, load_loihi,
                              load_speck, load_xylo, save_loihi, save_speck, save_xylo,
                              to_loihi, to_speck, to_xylo)
from snnquant.targets._layer import _digest


def _xylo():
    net = nn.Sequential(XyloLIFLayer(3, 4, threshold=50), XyloLIFLayer(4, 2, threshold=60,
                                                                       delay=1, max_spikes=1,
                                                                       input_max=31, bias=True))
    return to_xylo(net)


def _loihi():
    net = nn.Sequential(LoihiLIFLayer(3, 4, vth=20, bias=True), LoihiLIFLayer(4, 2, vth=30))
    return to_loihi(net)


def _speck():
    net = nn.Sequential(SpeckIAFLayer((1, 4, 4), 2, 3, threshold=20, padding=1, pool=2,
                                      bias=True),
                        SpeckIAFLayer((2, 2, 2), 3, None, threshold=9, input_max=2 ** 15))
    return to_speck(net)


CHIPS = {"xylo": (_xylo, save_xylo, load_xylo), "loihi": (_loihi, save_loihi, load_loihi),
         "speck": (_speck, save_speck, load_speck)}


def _resealed(path, payload):
    """Write ``payload`` with a recomputed checksum, as anyone can."""
    payload = dict(payload)
    payload.pop("sha256", None)
    payload["sha256"] = _digest(payload)
    path.write_text(json.dumps(payload))


def _edit(payload, dotted, value):
    target, keys = payload, dotted.split(".")
    for k in keys[:-1]:
        target = target[int(k)] if isinstance(target, list) else target[k]
    last = int(keys[-1]) if isinstance(target, list) else keys[-1]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value


DELETE = object()

# (chip, field edited, new value, the field the refusal names)
CORPUS = [
    ("xylo", "threshold.0", -5, "threshold"),
    ("xylo", "threshold_out.1", 40000, "threshold_out"),
    ("xylo", "dash_mem.0", 99, "dash_mem"),
    ("xylo", "dash_syn_out.0", 16, "dash_syn_out"),
    ("xylo", "weight_shift_in", "3", "weight_shift_in"),
    ("xylo", "weight_shift_out", 8, "weight_shift_out"),
    ("xylo", "weights_in.0.0", 1.7, "weights_in"),
    ("xylo", "weights_in.0.0", 128, "weights_in"),
    ("xylo", "weights_in.0.0", True, "weights_in"),
    ("xylo", "bias_out.0", 2 ** 70, "bias_out"),
    ("xylo", "hidden_sizes", [5], "weights_in"),
    ("xylo", "hidden_sizes", [], "hidden_sizes"),
    ("xylo", "weights_rec", [[0]], "weights_rec"),
    ("xylo", "profile", "xylo-imu", "profile"),
    ("xylo", "threshold", DELETE, "threshold"),
    ("xylo", "extra", 1, "extra"),
    ("loihi", "layers.0.du", 5000, "du"),
    ("loihi", "layers.0.vth", -1, "vth"),
    ("loihi", "layers.1.weight_exp", 9, "weight_exp"),
    ("loihi", "layers.0.weights.0.0", 255, "weights"),
    ("loihi", "layers.0.weights.0.0", 3, "weights"),
    ("loihi", "layers.0.weights", [[0, 0]], "bias_mant"),
    ("loihi", "layers.1.weights", [[0, 0, 0], [0, 0, 0]], "weights"),
    ("loihi", "layers.0.bias_mant.0", 5000, "bias_mant"),
    ("loihi", "layers.0.bias_exp.0", 8, "bias_exp"),
    ("loihi", "layers.0.dv", None, "dv"),
    ("loihi", "layers", [], "layers"),
    ("loihi", "profile", "loihi1", "profile"),
    ("speck", "layers.0.kind", "fft", "kind"),
    ("speck", "layers.0.spike", "many", "spike"),
    ("speck", "layers.0.pool", 0, "pool"),
    ("speck", "layers.0.pool", 3, "pool"),
    ("speck", "layers.0.threshold", 0, "threshold"),
    ("speck", "layers.0.stride", 1.5, "stride"),
    ("speck", "layers.0.min_v_mem", 0, "min_v_mem"),
    ("speck", "layers.0.weight.0.0.0.0", 1.7, "weight"),
    ("speck", "layers.0.bias.0", 200, "bias"),
    ("speck", "layers.1.weight", [[0] * 7] * 3, "weight"),
    ("speck", "input_shape", [1, 4], "input_shape"),
    ("speck", "input_shape", [2, 4, 4], "weight"),
    ("speck", "device", "dynapcnndevkit", "device"),
]


@pytest.mark.parametrize("chip, dotted, value, field", CORPUS,
                         ids=[f"{c}-{d}-{v if v is not DELETE else 'deleted'}"
                              for c, d, v, _ in CORPUS])
def test_every_field_edit_with_a_new_checksum_is_refused_naming_the_field(tmp_path, chip,
                                                                          dotted, value, field):
    make, save, load = CHIPS[chip]
    path = tmp_path / f"net.{chip}.json"
    save(make(), path)
    load(path)
    payload = json.loads(path.read_text())
    _edit(payload, dotted, value)
    _resealed(path, payload)
    with pytest.raises(ValueError) as info:
        load(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert re.search(rf"field '([^' ]*\.)?{field}\b", message), message


@pytest.mark.parametrize("chip", sorted(CHIPS))
def test_strict_json_no_nan_no_duplicate_keys(tmp_path, chip):
    make, save, load = CHIPS[chip]
    path = tmp_path / f"net.{chip}.json"
    save(make(), path)
    text = path.read_text()
    nan = text.replace('"profile"', '"x": NaN, "profile"', 1)
    path.write_text(nan)
    with pytest.raises(ValueError, match=f"{path}.*NaN"):
        load(path)
    dup = text.replace('"profile"', '"profile": "a", "profile"', 1)
    path.write_text(dup)
    with pytest.raises(ValueError, match=f"{path}.*duplicate key 'profile'"):
        load(path)
    path.write_text("[" * 100000)
    with pytest.raises(ValueError, match=str(path)):
        load(path)


def test_save_refuses_what_load_would_refuse(tmp_path):
    spec = _xylo()
    spec.threshold = np.array([-5, 1, 1, 1])
    path = tmp_path / "net.xylo.json"
    with pytest.raises(ValueError, match=r"net.xylo.json.*'threshold'.*\[1, 32767\]"):
        save_xylo(spec, path)
    assert not path.exists()
    spec = _xylo()
    spec.weight_shift_in = float("nan")
    with pytest.raises(ValueError, match="'weight_shift_in'"):
        save_xylo(spec, path)
    spec = _loihi()
    spec.layers[0]["du"] = 5000
    with pytest.raises(ValueError, match="du' must"):
        save_loihi(spec, tmp_path / "net.loihi.json")
    spec = _speck()
    spec.layers[0]["pool"] = 0
    with pytest.raises(ValueError, match="pool' must"):
        save_speck(spec, tmp_path / "net.speck.json")
    assert not any(tmp_path.iterdir())
