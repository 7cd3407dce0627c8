"""What the chip benchmarks (xylo_nmnist.py, loihi_nmnist.py) share: the encoded data, the
float network, training, accuracy and the command line."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _nmnist_common as common  # noqa: E402
from _tables import write_rst_table  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from spikingjelly.activation_based import functional as sjf  # noqa: E402
from spikingjelly.activation_based import layer, neuron  # noqa: E402

from snnquant.export import IntegerSNN, to_integer  # noqa: E402


def float_network(seed: int, sizes, v_reset=None) -> nn.Sequential:
    """A float LIF network (``tau`` 2) of ``Linear`` layers of ``sizes``."""
    torch.manual_seed(seed)
    mods = []
    for i in range(len(sizes) - 1):
        mods += [layer.Linear(sizes[i], sizes[i + 1], step_mode="m"),
                 neuron.LIFNode(tau=2.0, v_reset=v_reset, step_mode="m")]
    return nn.Sequential(*mods)


def data(bench, split: str, seed: int, encode_fn, classes: int):
    """All batches of ``split`` with labels below ``classes``, encoded by ``encode_fn`` (which
    returns the input and the number of values it capped); and the capped fraction."""
    args = bench.args_for(seed)
    train_loader, test_loader = bench.ex.make_loaders(bench.train_set, bench.test_set, args, 0, 1,
                                                      seed)
    out, capped, total = [], 0, 0
    for frames, y in (train_loader if split == "train" else test_loader):
        keep = y < classes
        if not bool(keep.any()):
            continue
        x, c = encode_fn(frames[keep].float().transpose(0, 1))
        out.append((x, y[keep]))
        capped += c
        total += x.numel()
    return out, capped / max(total, 1)


def train(model, batches, epochs: int, lr: float, seed: int, distiller=None):
    """Adam with a cosine schedule on the cross-entropy of the output spike counts; through
    ``distiller`` (a :class:`snnquant.distill.Distiller` of ``model``) when given, its loss
    mixing that task loss with the distillation terms."""
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, epochs))
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(batches), generator=torch.Generator().manual_seed(seed + epoch))
        for i in order.tolist():
            x, y = batches[i]
            sjf.reset_net(model)
            out = model(x) if distiller is None else distiller(x)
            loss = nn.functional.cross_entropy(out.sum(0), y)
            if distiller is not None:
                loss = distiller.loss(out, loss)
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


def on_simulator(model, batches, simulate) -> dict:
    """Accuracy of ``simulate`` (``[N, T, in]`` numpy input -> ``[N, T, out]`` output spikes of
    the vendor's simulator), the agreement of every output spike with the model's
    (``agreement``) and with the exported network's on ``IntegerSNN`` (``integer_agreement``:
    ``to_integer`` of the model, the chip's operations), on ``batches``; ties in the spike count
    go to the lowest class, as argmax does."""
    right = total = equal = equal_integer = 0
    model.eval()
    integer = IntegerSNN(to_integer(model))
    with torch.no_grad():
        for x, y in batches:
            sjf.reset_net(model)
            ours = model(x).transpose(0, 1).numpy()
            exported = integer(x.to(torch.int64)).transpose(0, 1).numpy()
            chip = simulate(x.transpose(0, 1).numpy())
            equal += int((chip == ours).all(axis=(1, 2)).sum())
            equal_integer += int((chip == exported).all(axis=(1, 2)).sum())
            right += int((torch.from_numpy(chip.sum(1)).argmax(1) == y).sum())
            total += len(y)
    return {"accuracy": 100.0 * right / total, "agreement": 100.0 * equal / total,
            "integer_agreement": 100.0 * equal_integer / total, "samples": total}


def main(name: str, doc: str, default_T: int, run_seed, table, add_arguments=None) -> None:
    """The command line of a chip benchmark: seeds, epochs, ``-T``, learning rates; writes
    ``<name>[_real].{json,md}`` and the ``_table.rst``. ``add_arguments(ap)`` adds a
    benchmark's own flags; ``run_seed`` then also gets ``args=`` and ``name`` may be a function of
    the arguments."""
    ap = common.common_args(doc, default_epochs=20)
    ap.add_argument("-T", type=int, default=default_T)
    ap.add_argument("--lr-float", type=float, default=1e-2)
    ap.add_argument("--lr-chip", type=float, default=1e-3)
    if add_arguments is not None:
        add_arguments(ap)
    args = ap.parse_args()
    if callable(name):
        name = name(args)
    extra = {} if add_arguments is None else {"args": args}
    if args.quick:
        args.epochs, args.seeds = 1, args.seeds[:1]
    args.root = common.data_root_of(args)
    bench = common.Bench(args.epochs, args.root, T=args.T, quick=args.quick)
    name = common.results_name(args, name)
    rows = []
    for seed in args.seeds:   # the results are written after every seed: a kill loses nothing
        rows.append(run_seed(bench, seed, args.epochs, args.lr_float, args.lr_chip, **extra))
        text = table(rows, args)
        print(text)
        if args.quick:
            continue
        common.write_results(name, {"rows": rows, "T": args.T, "epochs": args.epochs,
                                    "seeds": common.seeds_done(args, seed),
                                    "data_sha256": bench.data_sha256(), "lr_float": args.lr_float,
                                    "lr_chip": args.lr_chip}, text, args.out)
        write_rst_table(args.out, name)
