"""Time per sample of the C model (``snnquant.export.to_c``, gcc -O2, one core) vs ``IntegerSNN``.

The network is the N-MNIST example's CSNN (``examples/train_nmnist.py``: conv-BN-LIF with stride 2,
conv-BN-LIF, max pooling, linear LIF read-out; 4-bit weights, 8-bit membrane, 34 x 34 input),
folded and exported with ``to_integer``: trained ``--epochs`` epochs on the built-in data and run
on its test samples (the real numbers: its real activity), or untrained on random events
(``--epochs 0``, a smoke test: the event-driven C model's time follows the activity).

Cases, alternated in every repeat (median of ``--repeats`` runs, with min and max):
  * C model, event-driven and dense (``to_c(..., synapses=...)``): the compiled ``<name>_step``
    over all samples and steps (``-O2``, single thread);
  * IntegerSNN, batch: one call on all samples (``torch.set_num_threads(1)``), with
    ``synapse_arithmetic='auto'`` (float32 synapses where proven exact) and with the default
    ``'integer'`` (integer tensors only);
  * IntegerSNN, one sample per call (the way the C model is used on a device), both modes;
  * the fake-quantized float model (folded, eval mode), batch of N (``torch.set_num_threads(1)``).
Also: synaptic operations per sample (nonzero input x output it reaches, counted exactly), the
event-driven C model's nanoseconds per synaptic operation, the ratios the targets name, and the
agreement of both C models with IntegerSNN (over all samples).

Footprint (deterministic, measured whatever the load): ROM and RAM of the C model
(``c_memory``) of the example's CSNN and of a Spike-driven Transformer (SpikingJelly's
``SpikeDrivenTransformer(T=4, in_channels=2, embed_dims=32, num_heads=2, depths=1)``, 2 x 32 x 32,
as ``benchmarks/transformer_nmnist.py``) at 1-, 2-, 4- and 8-bit weights (8-bit membranes), in the
event-driven form (the default) and the dense one; ``to_c`` packs 1-, 2- and 4-bit weights eight,
four and two to a byte. Each row gives the weights' bit-true footprint (weights x bits / 8), the
other constants (biases, rescale factors), the ROM relative to the same network's at 8 bits and,
where ``arm-none-eabi-gcc`` is installed, the Cortex-M4 flash of both forms (the object's text:
code and constants, ``arm-none-eabi-size``).

Widths compared (``--weight-bits 8 4 2``): the C models, event-driven and dense, of the example's
CSNN at each width against its float model, every case alternated in each repeat, each ratio
taken within a repeat (median and range), with the event-driven model on an input without events
(the cost that does not follow the activity); ``bench_c_runtime_bits.json`` (and ``.md``).

Prints a table and writes ``benchmarks/results/bench_c_runtime.json`` (and ``.md``).

    python benchmarks/bench_c_runtime.py --epochs 5 --repeats 21   # the real numbers (quiet machine)
    python benchmarks/bench_c_runtime.py --quick       # smoke test
    python benchmarks/bench_c_runtime.py --footprint-only   # the footprint table alone
    python benchmarks/bench_c_runtime.py --weight-bits 8 4 2 --epochs 5 --repeats 11  # widths
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import cpu_name, use_checkout  # noqa: E402
from _tables import RESULTS, spread, write_files  # noqa: E402

use_checkout()
import _nmnist_common  # noqa: E402  (the example module, loaded in one place)
import snnquant  # noqa: E402
from snnquant import QuantConfig, quantize_model  # noqa: E402
from snnquant.export import IntegerSNN, c_memory, fold_batchnorm, to_c, to_integer  # noqa: E402

C_EVENTS = "C model, event-driven (gcc -O2, 1 thread)"
C_DENSE = "C model, dense (gcc -O2, 1 thread)"
FLOAT = "fake-quantized float model, eval (1 thread)"
INT_AUTO = "IntegerSNN 'auto', batch of N (1 thread)"
INT_AUTO_SINGLE = "IntegerSNN 'auto', one sample per call"
INT_DEFAULT = "IntegerSNN 'integer', batch of N (1 thread)"
INT_DEFAULT_SINGLE = "IntegerSNN 'integer', one sample per call"

DRIVER = r"""
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "snn.h"

/* driver in.bin out.bin: int32 T, N, then N x T x SNN_INPUT_SIZE int32. Runs every sample
 * (reset, T steps), writes the outputs, prints the elapsed nanoseconds of the whole pass. */
int main(int argc, char **argv)
{
    static snn_state s;
    int32_t hdr[2];
    int32_t *in;
    int64_t *out;
    long n, t, count;
    struct timespec t0, t1;
    FILE *fi, *fo;
    if (argc != 3 || (fi = fopen(argv[1], "rb")) == NULL || fread(hdr, 4, 2, fi) != 2) {
        return 2;
    }
    count = (long)hdr[0] * hdr[1];
    in = malloc(sizeof(int32_t) * SNN_INPUT_SIZE * count);
    out = malloc(sizeof(int64_t) * SNN_OUTPUT_SIZE * count);
    if (in == NULL || out == NULL || fread(in, sizeof(int32_t) * SNN_INPUT_SIZE, count, fi) != (size_t)count) {
        return 3;
    }
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (n = 0; n < hdr[1]; n++) {
        snn_reset(&s);
        for (t = 0; t < hdr[0]; t++) {
            long k = n * hdr[0] + t;
            snn_step(&s, in + k * SNN_INPUT_SIZE, out + k * SNN_OUTPUT_SIZE);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fo = fopen(argv[2], "wb");
    if (fo == NULL) {
        return 4;
    }
    fwrite(out, sizeof(int64_t) * SNN_OUTPUT_SIZE, count, fo);
    fclose(fo);
    printf("%.0f\n", (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec));
    return 0;
}
"""


FOOTPRINT_BITS = (1, 2, 4, 8)

#: a Cortex-M4 with its single-precision FPU (hard-float calling convention, Thumb-2), under the
#: host tests' strict flags; tests/test_export_c_cortex_m4.py compiles every zoo network with them
CORTEX_M4_CFLAGS = ("-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv4-sp-d16",
                    "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O2")
CROSS_CC, CROSS_SIZE = "arm-none-eabi-gcc", "arm-none-eabi-size"


def cortex_m4_tools():
    """The paths of ``arm-none-eabi-gcc`` and ``arm-none-eabi-size``, or ``None`` where either
    is missing (Debian: ``apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi``)."""
    cc, size = shutil.which(CROSS_CC), shutil.which(CROSS_SIZE)
    return None if cc is None or size is None else (cc, size)


def cortex_m4_sizes(source, obj, tools=None) -> dict:
    """Compile the C file ``source`` for a Cortex-M4 (:data:`CORTEX_M4_CFLAGS`) into ``obj``;
    return ``{"text", "data", "bss"}`` in bytes as ``arm-none-eabi-size`` reports them. A
    warning or error raises ``RuntimeError`` with the compiler's message."""
    cc, size = tools or cortex_m4_tools()
    res = subprocess.run([cc, *CORTEX_M4_CFLAGS, "-c", str(source), "-o", str(obj)],
                         capture_output=True, text=True)
    if res.returncode != 0 or res.stderr:
        raise RuntimeError(f"{CROSS_CC} on {source}: {res.stderr}")
    out = subprocess.run([size, str(obj)], capture_output=True, text=True, check=True).stdout
    head, row = out.splitlines()[:2]
    if head.split()[:3] != ["text", "data", "bss"]:
        raise RuntimeError(f"{CROSS_SIZE}: unexpected output {out!r}")
    return dict(zip(("text", "data", "bss"), (int(v) for v in row.split()[:3])))


def _footprint_networks(channels: int):
    """``{name: (float network builder, per-sample input shape, T, capture example or None)}``
    of the footprint table."""
    from spikingjelly.activation_based.model import spike_driven_transformer

    ex = _nmnist_common.example()

    def sdt():
        return spike_driven_transformer.SpikeDrivenTransformer(
            T=4, in_channels=2, num_classes=10, embed_dims=32, num_heads=2, depths=1)
    return {f"CSNN (the example's, {channels} channels, 2 x 34 x 34)":
            (lambda: ex.build_csnn(channels=channels, tau=2.0), (2, 34, 34), 8, False),
            "Spike-driven Transformer (embed 32, depth 1, 2 x 32 x 32)":
            (sdt, (2, 32, 32), 4, True)}


def footprint(channels: int, bits_list=FOOTPRINT_BITS) -> list:
    """Rows of the footprint table: per network and weight bit width, the C model's ROM and RAM
    (event-driven and dense), the weights, their bit-true bytes and the other constants.
    Deterministic: sizes depend on the shapes and the bit widths, not on trained values."""
    import math

    from spikingjelly.activation_based import functional

    from snnquant.export import SynapseOp
    from snnquant.export.backends.c.weights import packed_weight_bits
    rows = []
    for name, (build, shape, T, capture) in _footprint_networks(channels).items():
        w8_rom = None
        for bits in sorted(bits_list, reverse=True):
            torch.manual_seed(0)
            x = (torch.rand((T, 2) + shape, generator=torch.Generator().manual_seed(1))
                 < 0.2).float()
            example = x if capture else None
            q, _ = quantize_model(build(), QuantConfig(weight_bits=bits, v_bits=8),
                                  example_input=example)
            functional.reset_net(q)
            with torch.no_grad():
                q.train()(x)
            functional.reset_net(q)
            with warnings.catch_warnings():   # folding W1 after training says what it changes
                warnings.simplefilter("ignore")
                folded = fold_batchnorm(q.eval(), example_input=example)
            # input_max as the timed network and transformer_nmnist.py: the largest the bounds allow
            desc = to_integer(folded, example_input=example,
                              input_shape=None if capture else shape)
            mem = {form: c_memory(desc, shape, synapses=form) for form in ("events", "dense")}
            m4 = {}
            if cortex_m4_tools():   # flash (code and constants) of the object, both forms
                with tempfile.TemporaryDirectory() as tmp:
                    for form in ("events", "dense"):
                        _, source = to_c(desc, Path(tmp) / form, "snn", input_shape=shape,
                                         synapses=form)
                        m4[form] = cortex_m4_sizes(source, Path(tmp) / form / "snn.o")
            synapses = [op for op in desc.ops if isinstance(op, SynapseOp)]
            weights = sum(op.weight.numel() for op in synapses)
            stored = sum(math.ceil(op.weight.numel() * (packed_weight_bits(op) or 8) / 8)
                         for op in synapses)
            rom = mem["events"].rom_bytes
            w8_rom = rom if bits == 8 else w8_rom
            rows.append(dict(network=name, weight_bits=bits, weights=weights,
                             bit_true_weight_bytes=weights * bits / 8,
                             stored_weight_bytes=stored, other_constant_bytes=rom - stored,
                             rom_bytes=rom, rom_bytes_dense=mem["dense"].rom_bytes,
                             ram_bytes=mem["events"].ram_bytes,
                             ram_bytes_dense=mem["dense"].ram_bytes,
                             rom_over_bit_true=rom / (weights * bits / 8 + rom - stored),
                             rom_over_w8=None if w8_rom is None else rom / w8_rom,
                             cortex_m4=m4 or None))
    order = {b: i for i, b in enumerate(bits_list)}
    rows.sort(key=lambda r: (r["network"], order[r["weight_bits"]]))
    return rows


def footprint_markdown(rows) -> str:
    """The footprint rows as a Markdown table."""
    lines = ["| network | weight bits | ROM (B) | / ROM at 8 bits | weights, bit-true (B) | other "
             "constants (B) | ROM / (bit-true + other) | RAM event-driven (B) | RAM dense (B) | "
             "Cortex-M4 flash event-driven (B) | Cortex-M4 flash dense (B) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        w8 = "n/a" if r["rom_over_w8"] is None else f"{r['rom_over_w8']:.2f}"
        m4 = r.get("cortex_m4") or {}
        flash = [f"{m4[f]['text']:,}" if f in m4 else "n/a" for f in ("events", "dense")]
        lines.append(f"| {r['network']} | {r['weight_bits']} | {r['rom_bytes']:,} | {w8} | "
                     f"{r['bit_true_weight_bytes']:,.0f} | {r['other_constant_bytes']:,} | "
                     f"{r['rom_over_bit_true']:.3f} | {r['ram_bytes']:,} | "
                     f"{r['ram_bytes_dense']:,} | {flash[0]} | {flash[1]} |")
    tools = cortex_m4_tools()
    if tools:
        version = compiler_version(tools[0])
        lines += ["", f"Cortex-M4 flash: the text section (code and constants) of the model's "
                      f"object as `arm-none-eabi-size` reports it, compiled with "
                      f"`{' '.join(CORTEX_M4_CFLAGS)}` ({version}); the model has no data or "
                      f"bss section of its own: its RAM is the caller's state, whose size the "
                      f"source checks at compile time against the header's RAM_BYTES, so on the "
                      f"Cortex-M4 too it is the RAM columns (stack not included)."]
    else:
        lines += ["", f"Cortex-M4 flash: n/a ({CROSS_CC} not installed where this ran)."]
    return "\n".join(lines) + "\n"


def example_network(channels: int, epochs: int = 0, T: int = 8, N: int = 64, density=0.05,
                    weight_bits: int = 4):
    """``(desc, folded float model, x [T, N, 2, 34, 34] int64)``: the example's CSNN quantized
    (``weight_bits``/V8, W4/V8 by default), untrained on random events of ``density`` (``epochs=0``), or trained ``epochs``
    epochs on the built-in data and run on its first ``N`` test samples (its real activity)."""
    from spikingjelly.activation_based import functional

    ex = _nmnist_common.example()
    config = QuantConfig(weight_bits=weight_bits, v_bits=8)
    if epochs:
        bench = _nmnist_common.Bench(epochs, T=T)
        q, acc = bench.train(config, seed=0)
        print(f"trained {epochs} epochs on the built-in data: test accuracy {100 * acc:.2f}%")
        _, loader = ex.make_loaders(bench.train_set, bench.test_set, bench.args, 0, 1, 0)
        frames = torch.cat([f for f, _ in loader], dim=0)[:N]
        x = frames.transpose(0, 1).round().to(torch.int64)
    else:
        torch.manual_seed(0)
        q, _ = quantize_model(ex.build_csnn(channels=channels, tau=2.0), config)
        warm = (torch.rand(T, 8, 2, 34, 34) < density).float()
        with torch.no_grad():     # initialise the quantizers and BN statistics on event-like input
            for m in q.modules():
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                    m.momentum = None
            functional.reset_net(q)
            q(warm)
        g = torch.Generator().manual_seed(1)
        x = (torch.rand((T, N, 2, 34, 34), generator=g) < density).long()
    q.eval()
    functional.reset_net(q)
    folded = fold_batchnorm(q)
    return to_integer(folded), folded, x


def synaptic_ops(desc, x) -> float:
    """Synaptic operations per sample and step: for every synaptic layer, the (nonzero input,
    output it reaches) pairs, counted exactly on the spikes IntegerSNN computes."""
    import torch.nn.functional as F
    from snnquant.export import NeuronOp, SynapseOp

    T, N = x.shape[:2]
    sim = IntegerSNN(desc)
    _, layers = sim(x, record=True)
    total, feed = 0.0, x.reshape((T * N,) + tuple(x.shape[2:]))
    for op, prm in zip(desc.ops, sim._params):
        if isinstance(op, NeuronOp):
            feed = layers[op.name].reshape(feed.shape)
            continue
        if isinstance(op, SynapseOp):
            mask = (feed != 0).double()
            if op.kind == "linear":
                total += float(mask.sum()) * op.out_channels
            else:
                ones = torch.ones((op.out_channels,) + tuple(op.weight.shape[1:]),
                                  dtype=torch.float64)
                conv = F.conv1d if op.kind == "conv1d" else F.conv2d
                total += float(conv(mask, ones, None, op.stride, op.padding, op.dilation,
                                    op.groups).sum())
        feed = sim._stateless(op, prm, feed)
    return total / (T * N)


def compile_c(cc, desc, folder: Path, form: str, shape=(2, 34, 34)):
    """Write the C model of ``desc`` (synapse form ``form``) and the timing driver into
    ``folder``, compile them as the benchmark does (``-std=c99 -O2``, strict warnings); return
    the program's path and the compile command (file names only)."""
    _, source = to_c(desc, folder, "snn", input_shape=shape, synapses=form)
    (folder / "driver.c").write_text(DRIVER)
    cmd = [cc, "-std=c99", "-O2", "-Wall", "-Wextra", "-pedantic", str(source),
           str(folder / "driver.c"), "-o", str(folder / "driver")]
    subprocess.run(cmd, check=True)
    return folder / "driver", " ".join(Path(c).name if i > 0 and "/" in c else c
                                       for i, c in enumerate(cmd))


def _input_file(path: Path, x) -> None:
    """The driver's input file of ``x`` ``[T, N, ...]``: T, N, then the samples."""
    T, N = x.shape[:2]
    data = x.to(torch.int32).transpose(0, 1).contiguous().numpy()
    path.write_bytes(np.array([T, N], np.int32).tobytes() + data.tobytes())


#: the target of issue 46: the C model at most this fraction of the float model's time
TARGET_VS_FLOAT = 0.3
FORMS = {"events": "C model, event-driven", "dense": "C model, dense",
         "idle": "C model, event-driven, no input event"}


def instruction_profile(cc, desc, folder: Path, inputs: dict, steps: int) -> dict:
    """Instructions per time step of the event-driven C model of ``desc``, per C function, counted
    by valgrind's callgrind (deterministic, whatever the load): the model compiled at ``-O2``
    with each layer's function kept apart (GCC's ``noinline`` on each, helpers still inlined) and
    run on each of ``inputs`` (``{label: input file}``); ``steps`` time steps in a file.
    ``{label: {function: instructions per step}}`` (the functions: ``<layer>`` for a synaptic
    layer's events and the spikes it emits, ``<layer> neurons`` for a neuron layer's step fed by
    it, ``<layer> pooling``, ``other``), or ``{}`` without valgrind."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        return {}
    import re

    _, source = to_c(desc, folder, "snn", input_shape=(2, 34, 34), synapses="events")
    (folder / "driver.c").write_text(DRIVER)
    text = re.sub(r"^static void (snn_(?:op|fire)\d+)", r"__attribute__((noinline)) static void \1",
                  source.read_text(), flags=re.M)
    source.write_text(text)
    subprocess.run([cc, "-std=c99", "-O2", str(source), str(folder / "driver.c"), "-o",
                    str(folder / "driver")], check=True)
    names = {}
    for i, op in enumerate(desc.ops):
        kind = type(op).__name__.replace("Op", "").lower()
        names[f"snn_op{i}"] = f"{op.name} ({kind}{'' if kind != 'synapse' else ' ' + op.kind}"
        names[f"snn_op{i}"] += ", events and spikes out)" if kind == "synapse" else ")"
        names[f"snn_fire{i}"] = f"{op.name} (neuron step)"
    out = {}
    for label, path in inputs.items():
        cg = folder / f"callgrind.{label}"
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={cg}",
                        str(folder / "driver"), str(path), str(folder / "p.bin")],
                       check=True, capture_output=True)
        text = subprocess.run(["callgrind_annotate", "--threshold=100", str(cg)],
                              capture_output=True, text=True, check=True).stdout
        parts = {}
        body = text.split("file:function", 1)[-1]
        for count, where in re.findall(r"^\s*([\d,]+) \([^)]*\)\s+(\S+)", body, re.M):
            func = where.rsplit(":", 1)[-1].split(".")[0]
            key = names.get(func, "other (step, reset, memset, driver)")
            parts[key] = parts.get(key, 0) + int(count.replace(",", "")) / steps
        out[label] = parts
    return out


def dense_macs(desc, shape=(2, 34, 34)) -> int:
    """Multiply-accumulates of one time step of the dense form: every weight of a synaptic layer
    times the output positions it is applied at."""
    from snnquant.export import SynapseOp
    from snnquant.export.backends.simulator import op_shapes

    total = 0
    for op, (_, out_shape) in zip(desc.ops, op_shapes(desc, shape)):
        if isinstance(op, SynapseOp):
            total += op.weight.numel() * (int(np.prod(out_shape)) // op.out_channels)
    return total


def compare_widths(args):
    """The C models (event-driven and dense) of the example's CSNN at each of
    ``args.weight_bits`` against its fake-quantized float model (batch of N, one thread), all
    cases of all widths alternated in every repeat; each ratio is taken within a repeat (the C
    model's time over the float model's of the same width and repeat), then its median and
    range over the repeats. Also per width: the event-driven model on an input without any
    event ("no input event": every neuron's step, the pooling and the scans of the spike
    buffers, which do not depend on the activity; its biases still make the later layers
    spike), the synaptic operations per sample and the time per synaptic operation above the
    no-input run. Writes ``bench_c_runtime_bits.json`` and ``.md``."""
    from spikingjelly.activation_based import functional

    nets, runs, cmd = {}, {}, None
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for bits in args.weight_bits:
            desc, folded, x = example_network(args.channels, args.epochs, args.T, args.N,
                                              args.density, bits)
            n = x.shape[1]
            folder = tmp / f"w{bits}"
            folder.mkdir()
            _input_file(folder / "in.bin", x)
            _input_file(folder / "zero.bin", torch.zeros_like(x))
            exes = {}
            for form in ("events", "dense"):
                exes[form], cmd = compile_c(args.cc, desc, folder / form, form)
            nets[bits] = dict(desc=desc, x=x, n=n, folder=folder, exes=exes,
                              synops=synaptic_ops(desc, x) * args.T,
                              macs=dense_macs(desc) * args.T,
                              mem=c_memory(desc, (2, 34, 34), synapses="events"))

            def run_c(exe, inp, out, n=n):
                def run():
                    res = subprocess.run([str(exe), str(inp), str(out)], capture_output=True,
                                         text=True, check=True)
                    return float(res.stdout.strip()) * 1e-9 / n
                return run

            def run_float(folded=folded, xf=x.float(), n=n):
                t0 = time.perf_counter()
                with torch.no_grad():
                    functional.reset_net(folded)
                    folded(xf)
                return (time.perf_counter() - t0) / n
            runs[(bits, "float")] = run_float
            runs[(bits, "events")] = run_c(exes["events"], folder / "in.bin", folder / "events.bin")
            runs[(bits, "dense")] = run_c(exes["dense"], folder / "in.bin", folder / "dense.bin")
            runs[(bits, "idle")] = run_c(exes["events"], folder / "zero.bin", folder / "idle.bin")
        for fn in runs.values():      # warm-up
            fn()
        times = {k: [] for k in runs}
        keys = list(runs)
        for r in range(args.repeats):
            for k in keys[r % len(keys):] + keys[:r % len(keys)]:   # a different first case
                times[k].append(runs[k]())
        profiles = {}
        if not args.no_profile:
            for bits, net in nets.items():
                (net["folder"] / "profile").mkdir()
                profiles[bits] = instruction_profile(
                    args.cc, net["desc"], net["folder"] / "profile",
                    {"input": net["folder"] / "in.bin", "none": net["folder"] / "zero.bin"},
                    args.T * net["n"])
        agreement = {}
        for bits, net in nets.items():
            ref = IntegerSNN(net["desc"])(net["x"]).to(torch.int64).reshape(
                args.T, net["n"], -1).transpose(0, 1).numpy()
            for form in ("events", "dense"):
                got = np.frombuffer((net["folder"] / f"{form}.bin").read_bytes(),
                                    np.int64).reshape(net["n"], args.T, -1)
                agreement[f"W{bits} {form}"] = float((got == ref).all(axis=(1, 2)).mean())
    rows, targets = [], {}
    for bits, net in nets.items():
        fl = times[(bits, "float")]
        for form in ("float", "events", "dense", "idle"):
            t = times[(bits, form)]
            ratio = [a / b for a, b in zip(t, fl)]
            rows.append(dict(weight_bits=bits, case=form, ms_per_sample=spread([v * 1e3 for v in t]),
                             relative_to_float=spread(ratio)))
            if form in ("events", "dense"):
                med = spread(ratio)[0]
                targets[f"W{bits} {FORMS[form]} / float"] = dict(
                    value=med, target=TARGET_VS_FLOAT, pass_=med <= TARGET_VS_FLOAT)
        above = spread([a - b for a, b in zip(times[(bits, "events")], times[(bits, "idle")])])[0]
        net["ns_per_synop_above_idle"] = above * 1e9 / net["synops"] if net["synops"] else None
    names = {"float": FLOAT, **{k: f"{v} (gcc -O2, 1 thread)" for k, v in FORMS.items()}}

    def cell(s, f):
        return f"{f.format(s[0])} ({f.format(s[1])}..{f.format(s[2])})"
    lines = ["| weight bits | case | ms per sample, median (min..max) | / float model, median "
             "(min..max) |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['weight_bits']} | {names[r['case']]} | {cell(r['ms_per_sample'], '{:.3f}')} "
                     f"| {cell(r['relative_to_float'], '{:.2f}')} |")
    lines += ["", "| target | median | target | pass |", "|---|---|---|---|"]
    for name, t in targets.items():
        lines.append(f"| {name} | {t['value']:.2f} | <= {t['target']} | {t['pass_']} |")
    lines.append("")
    for bits, net in nets.items():
        idle = spread([a / b for a, b in zip(times[(bits, "idle")], times[(bits, "float")])])[0]
        ev = spread([a / b for a, b in zip(times[(bits, "events")], times[(bits, "float")])])[0]
        ns = net["ns_per_synop_above_idle"]
        lines.append(
            f"W{bits}: {net['synops']:,.0f} synaptic operations per sample (T={args.T}); the "
            f"event-driven C model takes {ev:.2f} of the float model's time, of which {idle:.2f} "
            f"with no input event (every neuron's step, the pooling, the scans: independent of "
            f"the activity) and {ev - idle:.2f} above it ("
            + ("n/a" if ns is None else f"{ns:.2f} ns") + " per synaptic operation); ROM "
            f"{net['mem'].rom_bytes:,} B, RAM {net['mem'].ram_bytes:,} B. The dense form "
            f"computes every one of {net['macs']:,} multiply-accumulates per sample: "
            f"{net['macs'] / spread(times[(bits, 'dense')])[0] * 1e-9:.1f} GMAC/s, where "
            f"{TARGET_VS_FLOAT} times the float model's time needs "
            f"{net['macs'] / (TARGET_VS_FLOAT * spread(times[(bits, 'float')])[0]) * 1e-9:.1f} "
            f"GMAC/s (the float model, batched convolutions and every elementwise step, runs "
            f"{net['macs'] / spread(times[(bits, 'float')])[0] * 1e-9:.1f} GMAC/s). Agreement with "
            f"IntegerSNN: event-driven {100 * agreement[f'W{bits} events']:.2f}%, dense "
            f"{100 * agreement[f'W{bits} dense']:.2f}% of {net['n']} samples.")
        lines.append("")
    if any(profiles.values()):
        lines += ["Instructions per time step of the event-driven C model, per layer function "
                  "(valgrind's callgrind: deterministic, whatever the load; the input above, and "
                  "the input without any event):", "",
                  "| weight bits | function | instructions per step | no input event |",
                  "|---|---|---|---|"]
        for bits, prof in profiles.items():
            if not prof:
                continue
            for part in sorted(prof["input"], key=lambda k: -prof["input"][k]):
                lines.append(f"| {bits} | {part} | {prof['input'][part]:,.0f} | "
                             f"{prof['none'].get(part, 0):,.0f} |")
            lines.append(f"| {bits} | total | {sum(prof['input'].values()):,.0f} | "
                         f"{sum(prof['none'].values()):,.0f} |")
        lines.append("")
        for bits, prof in profiles.items():
            if not prof:
                continue
            total = sum(prof["input"].values())
            share = {kind: sum(v for k, v in prof["input"].items() if kind in k) / total
                     for kind in ("neuron step", "synapse", "pool")}
            lines.append(
                f"W{bits}: of the event-driven model's instructions, {100 * share['neuron step']:.0f}% "
                f"update every neuron of every layer on every step (the leak and the biases reach "
                f"them all), {100 * share['pool']:.0f}% pool, {100 * share['synapse']:.0f}% add the "
                f"events' weights and emit the spikes; with no input event the step still takes "
                f"{100 * sum(prof['none'].values()) / total:.0f}% of these instructions.")
        lines.append("")
    command = " ".join([sys.executable] + sys.argv)
    cpu = cpu_name()
    lines.append(f"{args.repeats} repeats, every case of every width alternated in each (a different "
                 f"one first each time); each ratio within a repeat. {cpu}, "
                 f"{compiler_version(args.cc)}, `{cmd}`.")
    lines += ["", f"`{command}`"]
    markdown = "\n".join(lines) + "\n"
    print(markdown)
    result = dict(
        benchmark="bench_c_runtime widths", command=command,
        params=dict(T=args.T, N=args.N, channels=args.channels, repeats=args.repeats,
                    weight_bits=list(args.weight_bits),
                    density=None if args.epochs else args.density, epochs=args.epochs,
                    quick=args.quick),
        machine=dict(platform=platform.platform(), cpu=cpu, cores=os.cpu_count(),
                     python=platform.python_version(), torch=torch.__version__,
                     snnquant=snnquant.__version__, compiler=compiler_version(args.cc),
                     compile_command=cmd),
        results=[dict(r, case=names[r["case"]]) for r in rows],
        targets={k: dict(value=t["value"], target=t["target"], **{"pass": t["pass_"]})
                 for k, t in targets.items()},
        per_width={str(b): dict(synaptic_ops_per_sample=net["synops"],
                                dense_macs_per_sample=net["macs"],
                                ns_per_synaptic_op_above_no_input=net["ns_per_synop_above_idle"],
                                rom_bytes=net["mem"].rom_bytes, ram_bytes=net["mem"].ram_bytes)
                   for b, net in nets.items()},
        instructions_per_step={str(b): p for b, p in profiles.items()},
        agreement=agreement, times_s={f"W{b} {names[f]}": v for (b, f), v in times.items()})
    stem = "bench_c_runtime_bits" + ("_quick" if args.quick else "")
    write_files(args.out, {f"{stem}.json": json.dumps(result, indent=2) + "\n",
                           f"{stem}.md": markdown})
    return result


def compiler_version(cc):
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-T", type=int, default=8, help="time steps per sample (example default 8)")
    ap.add_argument("-N", type=int, default=64, help="samples")
    ap.add_argument("--channels", type=int, default=16, help="channels of the example CSNN")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--density", type=float, default=0.05, help="fraction of pixels with an event")
    ap.add_argument("--epochs", type=int, default=0,
                    help="train the example this many epochs on the built-in data and time it on "
                         "test samples (its real activity); 0: untrained, random events")
    ap.add_argument("--weight-bits", type=int, nargs="+", default=[4], choices=FOOTPRINT_BITS,
                    help="weight bits of the timed network (8-bit membranes); several (e.g. 8 4 "
                         "2): the C models of each width against the float model, interleaved "
                         "(bench_c_runtime_bits.json/.md)")
    ap.add_argument("--no-profile", action="store_true",
                    help="with several --weight-bits: leave out the instruction counts per layer "
                         "(valgrind's callgrind, about 10 s per width)")
    ap.add_argument("--footprint-only", action="store_true",
                    help="write the footprint table alone (no timing; deterministic)")
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"))
    ap.add_argument("--quick", action="store_true", help="smoke test: tiny sizes, 3 repeats")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    if args.quick:
        args.T, args.N, args.channels, args.repeats, args.epochs = 4, 4, 4, 3, 0
    if shutil.which(args.cc) is None:
        sys.exit(f"--cc={args.cc!r}: no such C compiler")
    torch.set_num_threads(1)
    if len(args.weight_bits) > 1:
        return compare_widths(args)
    rows = footprint(args.channels if not args.quick else 4)
    foot_md = footprint_markdown(rows)
    if args.footprint_only:
        print(foot_md)
        stem = "bench_c_runtime_footprint" + ("_quick" if args.quick else "")
        command = " ".join([sys.executable] + sys.argv)
        write_files(args.out, {f"{stem}.json": json.dumps(dict(
            benchmark="bench_c_runtime footprint", command=command, footprint=rows), indent=2)
            + "\n", f"{stem}.md": foot_md + f"\n`{command}`\n"})
        return rows
    args.weight_bits = args.weight_bits[0]
    desc, folded, x = example_network(args.channels, args.epochs, args.T, args.N, args.density,
                                      args.weight_bits)
    args.N = x.shape[1]
    shape = (2, 34, 34)
    mems = {form: c_memory(desc, shape, synapses=form) for form in ("events", "dense")}
    synops = synaptic_ops(desc, x)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = x.to(torch.int32).transpose(0, 1).contiguous().numpy()
        (tmp / "in.bin").write_bytes(np.array([args.T, args.N], np.int32).tobytes() + data.tobytes())
        exes = {}
        for form in ("events", "dense"):
            folder = tmp / form
            _, source = to_c(desc, folder, "snn", input_shape=shape, synapses=form)
            (folder / "driver.c").write_text(DRIVER)
            cmd = [args.cc, "-std=c99", "-O2", "-Wall", "-Wextra", "-pedantic", str(source),
                   str(folder / "driver.c"), "-o", str(folder / "driver")]
            subprocess.run(cmd, check=True)
            exes[form] = folder / "driver"
        sim = IntegerSNN(desc)  # the default: integer tensors only
        fast = IntegerSNN(desc, synapse_arithmetic="auto")  # float32 synapses where exact
        xf = x.float()
        outputs = {}

        def run_c(form):
            def run():
                res = subprocess.run([str(exes[form]), str(tmp / "in.bin"), str(tmp / f"{form}.bin")],
                                     capture_output=True, text=True, check=True)
                return float(res.stdout.strip()) * 1e-9
            return run

        def run_batch(s):
            def run():
                t0 = time.perf_counter()
                s(x)
                return time.perf_counter() - t0
            return run

        def run_single(s):
            def run():
                t0 = time.perf_counter()
                for n in range(args.N):
                    s(x[:, n:n + 1])
                return time.perf_counter() - t0
            return run

        def run_float():
            from spikingjelly.activation_based import functional
            t0 = time.perf_counter()
            with torch.no_grad():
                functional.reset_net(folded)
                folded(xf)
            return time.perf_counter() - t0

        cases = {C_EVENTS: run_c("events"), C_DENSE: run_c("dense"),
                 INT_AUTO: run_batch(fast), INT_AUTO_SINGLE: run_single(fast),
                 INT_DEFAULT: run_batch(sim), INT_DEFAULT_SINGLE: run_single(sim),
                 FLOAT: run_float}
        for fn in cases.values():      # warm-up
            fn()
        times = {k: [] for k in cases}
        for _ in range(args.repeats):
            for k, fn in cases.items():
                times[k].append(fn() / args.N)
        for form in exes:
            outputs[form] = np.frombuffer((tmp / f"{form}.bin").read_bytes(),
                                          np.int64).reshape(args.N, args.T, -1)
    ref = sim(x).to(torch.int64).reshape(args.T, args.N, -1).transpose(0, 1).numpy()
    agreement = {form: float((got == ref).all(axis=(1, 2)).mean()) for form, got in outputs.items()}
    got = fast(x).to(torch.int64).reshape(args.T, args.N, -1).transpose(0, 1).numpy()
    agreement["integer_snn_auto"] = float((got == ref).all(axis=(1, 2)).mean())

    stats = {k: spread(v) for k, v in times.items()}  # (median, min, max)
    med = {k: s[0] for k, s in stats.items()}
    rows_t = []
    for k, (median, low, high) in stats.items():
        rows_t.append(dict(case=k, median_ms_per_sample=median * 1e3, min_ms=low * 1e3,
                         max_ms=high * 1e3, relative_to_float=median / med[FLOAT]))
    head = f"{'case':<46} {'ms/sample':>10} {'min':>9} {'max':>9} {'x float':>8}"
    lines = [head, "-" * len(head)]
    for r in rows_t:
        lines.append(f"{r['case']:<46} {r['median_ms_per_sample']:>10.3f} {r['min_ms']:>9.3f} "
                     f"{r['max_ms']:>9.3f} {r['relative_to_float']:>8.2f}")
    ns_per_synop = med[C_EVENTS] * 1e9 / (synops * args.T) if synops else float("nan")
    ratios = dict(event_c_vs_float=med[C_EVENTS] / med[FLOAT],
                  dense_c_vs_event_c=med[C_DENSE] / med[C_EVENTS],
                  integer_snn_batch_vs_float=med[INT_AUTO] / med[FLOAT],
                  integer_snn_default_batch_vs_float=med[INT_DEFAULT] / med[FLOAT])
    lines.append(f"synaptic operations per sample: {synops * args.T:.0f} (T={args.T}); event-driven "
                 f"C: {ns_per_synop:.2f} ns per synaptic operation")
    lines.append(f"targets: event-driven C / float {ratios['event_c_vs_float']:.2f} (<= 0.5), dense "
                 f"C / event-driven C {ratios['dense_c_vs_event_c']:.1f} (>= 4), IntegerSNN batch "
                 f"('auto') / float {ratios['integer_snn_batch_vs_float']:.2f} (<= 1.5; the "
                 f"default 'integer': {ratios['integer_snn_default_batch_vs_float']:.2f})")
    lines.append(f"agreement with IntegerSNN: event-driven {100 * agreement['events']:.2f}%, dense "
                 f"{100 * agreement['dense']:.2f}%, IntegerSNN 'auto' with the default "
                 f"{100 * agreement['integer_snn_auto']:.2f}% of {args.N} samples; ROM "
                 f"{mems['events'].rom_bytes} B, RAM {mems['events'].ram_bytes} B event-driven "
                 f"({mems['events'].scratch_bytes} B scratch: sums and spike bytes, "
                 f"{mems['events'].list_bytes} B index lists), {mems['dense'].ram_bytes} B dense")
    table = "\n".join(lines)
    print(table)
    result = dict(
        benchmark="bench_c_runtime", command=" ".join([sys.executable] + sys.argv),
        params=dict(T=args.T, N=args.N, channels=args.channels, repeats=args.repeats,
                    weight_bits=args.weight_bits,
                    density=None if args.epochs else args.density, epochs=args.epochs,
                    quick=args.quick),
        machine=dict(platform=platform.platform(), cpu=cpu_name(), cores=os.cpu_count(),
                     python=platform.python_version(), torch=torch.__version__,
                     snnquant=snnquant.__version__, compiler=compiler_version(args.cc),
                     compile_command=" ".join(Path(c).name if i > 0 and "/" in c else c
                                              for i, c in enumerate(cmd))),
        rom_bytes=mems["events"].rom_bytes, ram_bytes=mems["events"].ram_bytes,
        ram_bytes_dense=mems["dense"].ram_bytes, scratch_bytes=mems["events"].scratch_bytes,
        list_bytes=mems["events"].list_bytes, synaptic_ops_per_sample=synops * args.T,
        ns_per_synaptic_op=ns_per_synop, ratios=ratios, agreement=agreement, results=rows_t,
        footprint=rows)
    stem = "bench_c_runtime_quick" if args.quick else "bench_c_runtime"
    markdown = ("```\n" + table + "\n```\n\n" + f"`{result['command']}`\n\n"
                + f"Timed at {args.weight_bits}-bit weights. C model footprint (deterministic):\n\n"
                + foot_md)
    write_files(args.out, {f"{stem}.json": json.dumps(result, indent=2) + "\n",
                           f"{stem}.md": markdown})
    return result


if __name__ == "__main__":
    main()
