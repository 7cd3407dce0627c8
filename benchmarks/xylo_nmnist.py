"""N-MNIST on SynSense Xylo Audio 2, trained in the chip's arithmetic, checked on its simulator.

The chip has 16 input channels and 8 readout neurons, so the task is reduced to what it can take:

* digits 0 to 7 (8 classes) of the real recordings' fixed stratified 800/200 split;
* input: the example's frames (``-T`` frames per recording, per-pixel event counts), the central
  32x32 pixels cut into a 4x4 grid of 8x8 regions, both polarities summed: 16 channels, each
  step's count capped at the chip's 15 events (how many counts the cap changes is reported).

Per seed, one network 16 -> 256 -> 128 -> 8 (LIF, ``tau`` 2, soft reset) is

1. trained in float (SpikingJelly, no chip arithmetic);
2. converted after training with :func:`snnquant.targets.quantize_for_xylo` (what a
   post-training conversion gives: weights and thresholds on the chip's grid, the chip's
   current-based neurons, multi-spike hidden neurons and per-layer delays) and run on the chip's
   simulator;
3. trained from that conversion in the chip's arithmetic for the same number of epochs, and run
   on the chip's simulator.

The table gives the accuracies (median over seeds, min..max), the agreement of the trained
network's readout spikes with SynSense's simulator (``xylosim`` via Rockpool's ``XyloSim``) on
every step of every test sample, and the resources used against the chip's limits.

    python benchmarks/xylo_nmnist.py --real-split ../shared/data/nmnist-real-1k --seeds 0 1 2

Writes ``benchmarks/results/xylo_nmnist_real.{json,md}`` and the ``_table.rst`` the Xylo guide
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

from snnquant.targets import (XYLO_AUDIO2, check_xylo, quantize_for_xylo,  # noqa: E402
                              run_xylosim, to_xylo)

CLASSES = 8
SIZES = (16, 256, 128, CLASSES)


def encode(frames: torch.Tensor):
    """``[T, N, 2, 34, 34]`` frames -> ``[T, N, 16]`` event counts (capped at 15) and the number
    of counts the cap changed."""
    x = frames[..., 1:33, 1:33].sum(2)  # [T, N, 32, 32], polarities summed
    t, n = x.shape[:2]
    x = x.reshape(t, n, 4, 8, 4, 8).sum((3, 5)).reshape(t, n, 16)
    capped = int((x > XYLO_AUDIO2.max_input_events).sum())
    return x.clamp(max=XYLO_AUDIO2.max_input_events), capped


def on_chip(model, batches) -> dict:
    """Accuracy on SynSense's simulator and the agreement of every readout spike with the
    model's."""
    spec = to_xylo(model)
    return common_chip.on_simulator(
        model, batches, lambda x: run_xylosim(spec, x.astype(np.int64))["output"])


def run_seed(bench, seed: int, epochs: int, lr_float: float, lr_chip: float) -> dict:
    train_b, capped_train = common_chip.data(bench, "train", seed, encode, CLASSES)
    test_b, capped_test = common_chip.data(bench, "test", seed, encode, CLASSES)
    t0 = time.time()
    seconds = {}

    def timed(name, fn, *a):
        start = time.time()
        out = fn(*a)
        seconds[name] = round(time.time() - start, 1)
        return out

    fnet = timed("train_float", common_chip.train, common_chip.float_network(seed, SIZES),
                 train_b, epochs, lr_float, seed)
    acc_float = common_chip.accuracy(fnet, test_b)
    converted = quantize_for_xylo(fnet)
    assert check_xylo(converted) == []
    ptq = timed("xylosim_converted", on_chip, converted, test_b)
    chip_net = timed("train_chip", common_chip.train, converted, train_b, epochs, lr_chip, seed)
    trained = timed("xylosim_trained", on_chip, chip_net, test_b)
    acc_model = common_chip.accuracy(chip_net, test_b)
    spec = to_xylo(chip_net)
    row = {"seed": seed, "float": acc_float, "converted_on_xylosim": ptq["accuracy"],
           "converted_agreement": ptq["agreement"], "trained_model": acc_model,
           "trained_on_xylosim": trained["accuracy"], "trained_agreement": trained["agreement"],
           "trained_integer_agreement": trained["integer_agreement"],
           "test_samples": trained["samples"], "capped_fraction_train": capped_train,
           "capped_fraction_test": capped_test,
           "hidden_neurons": int(sum(spec.hidden_sizes)),
           "synapses": int((spec.weights_in != 0).sum() + (spec.weights_rec != 0).sum()
                           + (spec.weights_out != 0).sum()),
           "seconds": round(time.time() - t0, 1), "phase_seconds": seconds}
    print(row, flush=True)
    return row


def table(rows, args) -> str:
    def col(key):
        return fmt([r[key] / 100 for r in rows])

    r0 = rows[0]
    lines = [
        f"N-MNIST digits 0-7 on Xylo Audio 2 ({common.data_label(args, args.root)}; 16 channels: "
        f"4x4 regions, T={args.T}); {len(rows)} seeds, {args.epochs} epochs each; "
        f"median (min..max)",
        "",
        "| | accuracy (%) | spikes equal to xylosim (% of test samples) |",
        "|---|---|---|",
        f"| float network (SpikingJelly LIF) | {col('float')} | - |",
        f"| converted after training, on xylosim | {col('converted_on_xylosim')} | "
        f"{col('converted_agreement')} |",
        f"| trained in Xylo's arithmetic, snnquant model | {col('trained_model')} | - |",
        f"| trained in Xylo's arithmetic, on xylosim | {col('trained_on_xylosim')} | "
        f"{col('trained_agreement')} |",
        "",
        f"Resources: {r0['hidden_neurons']} of {XYLO_AUDIO2.max_hidden} hidden neurons, "
        f"{CLASSES} of {XYLO_AUDIO2.max_outputs} readout neurons, 16 of "
        f"{XYLO_AUDIO2.max_inputs} input channels, {r0['synapses']} non-zero weights (seed "
        f"{r0['seed']}). Input counts capped at 15: {100 * r0['capped_fraction_test']:.2f}% of "
        f"the test counts.",
    ]
    return "\n".join(lines)


def main():
    common_chip.main("xylo_nmnist", __doc__, 32, run_seed, table)


if __name__ == "__main__":
    main()
