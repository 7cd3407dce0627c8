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
import _nmnist_common as common  # noqa: E402
from _tables import fmt, write_rst_table  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from spikingjelly.activation_based import functional as sjf  # noqa: E402
from spikingjelly.activation_based import layer, neuron  # noqa: E402

from snnquant.targets import XYLO_AUDIO2, check_xylo, quantize_for_xylo, run_xylosim, to_xylo  # noqa: E402

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


def float_network(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    mods = []
    for i in range(len(SIZES) - 1):
        mods += [layer.Linear(SIZES[i], SIZES[i + 1], step_mode="m"),
                 neuron.LIFNode(tau=2.0, v_reset=None, step_mode="m")]
    return nn.Sequential(*mods)


def data(bench, split: str, seed: int):
    """All batches of ``split`` with labels below CLASSES, encoded."""
    args = bench.args_for(seed)
    train_loader, test_loader = bench.ex.make_loaders(bench.train_set, bench.test_set, args, 0, 1,
                                                      seed)
    out, capped, total = [], 0, 0
    for frames, y in (train_loader if split == "train" else test_loader):
        keep = y < CLASSES
        if not bool(keep.any()):
            continue
        x, c = encode(frames[keep].float().transpose(0, 1))
        out.append((x, y[keep]))
        capped += c
        total += x.numel()
    return out, capped / max(total, 1)


def train(model, batches, epochs: int, lr: float, seed: int):
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, epochs))
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(batches), generator=torch.Generator().manual_seed(seed + epoch))
        for i in order.tolist():
            x, y = batches[i]
            sjf.reset_net(model)
            loss = nn.functional.cross_entropy(model(x).sum(0), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
    return model


def accuracy(model, batches) -> float:
    model.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in batches:
            sjf.reset_net(model)
            right += int((model(x).sum(0).argmax(1) == y).sum())
            total += len(y)
    return 100.0 * right / total


def on_chip(model, batches) -> dict:
    """Accuracy on SynSense's simulator and the agreement of every readout spike with the
    model's."""
    spec = to_xylo(model)
    right = total = equal_samples = 0
    model.eval()
    with torch.no_grad():
        for x, y in batches:
            sjf.reset_net(model)
            ours = model(x).permute(1, 0, 2).numpy()
            chip = run_xylosim(spec, x.permute(1, 0, 2).numpy().astype(np.int64))["output"]
            equal_samples += int((chip == ours).all(axis=(1, 2)).sum())
            # ties in the spike count: the lowest class, as argmax does
            right += int((torch.from_numpy(chip.sum(1)).argmax(1) == y).sum())
            total += len(y)
    return {"accuracy": 100.0 * right / total, "agreement": 100.0 * equal_samples / total,
            "samples": total}


def run_seed(bench, seed: int, epochs: int, lr_float: float, lr_chip: float) -> dict:
    train_b, capped_train = data(bench, "train", seed)
    test_b, capped_test = data(bench, "test", seed)
    t0 = time.time()
    seconds = {}

    def timed(name, fn, *a):
        start = time.time()
        out = fn(*a)
        seconds[name] = round(time.time() - start, 1)
        return out

    fnet = timed("train_float", train, float_network(seed), train_b, epochs, lr_float, seed)
    acc_float = accuracy(fnet, test_b)
    converted = quantize_for_xylo(fnet)
    assert check_xylo(converted) == []
    ptq = timed("xylosim_converted", on_chip, converted, test_b)
    chip_net = timed("train_chip", train, converted, train_b, epochs, lr_chip, seed)
    trained = timed("xylosim_trained", on_chip, chip_net, test_b)
    acc_model = accuracy(chip_net, test_b)
    spec = to_xylo(chip_net)
    row = {"seed": seed, "float": acc_float, "converted_on_xylosim": ptq["accuracy"],
           "converted_agreement": ptq["agreement"], "trained_model": acc_model,
           "trained_on_xylosim": trained["accuracy"], "trained_agreement": trained["agreement"],
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
        f"4x4 regions, T={args.T}); {len(rows)} seeds, {args.epochs} epochs each; median (min..max)",
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
    ap = common.common_args(__doc__, default_epochs=20)
    ap.add_argument("-T", type=int, default=32)
    ap.add_argument("--lr-float", type=float, default=1e-2)
    ap.add_argument("--lr-chip", type=float, default=1e-3)
    args = ap.parse_args()
    if args.quick:
        args.epochs, args.seeds = 1, args.seeds[:1]
    args.root = common.data_root_of(args)
    bench = common.Bench(args.epochs, args.root, T=args.T, quick=args.quick)
    rows = [run_seed(bench, s, args.epochs, args.lr_float, args.lr_chip) for s in args.seeds]
    text = table(rows, args)
    print(text)
    if args.quick:
        return
    name = common.results_name(args, "xylo_nmnist")
    common.write_results(name, {"rows": rows, "T": args.T, "epochs": args.epochs,
                                "seeds": args.seeds, "data_sha256": bench.data_sha256(),
                                "lr_float": args.lr_float, "lr_chip": args.lr_chip}, text, args.out)
    write_rst_table(args.out, name)


if __name__ == "__main__":
    main()
