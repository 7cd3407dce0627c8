"""What fold_batchnorm and to_integer make of SpikingJelly 2.0's model zoo (issue 32, section 1).

``spike_dhs`` is left out: it holds building blocks of a searched network, not a network.

Small instances (16x16 or 32x32 inputs, T = 4, embedding 32, depth 1), quantized at W4/V8 and
run once in training mode (the quantizers initialise). For each network, with the graph captured
by torch.fx symbolic tracing (no example input, as before issue 32) and from a run on an example
input (``example_input=x``):

* fold: how many BatchNorms ``fold_batchnorm`` folds, and the first refusal;
* to_integer: ``ok`` or the first line of its refusal (on the network folded from the run).

Prints a Markdown table and writes ``benchmarks/results/zoo_capture.json`` and ``.md``. About a
minute on one CPU core::

    python benchmarks/zoo_capture.py
"""
from __future__ import annotations

import json
import os
import sys
import time
import types
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from snnquant import QuantConfig, quantize_model  # noqa: E402
from snnquant.export import ExportError, FoldWarning, fold_batchnorm, to_integer  # noqa: E402
from snnquant.capture import plan_folding  # noqa: E402

T, N = 4, 2


def networks():
    """``{name: (builder, example input)}`` of the small zoo instances."""
    from spikingjelly.activation_based import neuron
    from spikingjelly.activation_based.model import (masnn, maxformer, ms_resnet, qkformer,
                                                     snas_net, spike_driven_transformer,
                                                     spikformer, spiking_vggws_ottt)
    x16, x32 = torch.rand(T, N, 3, 16, 16), torch.rand(T, N, 3, 32, 32)
    snas_args = types.SimpleNamespace(timestep=T, second_avgpooling=2, dataset="cifar10",
                                      celltype="forward", threshold=1.0, tau=2.0)
    con_mat = torch.tensor([[0, 1, 2, 2], [0, 0, 2, 1], [0, 0, 0, 2], [0, 0, 0, 0]])
    return {
        "ms_resnet.MSResNet": (lambda: ms_resnet.MSResNet(
            T=T, num_classes=10, layers=(1, 1, 1), base_channels=32, stem_kernel_size=3,
            stem_stride=1, tau=2.0), x16),
        "spikformer.Spikformer": (lambda: spikformer.Spikformer(
            T=T, img_size_h=16, img_size_w=16, patch_size=4, num_classes=10, embed_dims=32,
            num_heads=2, depths=1), x16),
        "spike_driven_transformer.SpikeDrivenTransformer": (
            lambda: spike_driven_transformer.SpikeDrivenTransformer(
                T=T, num_classes=10, embed_dims=32, num_heads=2, depths=1), x32),
        "qkformer.QKFormer": (lambda: qkformer.QKFormer(
            T=T, num_classes=10, embed_dims=32, num_heads=(1, 2, 2), depths=(1, 1, 1)), x32),
        "maxformer.MaxFormer": (lambda: maxformer.MaxFormer(
            T=T, num_classes=10, embed_dims=32, depths=(1, 1, 1)), x32),
        "maxformer.MaxFormer(cifar=True)": (lambda: maxformer.MaxFormer(
            T=T, num_classes=10, embed_dims=32, depths=(1, 1, 1), cifar=True), x32),
        "masnn.MASNN": (lambda: masnn.MASNN(
            T=T, in_channels=3, num_classes=10, input_size=(16, 16), channels=(32, 32),
            pools=(1, 2), fc_hidden=32, reduction_t=2, reduction_c=4), x16),
        # single-step: its forward loops over the T steps itself
        "snas_net.SNASNet": (lambda: snas_net.SNASNet(snas_args, con_mat), x32[0]),
        # weight-standardised convolutions (WSConv2d) and OTTT's LIF; single-step; its light
        # classifier expects 512 channels at the end
        "spiking_vggws_ottt.OTTTSpikingVGG": (lambda: spiking_vggws_ottt.OTTTSpikingVGG(
            [32, "M", 512, "M"], num_classes=10, spiking_neuron=neuron.OTTTLIFNode), x16[0]),
    }


def _first_line(err: Exception, limit: int = 400) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[:limit] + " ..."


def fold_result(model, x) -> str:
    plan = plan_folding(model, x)
    text = f"{len(plan.pairs)} folded, {len(plan.refused)} refused"
    if plan.refused:
        name, reason = next(iter(plan.refused.items()))
        text += f" (first: {name!r}: {' '.join(reason.split())[:300]})"
    return text


def export_result(model, x) -> str:
    try:
        to_integer(model, example_input=x)
        return "ok"
    except ExportError as err:
        return _first_line(err)


def measure(name, build, x) -> dict:
    torch.manual_seed(0)
    start = time.perf_counter()
    row = {"network": name}
    try:
        net = build()
        q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
        from spikingjelly.activation_based import functional as sjf
        sjf.reset_net(q)
        q.train()(x)
        sjf.reset_net(q)
    except Exception as err:  # the zoo network itself does not build or run
        row["error"] = f"{type(err).__name__}: {_first_line(err)}"
        return row
    row["fold_fx"] = fold_result(q, None)
    row["fold_run"] = fold_result(q, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FoldWarning)
        folded = fold_batchnorm(q, on_unfoldable="warn", example_input=x)
    row["to_integer_fx"] = export_result(folded, None)
    row["to_integer_run"] = export_result(folded, x)
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def table(rows) -> str:
    lines = ["| network | fold (torch.fx) | fold (run) | to_integer (torch.fx) | "
             "to_integer (run) |", "|---|---|---|---|---|"]
    for r in rows:
        cells = [r.get(k, r.get("error", "")) for k in
                 ("fold_fx", "fold_run", "to_integer_fx", "to_integer_run")]
        lines.append("| " + " | ".join([f"`{r['network']}`"] + [c.replace("|", "/")
                                                                 for c in cells]) + " |")
    return "\n".join(lines)


def main():
    warnings.simplefilter("ignore", UserWarning)
    rows = [measure(name, build, x) for name, (build, x) in networks().items()]
    md = table(rows)
    print(md)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "zoo_capture.json"), "w") as f:
        json.dump({"T": T, "N": N, "weight_bits": 4, "v_bits": 8, "torch": torch.__version__,
                   "rows": rows}, f, indent=1)
    with open(os.path.join(out, "zoo_capture.md"), "w") as f:
        f.write(md + "\n")


if __name__ == "__main__":
    main()
