"""N-MNIST on SynSense Speck through Sinabs, trained in the chip's arithmetic, checked on Sinabs'
``DynapcnnNetwork`` simulation.

Input: the example's frames (``-T`` frames per recording), per-pixel event counts of both
polarities, ``2 x 34 x 34``, each count capped at 15 (how many counts the cap changes is
reported). All 10 digits of the real recordings' fixed stratified 800/200 split. Per seed, one
convolutional network (conv 2->8 3x3 + IF + 2x2 pooling, conv 8->16 3x3 stride 2 + IF,
linear 1296->10 + IF; SpikingJelly ``IFNode`` with soft reset) is

1. trained in float (SpikingJelly, average pooling);
2. deployed through NIR, the vendor's way: the float network written as a NIR graph file
   (``Conv2d``/``Affine``, ``IF``, ``SumPool2d`` with the average's 1/4 in the next layer's
   weights, as Sinabs' importer takes no ``AvgPool2d``), read back and imported by Sinabs'
   ``from_nir`` (``IAFSqueeze`` with ``min_v_mem = -threshold``), discretised by
   ``DynapcnnNetwork(discretize=True)`` (one scale factor per layer, rounding) and run in its
   simulation (``sinabs_script.py`` with ``exact`` = 0);
3. converted with :func:`snnquant.targets.quantize_for_speck` and trained from there in the
   chip's arithmetic for the same number of epochs, then exported and run on Sinabs' simulation.

The table gives the accuracies (median over seeds, min..max), the agreement of every output
spike count of the trained network with Sinabs' run on every test sample, and the cores and
memory Sinabs assigned. Sinabs 3.1 pins nir <= 1.0.4: it runs in its own Python,
``SNNQUANT_SINABS_PYTHON`` (see the Speck guide).

    SNNQUANT_SINABS_PYTHON=~/sinabs-env/bin/python python benchmarks/speck_nmnist.py \\
        --real-split ../shared/data/nmnist-real-1k --seeds 0 1 2

Writes ``benchmarks/results/speck_nmnist_real.{json,md}`` and the ``_table.rst`` the Speck guide
includes.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _chip_common as common_chip  # noqa: E402
import _nmnist_common as common  # noqa: E402
from _tables import fmt  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from spikingjelly.activation_based import layer, neuron  # noqa: E402

from snnquant.targets import check_speck, quantize_for_speck, run_sinabs, to_speck  # noqa: E402
from snnquant.targets.speck import sinabs_python, sinabs_runner  # noqa: E402

CLASSES = 10
INPUT_SHAPE = (2, 34, 34)
INPUT_MAX = 15


def encode(frames: torch.Tensor):
    """``[T, N, 2, 34, 34]`` frames -> the same counts capped at 15, and the number of counts the
    cap changed."""
    return frames.clamp(max=INPUT_MAX), int((frames > INPUT_MAX).sum())


def float_network(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        layer.Conv2d(2, 8, 3, padding=1, bias=False, step_mode="m"),
        neuron.IFNode(v_reset=None, step_mode="m"),
        layer.AvgPool2d(2, step_mode="m"),
        layer.Conv2d(8, 16, 3, stride=2, padding=1, bias=False, step_mode="m"),
        neuron.IFNode(v_reset=None, step_mode="m"),
        layer.Flatten(step_mode="m"),
        layer.Linear(16 * 9 * 9, CLASSES, bias=False, step_mode="m"),
        neuron.IFNode(v_reset=None, step_mode="m"))


def nir_route(fnet: nn.Sequential, batches) -> dict:
    """Accuracy of the float network through NIR, Sinabs' NIR importer and its discretisation,
    on its simulation."""
    convs = [m for m in fnet if isinstance(m, (nn.Conv2d, nn.Linear))]
    ifs = [m for m in fnet if isinstance(m, neuron.IFNode)]
    pools = {0: 2}
    right = total = 0
    for x, y in batches:
        events = x.permute(1, 0, 2, 3, 4).numpy()
        arrays = {"x": events.astype(np.float32), "input_shape": np.asarray(INPUT_SHAPE),
                  "n_layers": len(convs), "device": "speck2fmodule", "exact": 0}
        for k, (syn, neu) in enumerate(zip(convs, ifs)):
            linear = isinstance(syn, nn.Linear)
            arrays.update({f"kind{k}": int(linear),
                           f"w{k}": syn.weight.detach().numpy().astype(np.float32),
                           f"threshold{k}": float(neu.v_threshold),
                           f"stride{k}": 1 if linear else syn.stride[0],
                           f"padding{k}": 0 if linear else syn.padding[0],
                           f"pool{k}": pools.get(k, 1)})
        out = sinabs_runner(arrays, sinabs_python())
        counts = out[f"s{len(convs) - 1}"].reshape(len(y), x.shape[0], -1).sum(1)
        right += int((torch.from_numpy(counts).argmax(1) == y).sum())
        total += len(y)
    return {"accuracy": 100.0 * right / total}


def on_sinabs(model, batches) -> dict:
    """Accuracy on Sinabs' simulation, the agreement of every output count with the model's, and
    the cores and memory Sinabs assigned."""
    spec = to_speck(model)
    placed = {}

    def simulate(x):
        out = run_sinabs(spec, x)
        placed.update(cores=out["cores"], memory=out["memory"])
        return out["layers"][-1]

    result = common_chip.on_simulator(model, batches, simulate)
    return {**result, **placed}


def run_seed(bench, seed: int, epochs: int, lr_float: float, lr_chip: float) -> dict:
    train_b, capped_train = common_chip.data(bench, "train", seed, encode, CLASSES)
    test_b, capped_test = common_chip.data(bench, "test", seed, encode, CLASSES)
    t0 = time.time()
    fnet = common_chip.train(float_network(seed), train_b, epochs, lr_float, seed)
    acc_float = common_chip.accuracy(fnet, test_b)
    via_nir = nir_route(fnet, test_b)
    converted = quantize_for_speck(fnet, INPUT_SHAPE, input_max=INPUT_MAX)
    assert check_speck(converted) == []
    acc_converted = common_chip.accuracy(converted, test_b)
    trained_net = common_chip.train(converted, train_b, epochs, lr_chip, seed)
    acc_model = common_chip.accuracy(trained_net, test_b)
    sim = on_sinabs(trained_net, test_b)
    row = {"seed": seed, "float": acc_float, "nir_on_sinabs": via_nir["accuracy"],
           "converted_model": acc_converted, "trained_model": acc_model,
           "trained_on_sinabs": sim["accuracy"], "trained_agreement": sim["agreement"],
           "trained_integer_agreement": sim["integer_agreement"],
           "test_samples": sim["samples"], "cores": sim["cores"], "memory": sim["memory"],
           "capped_counts_train": capped_train, "capped_counts_test": capped_test,
           "seconds": round(time.time() - t0, 1)}
    print(row, flush=True)
    return row


def table(rows, args) -> str:
    def col(key):
        return fmt([r[key] / 100 for r in rows])

    mem = rows[0]["memory"]
    used = ", ".join(f"layer {k}: core {c} ({m['kernel']} kernel, {m['neuron']} neuron)"
                     for k, (c, m) in enumerate(zip(rows[0]["cores"], mem)))
    return "\n".join([
        f"N-MNIST on Speck through Sinabs ({common.data_label(args, args.root)}; 2x34x34 event "
        f"counts capped at {INPUT_MAX}, T={args.T}); {len(rows)} seeds, {args.epochs} epochs "
        f"each; median (min..max)",
        "",
        "| | accuracy (%) | output counts equal to Sinabs (% of test samples) |",
        "|---|---|---|",
        f"| float network (SpikingJelly IF) | {col('float')} | - |",
        f"| float network as NIR, through Sinabs' from_nir and its discretisation, on Sinabs | "
        f"{col('nir_on_sinabs')} | - |",
        f"| converted by snnquant (model of Sinabs' arithmetic) | {col('converted_model')} | - |",
        f"| trained in Sinabs' arithmetic, snnquant model | {col('trained_model')} | - |",
        f"| trained in Sinabs' arithmetic, on Sinabs (DynapcnnNetwork) | "
        f"{col('trained_on_sinabs')} | {col('trained_agreement')} |",
        "",
        f"Cores and memory (Sinabs' count; 9 cores): {used}.",
    ])


def main():
    common_chip.main("speck_nmnist", __doc__, 8, run_seed, table)


if __name__ == "__main__":
    main()
