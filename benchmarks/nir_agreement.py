"""Agreement of NIR consumers with snnquant's integer network (accuracy-style, not timing).

For small exported networks (dense, MLP, conv, conv + max pooling; IF and LIF with tau = 2;
weight bits 2, 4, 8; several seeds) the NIR file written by ``snnquant.export.to_nir`` is
imported with each consumer's own importer (SpikingJelly 2.0 ``import_from_nir``, snnTorch 1.0
``import_nir.import_from_nir``, Norse ``from_nir``) and run on the same integer event input; the
table gives the % of samples whose whole output spike train is identical to ``IntegerSNN``'s.
"NIR equations" is ``simulate_nir`` (NIR's equations, float64, no rounding or saturation). Each
consumer is run on the default export and "+ workaround": the graph written with
``max_pool='conv_if'`` and, after import, ``torch.nn.Flatten`` dims shifted past the batch (see
docs/guide/nir.rst). A consumer that cannot import or run a graph counts 0%.

Three kinds of network (the ``networks`` column):

* ``excitatory``: weights drawn to lean excitatory (membranes rarely go far below zero), membrane
  bits 8 and 12;
* ``mixed-sign``: PyTorch's default initialisation (uniform in +-1/sqrt(fan_in), times a gain of
  2 for IF and 4 for LIF so that every layer spikes), membrane bits 8 and 12;
* ``mixed-sign + headroom``: the same networks in the documented configuration: 14 membrane bits
  and ``widen_membrane_range(model, 6)`` (20-bit membranes, range 64 times wider at the same step).

Two more groups of rows (``--rows`` measures some groups and keeps the others' rows from the
results file, unchanged):

* ``residual`` (c): ``ResidualCSNN`` of tests/_nir_consumers.py (a spiking_resnet-style block:
  the shortcut's spikes added to a convolution's current before the neuron) in the same five
  configurations; its "+ workaround" columns read the graph written with ``units='real'`` (no
  ``Scale`` node, which no consumer maps) and ``max_pool='conv_if'``;
* ``trained`` (b): the example's CSNN (examples/train_nmnist.py's network and defaults, 4-bit
  lsq_pow2 weights, LIF tau = 2, T = 8) trained for ``--epochs`` (3) epochs, seed 0, on the
  built-in digits and on the stratified 800/200 split (seed 0) of the real recordings
  ../shared/data/nmnist-real-1k, measured on 200 test samples: with its 8-bit membranes, the
  same widened by 6 bits, and trained with 14-bit membranes and widened by 6 (the headroom
  configuration).

"in bounds" is the % of samples whose NIR membrane never leaves a neuron's saturation bounds
(below v_min, or above v_max without firing); "active" the % of samples with at least one output
spike (a silent network agrees trivially). LIF membrane rounding is not expressible in NIR: LIF
rows are measured, not promised.

    OMP_NUM_THREADS=1 python benchmarks/nir_agreement.py [--quick] [--rows existing trained residual]

writes benchmarks/results/nir_agreement.{json,md} and nir_agreement_summary.rst (included by
docs/guide/nir.rst).
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import sys
import time
import warnings

import torch


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import use_checkout  # noqa: E402
from _tables import RESULTS, write_files  # noqa: E402

ROOT = use_checkout()
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the networks and consumer runners of the tests

from _nir_consumers import (ARCHS, RUNNERS, build_network, events,  # noqa: E402
                            samples_identical)
from snnquant.export import (IntegerSNN, nir_out_of_bounds, simulate_nir,  # noqa: E402
                             to_nir)

DT = 1e-4  # snnTorch's importer assumes dt = 1e-4 for LIF
# (networks, init of build_network, membrane bits, headroom bits of widen_membrane_range)
CONFIGS = [("excitatory", "excitatory", 8, 0), ("excitatory", "excitatory", 12, 0),
           ("mixed-sign", "default", 8, 0), ("mixed-sign", "default", 12, 0),
           ("mixed-sign + headroom", "default", 14, 6)]
#: (c): the residual CSNN of tests/_nir_consumers.py (ResidualCSNN) in the same configurations
RESIDUAL = [(f"residual, {networks}", init, v_bits, headroom)
            for networks, init, v_bits, headroom in CONFIGS]
ROW_GROUPS = ("existing", "trained", "residual")
TRAINED_SAMPLES = 200
TRAINED_EPOCHS = 3  # short: the example's default is 30
COLUMNS = ["NIR equations"] + [f"{c}{w}" for c in ("spikingjelly", "snntorch", "norse")
                               for w in ("", " + workaround")]


def _run(consumer, graph, x, ref, workaround):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = RUNNERS[consumer](graph, x, DT, shift_flatten=workaround)
        return samples_identical(out, ref), None
    except Exception as exc:  # an importer that fails on a graph counts 0%, with its error
        return 0.0, f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"


def agreement(desc, shape, x):
    """Per network: samples in bounds, active, and identical per column (counts), and errors."""
    T, N = x.shape[0], x.shape[1]
    ref = IntegerSNN(desc)(x)
    active = int((ref.reshape(T, N, -1) != 0).any(dim=2).any(dim=0).sum())
    plain = to_nir(desc, shape, dt=DT)
    alt = to_nir(desc, shape, dt=DT, max_pool="conv_if")
    real = to_nir(desc, shape, dt=DT, units="real", max_pool="conv_if")
    in_bounds = int(nir_out_of_bounds(plain, x)[1].sum())
    same, errors = {"NIR equations": samples_identical(simulate_nir(plain, x), ref) * N}, {}
    for consumer in RUNNERS:
        # a residual graph in integer units holds Scale nodes that no consumer maps: the
        # workaround column exports it in real units (docs/guide/nir.rst)
        for workaround, graph in ((False, plain), (True, real if desc.is_graph else alt)):
            col = consumer + (" + workaround" if workaround else "")
            frac, err = _run(consumer, graph, x, ref, workaround)
            same[col] = frac * N
            if err:
                errors[col] = err
    return in_bounds, active, same, errors


def _row(networks, kind, arch, weight_bits, v_bits, init, headroom_bits, results, **extra):
    n_total = sum(r[4] for r in results)
    errors = {}
    for r in results:
        for col, e in r[3].items():
            errors.setdefault(col, e)
    return dict(networks=networks, kind=kind, arch=arch, weight_bits=weight_bits, v_bits=v_bits,
                init=init, headroom_bits=headroom_bits, samples=n_total,
                in_bounds=100.0 * sum(r[0] for r in results) / n_total,
                active=100.0 * sum(r[1] for r in results) / n_total,
                agreement={c: 100.0 * sum(r[2][c] for r in results) / n_total for c in COLUMNS},
                errors=errors, **extra)


def measure(kind, arch, weight_bits, v_bits, seeds, T, N, init="excitatory", headroom_bits=0,
            networks=""):
    results = []
    for seed in seeds:
        desc, shape = build_network(arch, kind, weight_bits, seed, v_bits=v_bits, init=init,
                                    headroom_bits=headroom_bits)
        x = events(shape, T=T, N=N, seed=1000 + seed)
        results.append(agreement(desc, shape, x) + (N,))
    return _row(networks, kind, arch, weight_bits, v_bits, init, headroom_bits, results)


def measure_trained(data, epochs, quick):
    """(b): the example's CSNN (examples/train_nmnist.py's defaults: 4-bit lsq_pow2 weights,
    8-bit membranes, LIF tau = 2, T = 8) trained for ``epochs`` on the built-in digits or the
    real-recordings split, measured on its test set."""
    import snnquant
    from _nmnist_common import Bench
    from snnquant.export import fold_batchnorm, to_integer, widen_membrane_range
    root = None
    if data == "real":
        from pathlib import Path
        import accuracy_nmnist_real as real
        root = Path(ROOT) / "runs" / "real_split" / "nmnist-real-800-200"
        real.lay_out_split(real.shared_recordings(), root, quick=False)
        root = str(root)
    bench = Bench(epochs, data_root=root, quick=quick)
    args = bench.args_for(0)
    _, loader = bench.ex.make_loaders(bench.train_set, bench.test_set, args, 0, 1, 0)
    x = torch.cat([frames.transpose(0, 1).to(torch.int64) for frames, _ in loader],
                  dim=1)[:, :TRAINED_SAMPLES]
    label = "trained (built-in digits)" if data == "builtin" else "trained (real N-MNIST split)"
    rows = []
    # as the example trains it (8-bit membranes), the same widened by 6 bits, and trained in the
    # documented configuration (14-bit membranes, widened by 6 bits)
    for v_bits, headroom in ((8, 0), (8, 6), (14, 6)):
        if headroom == 0 or v_bits == 14:
            config = snnquant.QuantConfig(weight_bits=4, weight_quantizer="lsq_pow2",
                                          v_bits=v_bits)
            model, accuracy = bench.train(config, seed=0)
            folded = fold_batchnorm(model.eval())
        net = widen_membrane_range(folded, headroom) if headroom else folded
        desc = to_integer(net, input_shape=(2, 34, 34))
        if int(x.abs().max()) > desc.input_max:
            raise SystemExit(f"an event count of the test set exceeds input_max={desc.input_max}")
        rows.append(_row(label, "lif", "example CSNN", 4, v_bits, "trained", headroom,
                         [agreement(desc, (2, 34, 34), x) + (x.shape[1],)],
                         epochs=epochs, test_accuracy=round(100.0 * accuracy, 2),
                         data="built-in digits" if data == "builtin" else
                         "nmnist-real-1k, stratified 800/200 split, seed 0 (test 200)"))
    return rows


def _versions():
    out = {}
    for pkg in ("torch", "spikingjelly", "snntorch", "norse", "nir", "nirtorch"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def _cells(r):
    """The leading cells of a summary or network row."""
    bits = f"{r['v_bits']}" + (f" + {r['headroom_bits']}" if r["headroom_bits"] else "")
    return [r["networks"], r["kind"].upper(), bits, str(r["samples"]), f"{r['in_bounds']:.1f}%",
            f"{r['active']:.1f}%"]


HEAD = ["networks", "neuron", "membrane bits (+ headroom)", "samples", "in bounds", "active"]


def _markdown(rows, summary, command, versions):
    lines = [f"NIR agreement with `IntegerSNN` (% of samples with identical output spikes), "
             f"dt = {DT}. Commands: {command}. Versions: "
             + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".", "",
             "Per consumer (all networks of a kind, neuron and membrane width pooled):", "",
             "| " + " | ".join(HEAD + COLUMNS) + " |", "|---" * (len(HEAD) + len(COLUMNS)) + "|"]
    for r in summary:
        lines.append("| " + " | ".join(_cells(r) + [f"{r['agreement'][c]:.1f}%" for c in COLUMNS])
                     + " |")
    head = HEAD[:2] + ["network", "weight bits"] + HEAD[2:]
    lines += ["", "Per network and bit width:", "",
              "| " + " | ".join(head + COLUMNS) + " |", "|---" * (len(head) + len(COLUMNS)) + "|"]
    for r in rows:
        cells = _cells(r)
        cells = cells[:2] + [r["arch"], str(r["weight_bits"])] + cells[2:]
        lines.append("| " + " | ".join(cells + [f"{r['agreement'][c]:.1f}%" for c in COLUMNS])
                     + " |")
    trained = [r for r in rows if "test_accuracy" in r]
    if trained:
        lines += ["", "Trained networks (b): the example's CSNN (examples/train_nmnist.py: 4-bit "
                  "lsq_pow2 weights, LIF tau = 2, T = 8), seed 0, measured on the first "
                  f"{TRAINED_SAMPLES} test samples; training is short (the example's default is "
                  "30 epochs):", ""]
        for r in trained:
            lines.append(f"- {r['networks']}, membrane bits {_cells(r)[2]}: {r['epochs']} epochs "
                         f"on {r['data']}, test accuracy (fake-quantized model, before widening) "
                         f"{r['test_accuracy']:.2f}%")
    errs = {}
    for r in rows:
        for col, e in r["errors"].items():
            errs.setdefault((col, e), []).append(f"{r['kind']}/{r['arch']}")
    if errs:
        lines += ["", "Import or run failures (counted as 0%):", ""]
        for (col, e), where in sorted(errs.items()):
            lines.append(f"- {col}: `{e}` ({', '.join(sorted(set(where)))})")
    return "\n".join(lines) + "\n"


def _rst(summary, command):
    """The per-consumer summary as an RST table, included by docs/guide/nir.rst."""
    head = HEAD + COLUMNS
    lines = [f".. Written by {command.replace('`', '')}; do not edit.", "", ".. list-table::", "   :header-rows: 1",
             ""]
    lines += ["   * - " + head[0]] + [f"     - {h}" for h in head[1:]]
    for s in summary:
        cells = _cells(s) + [f"{s['agreement'][c]:.1f}%" for c in COLUMNS]
        lines += ["   * - " + cells[0]] + [f"     - {c}" for c in cells[1:]]
    return "\n".join(lines) + "\n"


def _group(networks: str) -> str:
    return next((g for g in ROW_GROUPS[1:] if networks.startswith(g)), "existing")


def _summarise(rows, configs):
    summary = []
    for networks, _, v_bits, headroom in configs:
        for kind in ("if", "lif"):
            sel = [r for r in rows if r["networks"] == networks and r["kind"] == kind
                   and r["v_bits"] == v_bits and r["headroom_bits"] == headroom]
            if not sel:
                continue
            n = sum(r["samples"] for r in sel)
            pooled = {key: sum(r[key] * r["samples"] for r in sel) / n
                      for key in ("in_bounds", "active")}
            summary.append(dict(networks=networks, kind=kind, v_bits=v_bits,
                                headroom_bits=headroom, samples=n, **pooled,
                                agreement={c: sum(r["agreement"][c] * r["samples"] for r in sel) / n
                                           for c in COLUMNS}))
    return summary


def _print(r):
    print(f"{r['networks']:34s} {r.get('test_accuracy', '')} {r['kind']:3s} {r['arch']:12s} w{r['weight_bits']} "
          f"v{r['v_bits']}+{r['headroom_bits']}: in bounds {r['in_bounds']:5.1f}% active "
          f"{r['active']:5.1f}% " + " ".join(f"{c}={r['agreement'][c]:.0f}%" for c in COLUMNS),
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke test: one seed, few samples, results not written")
    ap.add_argument("--rows", nargs="+", choices=ROW_GROUPS, default=list(ROW_GROUPS),
                    help="which rows to measure; the others are kept from the results file")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=64, help="samples per network")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=TRAINED_EPOCHS,
                    help="training epochs of the trained rows (b)")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args()
    seeds = range(1 if args.quick else args.seeds)
    N, T = (4, 4) if args.quick else (args.samples, args.steps)
    archs = ARCHS[:1] + ARCHS[-1:] if args.quick else ARCHS
    bits = (2,) if args.quick else (2, 4, 8)
    t0 = time.time()
    rows = []
    plan = ([(CONFIGS, archs)] if "existing" in args.rows else []) + (
        [(RESIDUAL, ("residual",))] if "residual" in args.rows else [])
    for configs, group_archs in plan:
        for networks, init, v_bits, headroom in configs:
            for kind in ("if", "lif"):
                for arch in group_archs:
                    for b in bits:
                        rows.append(measure(kind, arch, b, v_bits, seeds, T, N, init=init,
                                            headroom_bits=headroom, networks=networks))
                        _print(rows[-1])
    if "trained" in args.rows:
        for data in ("builtin", "real"):
            for row in measure_trained(data, 1 if args.quick else args.epochs, args.quick):
                rows.append(row)
                _print(row)
    command = ("OMP_NUM_THREADS=1 python benchmarks/nir_agreement.py"
               + (" --quick" if args.quick else "")
               + ("" if set(args.rows) == set(ROW_GROUPS) else " --rows " + " ".join(args.rows)))
    json_path = os.path.join(args.out, "nir_agreement.json")
    commands = {g: command for g in args.rows}
    if set(args.rows) != set(ROW_GROUPS) and os.path.exists(json_path):
        with open(json_path) as f:  # keep the other groups' rows exactly as measured
            old = json.load(f)
        kept = [r for r in old["rows"] if _group(r["networks"]) not in args.rows]
        commands = {**{_group(r["networks"]): old.get("commands", {}).get(
            _group(r["networks"]), old["command"]) for r in kept}, **commands}
        rows = kept + rows
        rows.sort(key=lambda r: ROW_GROUPS.index(_group(r["networks"])))
    trained = sorted({(r["networks"], "trained", r["v_bits"], r["headroom_bits"]) for r in rows
                      if _group(r["networks"]) == "trained"})
    summary = _summarise(rows, CONFIGS + RESIDUAL + trained)
    shown = "; ".join(f"{g}: `{c}`" for g, c in commands.items())
    versions = _versions()
    text = _markdown(rows, summary, shown, versions)
    print(text)
    if args.quick:  # a smoke test never replaces the committed results
        return
    machine = dict(platform=platform.platform(), python=platform.python_version(),
                   cpu_count=os.cpu_count(), seconds=round(time.time() - t0, 1))
    write_files(args.out, {
        "nir_agreement.json": json.dumps(dict(
            command=command, commands=commands, dt=DT, steps=T, samples_per_network=N,
            seeds=list(seeds), trained_epochs=args.epochs, machine=machine, versions=versions,
            summary=summary, rows=rows), indent=2),
        "nir_agreement.md": text, "nir_agreement_summary.rst": _rst(summary, shown)})


if __name__ == "__main__":
    main()
