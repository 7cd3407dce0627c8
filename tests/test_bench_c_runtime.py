"""The logic of benchmarks/bench_c_runtime.py's comparison of weight widths (issue 46 §4): its
files, targets, agreement and counts at smoke-test size; the timings themselves are not checked."""
import json
import shutil

import pytest
import torch

from _repo import needs
from conftest import load_script

pytestmark = needs("benchmarks")


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_c_runtime.py")


def test_widths_write_targets_agreement_and_counts(bench, tmp_path):
    """``--weight-bits 8 2``: one JSON and one Markdown file with, per width, the float model,
    both C forms and the no-input run (median and range of the repeats), the 0.3x targets of
    both forms, 100% agreement of both C models with IntegerSNN, and the dense MACs."""
    bench.main(["--quick", "--weight-bits", "8", "2", "--no-profile", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "bench_c_runtime_bits_quick.json").read_text())
    md = (tmp_path / "bench_c_runtime_bits_quick.md").read_text()
    assert result["params"]["weight_bits"] == [8, 2] and result["params"]["repeats"] == 3
    assert set(result["targets"]) == {f"W{b} {bench.FORMS[f]} / float" for b in (8, 2)
                                      for f in ("events", "dense")}
    assert all(t["target"] == 0.3 and t["pass"] == (t["value"] <= 0.3)
               for t in result["targets"].values())
    assert result["agreement"] == {f"W{b} {f}": 1.0 for b in (8, 2) for f in ("events", "dense")}
    assert len(result["results"]) == 8
    for row in result["results"]:
        med, lo, hi = row["ms_per_sample"]
        assert 0 < lo <= med <= hi
    assert all(len(v) == 3 for v in result["times_s"].values())
    for b in ("8", "2"):
        assert result["per_width"][b]["dense_macs_per_sample"] > result["per_width"][b][
            "synaptic_ops_per_sample"] > 0
    assert "| target | median | target | pass |" in md and "W2 C model, dense / float" in md


def test_dense_macs_count_every_weight_at_every_position(bench):
    """A conv (2 -> 4, 3 x 3, padding 1) on 6 x 6 and a linear (144 -> 3): 4 * 2 * 9 * 36 + 144 * 3
    multiply-accumulates per step."""
    import torch.nn as nn
    from spikingjelly.activation_based import layer, neuron

    from snnquant import QuantConfig, quantize_model
    from snnquant.export import fold_batchnorm, to_integer
    torch.manual_seed(0)
    net = nn.Sequential(layer.Conv2d(2, 4, 3, padding=1), neuron.IFNode(), layer.Flatten(),
                        layer.Linear(144, 3), neuron.IFNode())
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    desc = to_integer(fold_batchnorm(q.eval()), input_shape=(2, 6, 6), input_max=1)
    assert bench.dense_macs(desc, (2, 6, 6)) == 4 * 2 * 9 * 36 + 144 * 3


def test_instruction_profile_names_every_layer(bench, tmp_path):
    """The callgrind counts per step: a part per synaptic and neuron layer, none negative; the
    no-input run executes fewer instructions in the synaptic layers than the run with events."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        pytest.skip("valgrind (callgrind) not installed: the instruction counts are left out")
    desc, _, x = bench.example_network(4, 0, 4, 3, 0.2, 2)
    bench._input_file(tmp_path / "in.bin", x)
    bench._input_file(tmp_path / "zero.bin", torch.zeros_like(x))
    prof = bench.instruction_profile("cc", desc, tmp_path, {"input": tmp_path / "in.bin",
                                                            "none": tmp_path / "zero.bin"}, 12)
    names = {op.name for op in desc.ops}
    synapse_parts = [k for k in prof["input"] if "synapse" in k]
    assert len(synapse_parts) == 3 and all(k.split(" ")[0] in names for k in synapse_parts)
    assert sum("neuron step" in k for k in prof["input"]) == 3
    assert all(v >= 0 for p in prof.values() for v in p.values())
    assert sum(prof["none"].get(k, 0) for k in synapse_parts) < sum(
        prof["input"][k] for k in synapse_parts)
