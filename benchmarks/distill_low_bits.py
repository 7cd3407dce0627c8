"""Distillation from the full-precision network at low bits (issue 48 §1, §3), on the N-MNIST
example's CSNN or (``--network sdt``) the Spike-driven Transformer of
``benchmarks/transformer_nmnist.py`` (embed 32, 1 block, T 8, on the central 32 x 32 of the
frames, learning rate 1e-3; its results go to ``distill_low_bits_sdt[_val]_real``).

Per seed (the outer loop) the full-precision network (the teacher) trains ``--epochs`` epochs from
scratch; then, per configuration (``--configs``) and method (``--methods``), a quantized student
trains ``--epochs`` epochs from scratch with BatchNorm folded in the loop (the command line's
default, the last quarter of the epochs with frozen BatchNorm statistics):

* ``default``: today's default, the task loss alone (MSE between output rate and one-hot label);
* ``kd``: :class:`snnquant.distill.Distiller` with the options ``--temperature``,
  ``--kd-weight``, ``--align``, ``--align-weight`` (chosen on the validation split);
* ``kd_output``: the output loss alone (``--align`` off), an ablation;
* ``align_only``: the alignment alone (``kd_weight=0``), an ablation.

Every student is deployed with 0 fine-tuning epochs: ``fold_batchnorm`` (a ``FoldWarning`` is an
error), ``to_integer`` and ``IntegerSNN`` on the test recordings; agreement = the share of test
samples whose integer output spikes equal the trained network's, spike for spike.

``--validate``: carve a stratified validation split (``--val-count`` recordings, seed 1) out of
the training recordings, train on the rest, and evaluate the candidate options (``--candidates``)
on it; the test recordings are never read. Choose the options there.

Each seed's rows are written to ``<name>_s<seed>.json`` as they finish; ``--combine`` reports
several such files together.

    OMP_NUM_THREADS=1 python benchmarks/distill_low_bits.py --validate \\
        --real-split ../shared/data/nmnist-real-1k --seeds 0 --configs W2/V4
    OMP_NUM_THREADS=1 python benchmarks/distill_low_bits.py \\
        --real-split ../shared/data/nmnist-real-1k --seeds 0 1 2 3 4 --configs W2/V4
    python benchmarks/distill_low_bits.py --combine benchmarks/results/distill_low_bits_real_s*.json
    OMP_NUM_THREADS=1 python benchmarks/distill_low_bits.py --network sdt \\
        --real-split ../shared/data/nmnist-real-1k --seeds 0 1 --configs W4/V8 W2/V4 \\
        --align firing_rate --fp-cache runs/fp_cache --resume
"""
from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _nmnist_common as common  # noqa: E402
from _tables import fmt, write_files  # noqa: E402

CONFIGS = {"W1/V8": (1, 8), "W2/V4": (2, 4), "W3/V4": (3, 4), "W4/V8": (4, 8)}
METHODS = ("default", "kd", "kd_output", "align_only")
#: issue 48's targets: deployed accuracy at least full precision minus this many points
TARGETS = {"W1/V8": 1.5, "W2/V4": 1.0, "W3/V4": 0.5, "W4/V8": 0.5}
#: the Spike-driven Transformer's (embed 32, 1 block, T 8)
TARGETS_SDT = {"W4/V8": 1.0, "W2/V4": 2.0}
NETWORKS = {"csnn": "the N-MNIST example's CSNN",
            "sdt": "Spike-driven Transformer (embed 32, 2 heads, 1 block, T 8, on the central "
                   "32 x 32 of the frames; transformer_nmnist.py's builder, Adam at 1e-3)"}

# the candidates of --validate: name -> Distiller options (None: no distillation)
CANDIDATES = {
    "default": None,
    "kd T0.2 a0.5": dict(temperature=0.2, kd_weight=0.5, align=None),
    "kd T0.2 a0.9": dict(temperature=0.2, kd_weight=0.9, align=None),
    "kd T0.1 a0.5": dict(temperature=0.1, kd_weight=0.5, align=None),
    "kd T0.5 a0.5": dict(temperature=0.5, kd_weight=0.5, align=None),
    "rate b1": dict(temperature=0.2, kd_weight=0.0, align="firing_rate", align_weight=1.0),
    "membrane b0.1": dict(temperature=0.2, kd_weight=0.0, align="membrane", align_weight=0.1),
    "kd T0.2 a0.5 + rate b1": dict(temperature=0.2, kd_weight=0.5, align="firing_rate",
                                   align_weight=1.0),
    "kd T0.2 a0.5 + membrane b0.1": dict(temperature=0.2, kd_weight=0.5, align="membrane",
                                         align_weight=0.1),
    # issue 48 §2: progressive lowering of the weight bits (from 4, lowered after a third)
    "progressive 4->": dict(lower_from=4, lower_at=1 / 3),
    "kd T0.2 a0.9 + progressive 4->": dict(temperature=0.2, kd_weight=0.9, align=None,
                                           lower_from=4, lower_at=1 / 3),
    "kd T0.1 a0.9": dict(temperature=0.1, kd_weight=0.9, align=None),
    "kd T0.2 a0.9 + rate b1": dict(temperature=0.2, kd_weight=0.9, align="firing_rate",
                                   align_weight=1.0),
    # the transformer's spiking self-attention: its attention maps (QSD-Transformer's
    # fine-grained distillation)
    "kd T0.2 a0.5 + attention b1": dict(temperature=0.2, kd_weight=0.5, align="attention",
                                        align_weight=1.0),
}


def method_options(args, method: str):
    """The Distiller options of ``method`` (None: no distillation)."""
    kd = dict(temperature=args.temperature, kd_weight=args.kd_weight,
              align=None if args.align == "none" else args.align, align_weight=args.align_weight)
    if method == "default":
        return None
    if method == "kd_output":
        return dict(kd, align=None)
    if method == "align_only":
        return dict(kd, kd_weight=0.0)
    return kd


def train_step(model, opt, distiller, frames, y) -> None:
    """One training step of the example's loss (mean squared error of the output rates against
    the one-hot label), through ``distiller`` when there is one."""
    from spikingjelly.activation_based import functional
    x = frames.float().transpose(0, 1)
    out = distiller(x) if distiller is not None else model(x)
    rate = out.float().mean(0)
    loss = F.mse_loss(rate, F.one_hot(y, rate.shape[-1]).float())
    if distiller is not None:
        loss = distiller.loss(out, loss)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    functional.reset_net(model)


def build(bench, network: str, config, seed: int):
    """The network of ``--network`` for ``seed`` (from scratch), quantized with ``config``
    unless None: the example's CSNN, or the transformer of ``transformer_nmnist.py`` in its
    ``Cropped`` wrapper (BatchNorm folded in the loop through ``example_input``)."""
    import snnquant
    args = bench.args_for(seed)
    if network == "csnn":
        model = bench.ex.build_csnn(args.channels, args.tau)
        return model if config is None else snnquant.quantize_model(model, config)[0]
    import transformer_nmnist as sdt
    model = sdt.transformer(args.T)
    if config is not None:
        model, _ = snnquant.quantize_model(model, config,
                                           example_input=sdt.crop(example_input(bench, seed)))
    return sdt.Cropped(model)


def example_input(bench, seed: int):
    """The first training batch of ``seed``, ``[T, N, 2, 34, 34]`` (what the transformer's
    BatchNorm folding and export trace)."""
    return bench.batches(1, seed, with_labels=False)[0]


def learning_rate(bench, network: str, config) -> float:
    if network == "sdt":
        import transformer_nmnist as sdt
        return sdt.LR
    return bench.ex.default_lr(*(0, None) if config is None else
                               (config.weight_bits, config.weight_quantizer))


def train_student(bench, config, seed: int, teacher, options, freeze_bn_epochs: int,
                  network: str = "csnn"):
    """Train a student from scratch as ``Bench.train`` does (same seed, network, optimizer,
    schedule and batches), with the distiller of ``options`` when given; return ``(model,
    accuracy on bench.test_set, seconds per training epoch)``. ``config`` None: the
    full-precision network."""
    import snnquant
    from snnquant.distill import Distiller
    from spikingjelly.activation_based import functional
    from snnquant.lower_bits import lower_weight_bits
    args = bench.args_for(seed)
    options = dict(options or {})
    # progressive lowering: train at lower_from bits until the epoch lower_at * epochs, then at
    # the configuration's bits (snnquant.lower_bits.lower_weight_bits)
    lower_from, lower_at = options.pop("lower_from", None), options.pop("lower_at", None)
    distil = bool(options)
    torch.manual_seed(seed)
    start = config if config is None or lower_from is None else snnquant.QuantConfig(
        weight_bits=lower_from, v_bits=config.v_bits)
    model = build(bench, network, start, seed)
    lr = learning_rate(bench, network, config)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    epochs = bench.epochs
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, epochs))
    distiller = Distiller(model, teacher, **options) if distil else None
    seconds = 0.0
    for epoch in range(epochs):
        if lower_from is not None and epoch == int(lower_at * epochs):
            lower_weight_bits(model, config.weight_bits)
        if epoch >= epochs - freeze_bn_epochs:
            snnquant.freeze_batchnorm(model)
        loader, _ = bench.ex.make_loaders(bench.train_set, bench.test_set, args, 0, 1, epoch)
        model.train()
        t0 = time.time()
        for frames, y in loader:
            train_step(model, opt, distiller, frames, y)
        seconds += time.time() - t0
        sched.step()
    if distiller is not None:
        distiller.remove()
    return model, bench.evaluate(model, seed), seconds / max(1, epochs)


def deploy(bench, model, seed: int) -> dict:
    """Fold, export and run ``IntegerSNN`` on ``bench.test_set``: its accuracy and the share of
    samples whose output spikes equal the trained network's. Folding must change nothing
    (FoldWarning), except for binary weights, whose BatchNorm folds after training
    (``fold_batchnorm`` rescales alpha): ``fold_changed`` then says so and the agreement is with
    the folded network."""
    from spikingjelly.activation_based import functional
    from snnquant.export import IntegerSNN, fold_batchnorm, to_integer
    from snnquant.export import FoldWarning
    model.eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FoldWarning)
        folded = fold_batchnorm(model)
    changed = [str(w.message) for w in caught if issubclass(w.category, FoldWarning)]
    binary = any(getattr(getattr(m, "weight_quant", None), "bits", None) == 1
                 for m in model.modules())
    if changed and not binary:
        raise FoldWarning(changed[0])
    reference = folded.eval() if changed else model
    sim = IntegerSNN(to_integer(folded.eval()))
    args = bench.args_for(seed)
    _, loader = bench.ex.make_loaders(bench.train_set, bench.test_set, args, 0, 1, 0)
    correct = equal = count = 0
    with torch.no_grad():
        for frames, y in loader:
            functional.reset_net(reference)
            trained = reference(frames.float().transpose(0, 1))
            out = sim(frames.transpose(0, 1).to(torch.int64))
            correct += int((out.float().mean(0).argmax(-1) == y).sum())
            equal += int((out.float() == trained.float()).flatten(2).all(-1).all(0).sum())
            count += int(y.numel())
    functional.reset_net(reference)
    return dict(deployed=correct / count, agreement=equal / count, fold_changed=bool(changed))


def deploy_sdt(bench, model, seed: int) -> dict:
    """``deploy`` for the transformer (``Cropped``): fold with its example input (a
    ``FoldWarning`` is an error), ``to_integer`` exact up to the data's largest count,
    ``IntegerSNN`` on the cropped test recordings; agreement = ``integer_agreement`` (whole output
    identical) over every test sample."""
    from spikingjelly.activation_based import functional
    from snnquant.cli.zoo import data_input_max
    from snnquant.export import IntegerSNN, fold_batchnorm, integer_agreement, to_integer
    from snnquant.export import FoldWarning
    import transformer_nmnist as sdt
    x = sdt.crop(example_input(bench, seed))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FoldWarning)
        folded = fold_batchnorm(model.net.eval(), example_input=x)
    functional.reset_net(folded)
    largest = max(data_input_max(bench.train_set), data_input_max(bench.test_set))
    desc = to_integer(folded, example_input=x, input_max=largest)
    sim = IntegerSNN(desc, synapse_arithmetic="auto")
    _, loader = bench.ex.make_loaders(bench.train_set, bench.test_set, bench.args_for(seed), 0,
                                      1, 0)
    correct = equal = count = 0
    with torch.no_grad():
        for frames, y in loader:
            xt = sdt.crop(frames.transpose(0, 1)).to(torch.int64)
            out = sim(xt)
            score = out if desc.output_time_mean else out.float().mean(0)
            correct += int((score.float().argmax(-1) == y).sum())
            functional.reset_net(folded)
            equal += round(integer_agreement(folded, xt.float(), desc) * y.numel())
            count += int(y.numel())
    return dict(deployed=correct / count, agreement=equal / count, fold_changed=False)


def teacher_for(bench, seed: int, network: str = "csnn", cache=None):
    """The full-precision network of ``seed`` (``--fp-cache``: trained once) and its accuracy."""
    t0 = time.time()
    if network == "csnn":
        model, acc = bench.train(None, seed)
        return model, acc, time.time() - t0
    import snnquant
    path = None if cache is None else os.path.join(
        cache, f"sdt_fp_{bench.data_sha256()[:12]}_T{bench.args.T}_e{bench.epochs}_s{seed}.pt")
    if path and os.path.exists(path):
        model = build(bench, network, None, seed)
        model.load_state_dict(snnquant.load_checkpoint(path))
        print(f"full precision seed {seed}: loaded {path}", flush=True)
        return model, bench.evaluate(model, seed), 0.0
    model, acc, _ = train_student(bench, None, seed, None, None, 0, network)
    if path:
        os.makedirs(cache, exist_ok=True)
        snnquant.save_checkpoint(model.state_dict(), path)
    return model, acc, time.time() - t0


def validation_bench(bench, val_count: int):
    """``bench`` with the test set replaced by ``val_count`` training recordings (stratified,
    seed 1) and the training set by the others: the test recordings are not read."""
    import numpy as np
    from torch.utils.data import Subset
    from snnquant.datasets import stratified_split
    data, index = bench.train_set, list(range(len(bench.train_set)))
    if isinstance(data, Subset):  # --quick: a subset of the training recordings
        data, index = data.dataset, [int(i) for i in data.indices]
    labels = np.array([data.samples[i][1] for i in index])
    split = stratified_split(labels, test_count=min(val_count, len(labels) // 2), seed=1)
    bench.train_set, bench.test_set = (Subset(data, [index[i] for i in split["train"]]),
                                       Subset(data, [index[i] for i in split["test"]]))
    bench._data_sha256 = None
    return bench


def save_seed(args, seed: int, rows: dict) -> None:
    payload = dict(machine=common.machine(), epochs=args.epochs, seed=seed, data=args.data_label,
                   network=args.network, threads=torch.get_num_threads(),
                   data_sha256=args.data_sha256, validate=args.validate,
                   freeze_bn_epochs=args.freeze_bn_epochs, options=vars_options(args),
                   rows=rows, command="python benchmarks/distill_low_bits.py "
                   + shlex.join(sys.argv[1:]),
                   finished=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    write_files(args.out, {f"{args.name}_s{seed}.json": json.dumps(payload, indent=2,
                                                                   default=str)})


def vars_options(args) -> dict:
    return dict(temperature=args.temperature, kd_weight=args.kd_weight, align=args.align,
                align_weight=args.align_weight)


def done_rows(args, seed: int) -> dict:
    """``--resume``: the rows of ``seed`` already in its results file (same epochs, data, split,
    network and options), else none."""
    path = os.path.join(args.out, f"{args.name}_s{seed}.json")
    if not (args.resume and os.path.exists(path)):
        return {}
    with open(path) as f:
        old = json.load(f)
    same = (old["epochs"], old["data_sha256"], old["validate"], old.get("network", "csnn"),
            old["options"]) == (args.epochs, args.data_sha256, args.validate, args.network,
                                vars_options(args))
    return old["rows"] if same else {}


def run_seed(args, bench, seed: int) -> dict:
    import snnquant
    rows = done_rows(args, seed)
    teacher, acc, sec = teacher_for(bench, seed, args.network, args.fp_cache)
    if "FP" not in rows:
        rows["FP"] = {"full precision": dict(trained=acc, seconds=sec)}
    print(f"seed {seed} FP: {acc:.4f} ({sec:.0f} s)", flush=True)
    save_seed(args, seed, rows)
    runs = ([(c, m, method_options(args, m)) for c in args.configs for m in args.methods]
            if not args.validate else
            [(c, m, CANDIDATES[m]) for c in args.configs for m in args.candidates])
    for name, method, options in runs:
        if method in rows.get(name, {}):
            print(f"seed {seed} {name} {method}: already in the results file", flush=True)
            continue
        w, v = CONFIGS[name]
        cfg = snnquant.QuantConfig(weight_bits=w, v_bits=v)
        model, acc, per_epoch = train_student(bench, cfg, seed, teacher, options,
                                              args.freeze_bn_epochs, args.network)
        row = dict(trained=acc, seconds_per_epoch=per_epoch, options=options)
        row.update(deploy(bench, model, seed) if args.network == "csnn" else
                   deploy_sdt(bench, model, seed))
        rows.setdefault(name, {})[method] = row
        print(f"seed {seed} {name} {method}: trained {acc:.4f} deployed {row['deployed']:.4f} "
              f"agreement {row['agreement']:.4f} ({per_epoch:.2f} s/epoch)", flush=True)
        save_seed(args, seed, rows)
    return rows


def report(parts: list) -> str:
    """The table of the per-seed results ``parts`` (one validation or one test run)."""
    first = parts[0]
    seeds = [p["seed"] for p in parts]
    split = ("validation split (160 of the 800 training recordings, stratified, seed 1; trained "
             "on the other 640)" if first["validate"] else "test split (200 recordings)")
    network = first.get("network", "csnn")
    targets = TARGETS_SDT if network == "sdt" else TARGETS
    lines = [f"Network: {NETWORKS[network]}. "
             f"Data: {first['data']}; evaluated on the {split}; {first['epochs']} epochs from "
             f"scratch, BatchNorm folded in training (last {first['freeze_bn_epochs']} epochs "
             f"frozen), seeds {seeds}; deployed = fold_batchnorm (FoldWarning an error) + "
             f"to_integer + IntegerSNN, 0 fine-tuning epochs; agreement = samples whose integer "
             f"output spikes equal the trained network's. Median (min..max) over the seeds; "
             f"points relative to full precision's median over the same seeds. The seconds per epoch were measured "
             f"on a shared 2-core machine whose load changed from run to run: "
             + ("the cost of distillation is measured apart (distill_low_bits_cost)."
                if network == "csnn" else
                "the ratio to the default's is a rough cost of distillation (measured apart, "
                "epoch by epoch in turn, for the CSNN only: distill_low_bits_cost)."), "",
             "| configuration | method | seeds | trained | deployed (0 ft) | vs full precision | "
             "agreement | s/epoch (training) |", "|---|---|---|---|---|---|---|---|"]
    fp = [p["rows"]["FP"]["full precision"]["trained"] for p in parts]
    lines.append(f"| full precision | - | {len(fp)} | {fmt(fp)} | - | - | - | - |")
    names = [n for n in CONFIGS if any(n in p["rows"] for p in parts)]
    for name in names:
        # every method measured on some seed, in the order first measured
        methods = list(dict.fromkeys(m for p in parts for m in p["rows"].get(name, {})))
        base_time = None
        for method in methods:
            have = [p for p in parts if method in p["rows"].get(name, {})]
            rows = [p["rows"][name][method] for p in have]
            fp_same = statistics.median(p["rows"]["FP"]["full precision"]["trained"] for p in have)
            dep = [r["deployed"] for r in rows]
            per_epoch = statistics.median(r["seconds_per_epoch"] for r in rows)
            if method == "default":
                base_time = per_epoch
            rel = f" ({per_epoch / base_time:.2f}x)" if base_time and method != "default" else ""
            lines.append(f"| {name} | {method} | {len(rows)} | {fmt([r['trained'] for r in rows])} | "
                         f"{fmt(dep)} | {100 * (statistics.median(dep) - fp_same):+.1f} | "
                         f"{fmt([r['agreement'] for r in rows])} | {per_epoch:.2f}{rel} |")
    refolded = sorted({name for p in parts for name, methods in p["rows"].items()
                       for r in methods.values() if r.get("fold_changed")})
    if refolded:
        lines += ["", f"{', '.join(refolded)}: binary weights' BatchNorm folds after training "
                      f"(fold_batchnorm rescales alpha, with a FoldWarning), so deployed may "
                      f"differ from trained; the agreement is with the folded network."]
    if not first["validate"]:
        lines += ["", "Targets of issue 48 (deployed, median, against full precision's median):",
                  ""]
        for name in [n for n in names if n in targets]:
            for method in ("default", "kd"):
                have = [p for p in parts if method in p["rows"].get(name, {})]
                if not have:
                    continue
                dep = [p["rows"][name][method]["deployed"] for p in have]
                gap = 100 * (statistics.median(dep) - statistics.median(
                    p["rows"]["FP"]["full precision"]["trained"] for p in have))
                lines.append(f"- {name} {method}: >= full precision - {targets[name]}: "
                             f"{'met' if gap >= -targets[name] - 1e-9 else 'missed'} "
                             f"({gap:+.2f} points, {len(dep)} seeds)")
    lines += ["", "Options of each method (snnquant.distill.Distiller):", ""]
    options = {}
    for p in parts:
        for method, row in p["rows"].get(names[0], {}).items() if names else ():
            options.setdefault(method, row["options"])
    lines += [f"- {method}: {opts}" for method, opts in options.items()]
    lines += ["", "Per seed (deployed accuracy %):", ""]
    for p in parts:
        cells = [f"FP {100 * p['rows']['FP']['full precision']['trained']:.2f}"]
        for name in names:
            cells += [f"{name} {m} {100 * r['deployed']:.2f}"
                      for m, r in p["rows"].get(name, {}).items()]
        lines.append(f"- seed {p['seed']}: " + "; ".join(cells))
    commands = sorted({c for p in parts for c in p.get("commands", [p["command"]])})
    lines += ["", "Measured by: " + "; ".join(f"`{c}`" for c in commands)]
    return "\n".join(lines) + "\n"


def combine(paths: list, out: str, name: str) -> str:
    parts = []
    for path in paths:
        with open(path) as f:
            parts.append(json.load(f))
    keys = {(p["epochs"], p["data_sha256"], p["validate"], p.get("network", "csnn"))
            for p in parts}
    if len(keys) != 1:
        raise SystemExit(f"--combine: the files differ in epochs, data, split or network: "
                         f"{sorted(keys)}")
    # rows of one seed from several files (configurations run separately) are merged
    by_seed = {}
    for p in parts:
        seen = by_seed.setdefault(p["seed"], dict(p, rows={}, commands=[]))
        seen["commands"].append(p["command"])
        for config, methods in p["rows"].items():
            for method, row in methods.items():
                if config != "FP" and method in seen["rows"].get(config, {}):
                    raise SystemExit(f"--combine: seed {p['seed']} {config} {method} is in two "
                                     f"files")
                seen["rows"].setdefault(config, {})[method] = row
    table = report([by_seed[s] for s in sorted(by_seed)])
    from _tables import md_to_rst
    write_files(out, {f"{name}.md": table, f"{name}_table.rst": md_to_rst(table),
                      f"{name}.json": json.dumps(dict(parts=parts), indent=2, default=str)})
    return table


def time_epochs(args, bench) -> str:
    """``--time-epochs N``: the cost of distillation, with the machine's load drift taken out:
    one student with and one without the distiller (the ``kd`` options) train in turn, epoch by
    epoch, ``N`` epochs each, in this process; the median of the per-pair ratios."""
    import snnquant
    from snnquant.distill import Distiller
    from spikingjelly.activation_based import functional
    seed = args.seeds[0]
    teacher, _, _ = teacher_for(bench, seed)
    w, v = CONFIGS[args.configs[0]]
    bargs = bench.args_for(seed)
    students = []
    for distil in (False, True):
        torch.manual_seed(seed)
        model, _ = snnquant.quantize_model(bench.ex.build_csnn(bargs.channels, bargs.tau),
                                           snnquant.QuantConfig(weight_bits=w, v_bits=v))
        opt = torch.optim.Adam(model.parameters(), lr=bench.ex.default_lr(w, None))
        options = method_options(args, "kd")
        students.append((model, opt, Distiller(model, teacher, **options) if distil else None))
    seconds = {False: [], True: []}
    for epoch in range(args.time_epochs):
        loader, _ = bench.ex.make_loaders(bench.train_set, bench.test_set, bargs, 0, 1, epoch)
        batches = list(loader)
        for model, opt, distiller in students:
            model.train()
            t0 = time.time()
            for frames, y in batches:
                train_step(model, opt, distiller, frames, y)
            seconds[distiller is not None].append(time.time() - t0)
    ratios = [b / a for a, b in zip(seconds[False], seconds[True])]
    table = (f"Cost of distillation ({args.configs[0]}, the kd options {method_options(args, 'kd')}): "
             f"{args.time_epochs} training epochs each on the {len(bench.train_set)} training "
             f"recordings, with and without the distiller in turn in one process (one thread; "
             f"the machine was shared, so the pairs' ratio counts, not the seconds).\n\n"
             f"| | s/epoch without | s/epoch with distillation | ratio (median of pairs) |\n"
             f"|---|---|---|---|\n"
             f"| {args.configs[0]} | {statistics.median(seconds[False]):.2f} | "
             f"{statistics.median(seconds[True]):.2f} | {statistics.median(ratios):.2f}x "
             f"({min(ratios):.2f}..{max(ratios):.2f}) |\n")
    if not args.quick:
        common.write_results("distill_low_bits_cost", dict(
            seconds_without=seconds[False], seconds_with=seconds[True], ratios=ratios,
            options=method_options(args, "kd"), config=args.configs[0]), table, args.out)
        from _tables import md_to_rst
        write_files(args.out, {"distill_low_bits_cost_table.rst": md_to_rst(table)})
    return table


def main():
    ap = common.common_args(__doc__, default_epochs=30)
    ap.add_argument("--configs", nargs="+", default=["W2/V4"], choices=list(CONFIGS))
    ap.add_argument("--methods", nargs="+", default=["default", "kd"], choices=METHODS)
    ap.add_argument("--temperature", type=float, default=0.2)
    ap.add_argument("--kd-weight", type=float, default=0.5)
    ap.add_argument("--align", default="none", choices=("none", "firing_rate", "membrane",
                                                        "attention"))
    ap.add_argument("--network", default="csnn", choices=("csnn", "sdt"),
                    help="the example's CSNN, or the Spike-driven Transformer of "
                         "transformer_nmnist.py (embed 32, 1 block)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the rows already in each seed's results file (same options) and "
                         "run the others")
    ap.add_argument("--align-weight", type=float, default=1.0)
    ap.add_argument("--validate", action="store_true",
                    help="evaluate --candidates on a validation split of the training recordings")
    ap.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    ap.add_argument("--val-count", type=int, default=160)
    ap.add_argument("--freeze-bn-epochs", type=int, default=None)
    ap.add_argument("--name", default=None, help="results file name (default distill_low_bits"
                    "[_val]_real)")
    ap.add_argument("--combine", nargs="+", metavar="JSON", default=None)
    ap.add_argument("--time-epochs", type=int, default=None, metavar="N",
                    help="measure the cost of distillation only: N epochs with and N without, "
                         "in turn (the first seed and configuration)")
    if "--combine" in sys.argv:
        args = ap.parse_args()
        print(combine(args.combine, args.out, args.name or "distill_low_bits_real"))
        return
    args, bench = common.parse_and_bench(ap)
    args.data_label = common.data_label(args, args.root)
    if args.freeze_bn_epochs is None:
        args.freeze_bn_epochs = args.epochs // 4
    if args.validate:
        bench = validation_bench(bench, args.val_count)
        args.data_sha256 = bench.data_sha256()
    if args.name is None:
        args.name = "distill_low_bits" + ("_sdt" if args.network == "sdt" else "") + (
            "_val" if args.validate else "") + (
            "" if args.root is None else "_real")
    if args.quick:
        args.out = os.path.join("/tmp", "distill_quick")
    if args.time_epochs:
        print(time_epochs(args, bench))
        return
    for seed in args.seeds:
        run_seed(args, bench, seed)


if __name__ == "__main__":
    main()
