"""N-MNIST on Loihi 2 through Lava, trained in Lava's fixed point, checked on Lava's simulation.

Lava's ``Dense`` takes 0/1 spikes, so the input is the example's frames (``-T`` frames per
recording) with each 2x2 block of pixels of one polarity merged and any event made one spike:
``2 x 17 x 17 = 578`` inputs. All 10 digits of the real recordings' fixed stratified 800/200
split. Per seed, one network 578 -> 256 -> 10 (LIF, ``tau`` 2, reset to 0) is

1. trained in float (SpikingJelly);
2. converted after training with :func:`snnquant.targets.quantize_for_loihi` (the weights and
   thresholds on Lava's grid, Lava's current and voltage decays, one step of delay per layer);
3. trained from that conversion in Lava's arithmetic for the same number of epochs, and run on
   Lava's fixed-point CPU simulation (``Loihi2SimCfg(select_tag="fixed_pt")``).

The table gives the accuracies (median over seeds, min..max) and the agreement of every output
spike of the trained network with Lava's run, on every test sample. Lava needs a Python <= 3.10
with ``lava-nc``: ``SNNQUANT_LAVA_PYTHON`` (see the Loihi guide).

    SNNQUANT_LAVA_PYTHON=~/lava-venv/bin/python python benchmarks/loihi_nmnist.py \\
        --real-split ../shared/data/nmnist-real-1k --seeds 0 1 2

Writes ``benchmarks/results/loihi_nmnist_real.{json,md}`` and the ``_table.rst`` the Loihi guide
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

import torch  # noqa: E402

from snnquant.targets import check_loihi, quantize_for_loihi, run_lava, to_loihi  # noqa: E402

CLASSES = 10
SIZES = (578, 256, CLASSES)


def encode(frames: torch.Tensor):
    """``[T, N, 2, 34, 34]`` frames -> ``[T, N, 578]`` 0/1 spikes (an event in a 2x2 block of one
    polarity is a spike) and the number of blocks that held more than one event."""
    t, n = frames.shape[:2]
    x = frames.reshape(t, n, 2, 17, 2, 17, 2).sum((4, 6)).reshape(t, n, 578)
    return (x > 0).to(frames.dtype), int((x > 1).sum())


def on_lava(model, batches) -> dict:
    """Accuracy on Lava and the agreement of every output spike with the model's."""
    spec = to_loihi(model)
    return common_chip.on_simulator(
        model, batches, lambda x: run_lava(spec, x.astype("int8"))["layers"][-1])


def run_seed(bench, seed: int, epochs: int, lr_float: float, lr_chip: float) -> dict:
    train_b, _ = common_chip.data(bench, "train", seed, encode, CLASSES)
    test_b, _ = common_chip.data(bench, "test", seed, encode, CLASSES)
    t0 = time.time()
    fnet = common_chip.train(common_chip.float_network(seed, SIZES, v_reset=0.0), train_b, epochs,
                             lr_float, seed)
    acc_float = common_chip.accuracy(fnet, test_b)
    converted = quantize_for_loihi(fnet)
    assert check_loihi(converted) == []
    acc_converted = common_chip.accuracy(converted, test_b)
    trained_net = common_chip.train(converted, train_b, epochs, lr_chip, seed)
    acc_model = common_chip.accuracy(trained_net, test_b)
    lava = on_lava(trained_net, test_b)
    row = {"seed": seed, "float": acc_float, "converted_model": acc_converted,
           "trained_model": acc_model, "trained_on_lava": lava["accuracy"],
           "trained_agreement": lava["agreement"],
           "trained_integer_agreement": lava["integer_agreement"], "test_samples": lava["samples"],
           "neurons": sum(SIZES[1:]), "seconds": round(time.time() - t0, 1)}
    print(row, flush=True)
    return row


def table(rows, args) -> str:
    def col(key):
        return fmt([r[key] / 100 for r in rows])

    return "\n".join([
        f"N-MNIST on Loihi 2 through Lava's fixed point ({common.data_label(args, args.root)}; "
        f"578 binary inputs, T={args.T}); {len(rows)} seeds, {args.epochs} epochs each; "
        f"median (min..max)",
        "",
        "| | accuracy (%) | spikes equal to Lava (% of test samples) |",
        "|---|---|---|",
        f"| float network (SpikingJelly LIF) | {col('float')} | - |",
        f"| converted after training (snnquant model of Lava's arithmetic) | "
        f"{col('converted_model')} | - |",
        f"| trained in Lava's arithmetic, snnquant model | {col('trained_model')} | - |",
        f"| trained in Lava's arithmetic, on Lava (fixed_pt) | {col('trained_on_lava')} | "
        f"{col('trained_agreement')} |",
    ])


def main():
    common_chip.main("loihi_nmnist", __doc__, 8, run_seed, table)


if __name__ == "__main__":
    main()
