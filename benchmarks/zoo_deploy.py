"""Every network of SpikingJelly 2.0's model package through snnquant's deployment (issue 32 §3):
quantize / train / fold / IntegerSNN / C / NIR, one row per network.

Small instances (16x16 or 32x32 inputs, T = 4, N = 2, embeddings 32, depth 1; the
ResNets and VGG as SpikingJelly builds them, at 32x32), 4-bit weights and 8-bit membranes. Per
network:

* quantize: ``quantize_model(net, QuantConfig(weight_bits=4, v_bits=8), example_input=x)``;
  the number of BatchNorms it trains folded;
* train: one Adam step on the mean squared output (a training step runs and changes the
  weights), then one training-mode pass with every BatchNorm's ``momentum=None`` (its running
  statistics become that batch's, which keeps every layer spiking; Kaiming weights, BatchNorm
  beta 1, as ``tests/test_export_transformers.py``);
* fold: ``fold_batchnorm(..., example_input=x)``: how many folded, or the refusal;
* IntegerSNN: ``to_integer(..., example_input=x, input_max=1)`` and ``compare_integer`` on the
  spike input: the agreement of every neuron layer at every step and of the output, and the
  layers that never spiked; or the refusal (the submodule, its class and the operation);
* C: ``to_c`` compiled with ``-std=c99 -Wall -Wextra -Werror -pedantic -O1``, run on the same
  input: equal to IntegerSNN's last layer at every step, with ROM and RAM; or the refusal;
* NIR: ``to_nir``: the number of nodes, or the refusal;
* Xylo, Loihi 2, Speck: ``quantize_for_xylo`` / ``quantize_for_loihi`` / ``quantize_for_speck``
  of the float network (the chips' own layers train in the chip's arithmetic): the number of chip
  layers, or the refusal.

:func:`readme_table` is the short form of the table that the README shows (one word or the
reason per cell); tests/test_readme.py checks the README's copy against ``zoo_deploy.json``.

Prints a Markdown table and writes ``benchmarks/results/zoo_deploy.json`` and ``.md``, and the
table the deploy guide includes, ``benchmarks/results/zoo_deploy_table.rst``. About fifteen minutes
on one core (gcc compiling the full-width VGG-11's 128 MB of C takes ten of them)::

    python benchmarks/zoo_deploy.py
    python benchmarks/zoo_deploy.py --only spikformer   # one network (nothing written)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import use_checkout  # noqa: E402
from _tables import RESULTS, write_files, write_rst_table  # noqa: E402

use_checkout()
from bench_c_runtime import DRIVER  # noqa: E402  (the C driver: int32 T, N, inputs; int64 out)
from snnquant import QuantConfig, quantize_model  # noqa: E402
from snnquant.export import (FoldWarning, SilentNetworkWarning, c_memory,  # noqa: E402
                             compare_integer, fold_batchnorm, to_c, to_integer, to_nir)

T, N = 4, 2
STRICT = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O1"]
COLUMNS = ("quantize", "train", "fold", "IntegerSNN", "C", "NIR", "Xylo", "Loihi 2", "Speck")


def networks():
    """``{name: (builder, one sample's shape, steps)}`` of every network class and factory of
    ``spikingjelly.activation_based.model`` (one instance per family where several differ only
    in depth or width). ``steps``: ``True`` (multi-step, input ``[T, N, ...]``), ``False``
    (single-step, ``[N, ...]`` per step) or ``"inside"`` (multi-step layers, an ``[N, ...]``
    input that the forward repeats over its own time steps)."""
    from spikingjelly.activation_based import neuron
    from spikingjelly.activation_based.model import (masnn, maxformer, ms_resnet,
                                                     parametric_lif_net as plif, qkformer,
                                                     sew_resnet, snas_net, spike_dhs,
                                                     spike_driven_transformer, spikformer,
                                                     spiking_resnet, spiking_vgg,
                                                     spiking_vggws_ottt)
    snas_args = types.SimpleNamespace(timestep=T, second_avgpooling=2, dataset="cifar10",
                                      celltype="forward", threshold=1.0, tau=2.0)
    con_mat = torch.tensor([[0, 1, 2, 2], [0, 0, 2, 1], [0, 0, 0, 2], [0, 0, 0, 0]])
    lif = dict(spiking_neuron=neuron.LIFNode, tau=2.0)
    return {
        "spiking_resnet.spiking_resnet18": (lambda: spiking_resnet.spiking_resnet18(
            spiking_neuron=neuron.IFNode, num_classes=10), (3, 32, 32), True),
        "sew_resnet.sew_resnet18 (ADD)": (lambda: sew_resnet.sew_resnet18(
            spiking_neuron=neuron.IFNode, cnf="ADD", num_classes=10), (3, 32, 32), True),
        "spiking_vgg.spiking_vgg11_bn": (lambda: spiking_vgg.spiking_vgg11_bn(
            spiking_neuron=neuron.IFNode, num_classes=10), (3, 32, 32), True),
        "parametric_lif_net.MNISTNet": (lambda: plif.MNISTNet(channels=16, **lif),
                                        (1, 28, 28), True),
        "parametric_lif_net.FashionMNISTNet": (lambda: plif.FashionMNISTNet(channels=16, **lif),
                                               (1, 28, 28), True),
        "parametric_lif_net.NMNISTNet": (lambda: plif.NMNISTNet(channels=16, **lif),
                                         (2, 34, 34), True),
        "parametric_lif_net.CIFAR10Net": (lambda: plif.CIFAR10Net(channels=16, **lif),
                                          (3, 32, 32), True),
        "parametric_lif_net.CIFAR10DVSNet": (lambda: plif.CIFAR10DVSNet(channels=16, **lif),
                                             (2, 128, 128), True),
        "parametric_lif_net.DVSGestureNet": (lambda: plif.DVSGestureNet(channels=16, **lif),
                                             (2, 128, 128), True),
        # tau = 2: the papers' 4/3 is not a power of two (to_integer(leak_bits=...) exports it
        # approximately)
        "ms_resnet.MSResNet": (lambda: ms_resnet.MSResNet(
            T=T, num_classes=10, layers=(1, 1, 1), base_channels=16, stem_kernel_size=3,
            stem_stride=1, tau=2.0), (3, 16, 16), True),
        "ms_resnet.MaxResNet": (lambda: ms_resnet.MaxResNet(
            T=T, num_classes=10, layers=(1, 1, 1), base_channels=16, stem_kernel_size=3,
            stem_stride=1), (3, 16, 16), True),
        "spikformer.Spikformer": (lambda: spikformer.Spikformer(
            T=T, img_size_h=16, img_size_w=16, patch_size=4, num_classes=10, embed_dims=32,
            num_heads=2, depths=1), (3, 16, 16), True),
        "spike_driven_transformer.SpikeDrivenTransformer": (
            lambda: spike_driven_transformer.SpikeDrivenTransformer(
                T=T, num_classes=10, embed_dims=32, num_heads=2, depths=1), (3, 32, 32), True),
        "qkformer.QKFormer": (lambda: qkformer.QKFormer(
            T=T, num_classes=10, embed_dims=32, num_heads=(1, 2, 2), depths=(1, 1, 1)),
            (3, 32, 32), True),
        "maxformer.MaxFormer": (lambda: maxformer.MaxFormer(
            T=T, num_classes=10, embed_dims=32, depths=(1, 1, 1)), (3, 32, 32), True),
        "maxformer.MaxFormer (cifar=True)": (lambda: maxformer.MaxFormer(
            T=T, num_classes=10, embed_dims=32, depths=(1, 1, 1), cifar=True), (3, 32, 32), True),
        "masnn.MASNN": (lambda: masnn.MASNN(
            T=T, in_channels=3, num_classes=10, input_size=(16, 16), channels=(32, 32),
            pools=(1, 2), fc_hidden=32, reduction_t=2, reduction_c=4), (3, 16, 16), True),
        # single-step: its forward loops over the T steps itself
        "snas_net.SNASNet": (lambda: snas_net.SNASNet(snas_args, con_mat), (3, 32, 32), False),
        "spike_dhs.SpikeDHS": (lambda: spike_dhs.SpikeDHS(
            3, types.SimpleNamespace(fea_num_layers=8, fea_filter_multiplier=8,
                                     fea_block_multiplier=3, fea_step=3, dataset="cifar10")),
            (3, 32, 32), "inside"),
        # weight-standardised convolutions (WSConv2d) and OTTT's LIF; its classifier expects
        # 512 channels at the end
        "spiking_vggws_ottt.OTTTSpikingVGG": (lambda: spiking_vggws_ottt.OTTTSpikingVGG(
            [32, "M", 512, "M"], num_classes=10, spiking_neuron=neuron.OTTTLIFNode),
            (3, 16, 16), False),
    }


def _first_line(err: BaseException, limit: int = 300) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: " + (text if len(text) <= limit else text[:limit] + " ...")


def keep_spiking(net: nn.Module) -> nn.Module:
    """``net`` with Kaiming-normal weights (fan-in, ReLU gain) and every BatchNorm's
    ``momentum=None``, so that a training-mode pass sets the running statistics to that batch's,
    which keeps every layer spiking (with the zoo's own initialisation, std 0.02, and momentum
    0.1, deep layers fall silent and an agreement checks nothing); zero-initialised BatchNorm
    weights (MS-ResNet's last of a block) become 0.5 so that the blocks add something, and every
    beta 1, so that attention's products of three spike tensors reach the attention neurons'
    threshold (at beta 0 Spikformer's attention neurons stay silent)."""
    for m in net.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.momentum = None
            if m.affine:
                if not bool(m.weight.any()):
                    nn.init.constant_(m.weight, 0.5)
                nn.init.constant_(m.bias, 1.0)
    return net


def _tensor(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _compile(desc, shape, folder: Path):
    """``to_c`` and gcc (strict flags): the driver's path and the C memory."""
    to_c(desc, folder, "snn", input_shape=shape)
    (folder / "driver.c").write_text(DRIVER)
    cc = shutil.which("cc") or shutil.which("gcc")
    exe = folder / "driver"
    res = subprocess.run([cc, *STRICT, str(folder / "snn.c"), str(folder / "driver.c"), "-o",
                          str(exe)], capture_output=True, text=True)
    if res.returncode or res.stderr:
        raise RuntimeError(f"gcc: {res.stderr.strip()[:300]}")
    return exe, c_memory(desc, shape)


def _run_c(exe: Path, x: torch.Tensor) -> torch.Tensor:
    folder = exe.parent
    steps, n = x.shape[0], x.shape[1]
    data = x.to(torch.int32).transpose(0, 1).contiguous().numpy()
    (folder / "in.bin").write_bytes(np.array([steps, n], dtype=np.int32).tobytes()
                                    + data.tobytes())
    subprocess.run([str(exe), str(folder / "in.bin"), str(folder / "out.bin")], check=True,
                   capture_output=True, timeout=600)
    out = np.frombuffer((folder / "out.bin").read_bytes(), dtype=np.int64).reshape(n, steps, -1)
    return torch.from_numpy(out.copy()).transpose(0, 1)


def measure(name, build, shape, multi) -> dict:
    """One row: every column's result (``'ok ...'`` or the refusal's first line)."""
    from spikingjelly.activation_based import functional as sjf
    from snnquant.export import IntegerSNN
    torch.manual_seed(0)
    start = time.perf_counter()
    g = torch.Generator().manual_seed(1)
    x_seq = (torch.rand((T, N) + shape, generator=g) > 0.5).float()
    x = x_seq if multi is True else x_seq[0]
    row = {"network": name}
    with torch.random.fork_rng():  # the columns below build their network from the same seed
        row.update(chip_columns(build, shape, multi))
    try:
        net = keep_spiking(build())
        if multi:
            sjf.set_step_mode(net, "m")
        q, report = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8), example_input=x)
        row["quantize"] = f"ok, {len(report.folded)} BatchNorms trained folded"
    except Exception as err:  # the zoo network itself does not build, or is refused
        row["quantize"] = _first_line(err)
        return row
    try:
        opt = torch.optim.Adam(q.parameters(), lr=1e-3)
        sjf.reset_net(q)
        loss = _tensor(q.train()(x)).float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sjf.reset_net(q)
        with torch.no_grad():
            q(x)       # BatchNorm statistics of this batch (momentum None)
        sjf.reset_net(q)
        row["train"] = "ok"
    except Exception as err:
        row["train"] = _first_line(err)
        return row
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FoldWarning)
            folded, fold_report = fold_batchnorm(q.eval(), example_input=x, return_report=True)
        row["fold"] = f"ok, {len(fold_report.layers)} folded"
    except Exception as err:
        row["fold"] = _first_line(err)
        return row
    try:
        desc = to_integer(folded, example_input=x, input_max=1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SilentNetworkWarning)
            agreement = compare_integer(folded, x_seq, desc)
        layers = len(agreement.layers)
        worst = min([agreement.output] + list(agreement.layers.values()))
        silent = len(agreement.silent_layers)
        row["IntegerSNN"] = (f"{'exact' if worst == 1.0 else 'DIFFERS'}: {100 * worst:.1f}% "
                             f"({layers} neuron layers, {silent} silent)")
        del caught
    except Exception as err:
        row["IntegerSNN"] = _first_line(err)
        return row
    try:
        with tempfile.TemporaryDirectory() as tmp:
            exe, mem = _compile(desc, shape, Path(tmp))
            _, layers_i = IntegerSNN(desc)(x_seq.long(), record=True)
            ref = layers_i[desc.ops[-1].name].reshape(T, N, -1)
            same = bool(torch.equal(_run_c(exe, x_seq.long()), ref))
        row["C"] = (f"{'equal' if same else 'DIFFERS'}, ROM {mem.rom_bytes} B, "
                    f"RAM {mem.ram_bytes} B")
    except Exception as err:
        row["C"] = _first_line(err)
    try:
        graph = to_nir(desc, shape, consumers=())
        row["NIR"] = f"ok, {len(graph.nodes)} nodes"
    except Exception as err:
        row["NIR"] = _first_line(err)
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def chip_columns(build, shape, multi) -> dict:
    """The chip columns of a row: each chip's ``quantize_for_*`` of a fresh float network."""
    from spikingjelly.activation_based import functional as sjf
    from snnquant.targets import quantize_for_loihi, quantize_for_speck, quantize_for_xylo
    cells = {}
    for column, convert in (("Xylo", quantize_for_xylo), ("Loihi 2", quantize_for_loihi),
                            ("Speck", lambda net: quantize_for_speck(net, shape))):
        try:
            net = build()
            if multi:
                sjf.set_step_mode(net, "m")
            cells[column] = f"ok, {len(convert(net))} chip layers"
        except Exception as err:
            cells[column] = _first_line(err)
    return cells


def _short(cell: str) -> str:
    """A README cell: the outcome in one or two words (the refusals' reasons are in
    zoo_deploy.md)."""
    if "DIFFERS" in cell:
        return "differs"
    if cell.startswith(("exact", "equal")):
        return "exact"
    if cell.startswith("ok"):
        return "yes"
    if cell == "not reached":
        return "-"
    return "refused"


#: the README's columns: the deployment targets
README_COLUMNS = ("IntegerSNN", "C", "NIR", "Xylo", "Loihi 2", "Speck")


def readme_table(rows) -> str:
    """The README's table of what deploys where: per network, ``exact`` (the integer network, or
    the C model, equals the trained one at every layer and step), ``yes`` (NIR: written; a chip:
    converted), ``refused`` (with a reason that ``zoo_deploy.md`` gives) or ``-`` (an earlier
    step refused)."""
    lines = ["| network | " + " | ".join(README_COLUMNS) + " |",
             "|---" * (len(README_COLUMNS) + 1) + "|"]
    for r in rows:
        cells = [_short(r.get(c, "not reached")) for c in README_COLUMNS]
        lines.append("| " + " | ".join([f"`{r['network']}`"] + cells) + " |")
    return "\n".join(lines)


def markdown(rows) -> str:
    lines = ["| network | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for r in rows:
        cells = [r.get(c, "not reached") for c in COLUMNS]
        lines.append("| " + " | ".join([f"`{r['network']}`"] + [c.replace("|", "/")
                                                                 for c in cells]) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="run the networks whose name contains this")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", UserWarning)
    torch.set_num_threads(1)
    rows = [measure(name, *spec) for name, spec in networks().items()
            if args.only is None or args.only in name]
    md = markdown(rows)
    print(md)
    if args.only is not None:
        return rows
    import spikingjelly
    record = {"T": T, "N": N, "weight_bits": 4, "v_bits": 8, "torch": torch.__version__,
              "spikingjelly": getattr(spikingjelly, "__version__", "?"), "rows": rows}
    write_files(RESULTS, {"zoo_deploy.json": json.dumps(record, indent=1) + "\n",
                          "zoo_deploy.md": md + "\n"})
    write_rst_table(RESULTS, "zoo_deploy")  # the deploy guide includes it
    return rows


if __name__ == "__main__":
    main()
