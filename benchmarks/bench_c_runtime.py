"""Time per sample of the C model (``snnquant.export.to_c``, gcc -O2, one core) vs ``IntegerSNN``.

The network is the N-MNIST example's CSNN (``examples/train_nmnist.py``: conv-BN-LIF with stride 2,
conv-BN-LIF, max pooling, linear LIF read-out; 4-bit weights, 8-bit membrane, 34 x 34 input),
folded and exported with ``to_integer``; or a trained one with ``--integer runs/nmnist/model_int.safetensors``.
Neither runtime skips work on zeros, so the timing of an untrained network is representative.

Cases, alternated in every repeat (median of ``--repeats`` runs, with min and max):
  * C model: the compiled ``<name>_step`` over all samples and steps (``-O2``, single thread);
  * IntegerSNN, batch: one call on all samples (``torch.set_num_threads(1)``);
  * IntegerSNN, one sample per call (the way the C model is used on a device).
The C outputs are also compared with IntegerSNN's (agreement over all samples).

Prints a table and writes ``benchmarks/results/bench_c_runtime.json`` (and ``.md``).

    python benchmarks/bench_c_runtime.py               # the real numbers (quiet machine)
    python benchmarks/bench_c_runtime.py --quick       # smoke test
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import _nmnist_common  # noqa: E402  (the example module, loaded in one place)
from _machine import cpu_name  # noqa: E402
import snnquant  # noqa: E402
from snnquant import QuantConfig, quantize_model  # noqa: E402
from snnquant.export import IntegerSNN, c_memory, fold_batchnorm, load_integer, to_c, to_integer  # noqa: E402

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


def example_network(channels: int):
    mod = _nmnist_common.example()
    from spikingjelly.activation_based import functional

    torch.manual_seed(0)
    net = mod.build_csnn(channels=channels, tau=2.0)
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    x = (torch.rand(8, 8, 2, 34, 34) < 0.05).float()
    with torch.no_grad():     # initialise the quantizers and BN statistics on event-like input
        for m in q.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.momentum = None
        functional.reset_net(q)
        q(x)
    q.eval()
    functional.reset_net(q)
    return to_integer(fold_batchnorm(q))


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
    ap.add_argument("--integer", default=None, help="a saved integer network (model_int.safetensors) "
                                                  "of the example instead of an untrained one")
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"))
    ap.add_argument("--quick", action="store_true", help="smoke test: tiny sizes, 3 repeats")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    if args.quick:
        args.T, args.N, args.channels, args.repeats = 4, 4, 4, 3
    if shutil.which(args.cc) is None:
        sys.exit(f"--cc={args.cc!r}: no such C compiler")
    torch.set_num_threads(1)
    desc = load_integer(args.integer) if args.integer else example_network(args.channels)
    shape = (2, 34, 34)
    g = torch.Generator().manual_seed(1)
    x = (torch.rand((args.T, args.N) + shape, generator=g) < args.density).long()
    mem = c_memory(desc, shape)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        _, source = to_c(desc, tmp, "snn", input_shape=shape)
        (tmp / "driver.c").write_text(DRIVER)
        exe = tmp / "driver"
        cmd = [args.cc, "-std=c99", "-O2", "-Wall", "-Wextra", "-pedantic", str(source),
               str(tmp / "driver.c"), "-o", str(exe)]
        subprocess.run(cmd, check=True)
        data = x.to(torch.int32).transpose(0, 1).contiguous().numpy()
        (tmp / "in.bin").write_bytes(np.array([args.T, args.N], np.int32).tobytes() + data.tobytes())
        sim = IntegerSNN(desc)

        def run_c():
            res = subprocess.run([str(exe), str(tmp / "in.bin"), str(tmp / "out.bin")],
                                 capture_output=True, text=True, check=True)
            return float(res.stdout.strip()) * 1e-9

        def run_batch():
            t0 = time.perf_counter()
            sim(x)
            return time.perf_counter() - t0

        def run_single():
            t0 = time.perf_counter()
            for n in range(args.N):
                sim(x[:, n:n + 1])
            return time.perf_counter() - t0

        cases = {"C model (gcc -O2, 1 thread)": run_c,
                 "IntegerSNN, batch of N (1 thread)": run_batch,
                 "IntegerSNN, one sample per call (1 thread)": run_single}
        for fn in cases.values():      # warm-up
            fn()
        times = {k: [] for k in cases}
        for _ in range(args.repeats):
            for k, fn in cases.items():
                times[k].append(fn() / args.N)
        got = np.frombuffer((tmp / "out.bin").read_bytes(), np.int64).reshape(args.N, args.T, -1)
    ref = sim(x).to(torch.int64).reshape(args.T, args.N, -1).transpose(0, 1).numpy()
    agreement = float((got == ref).all(axis=(1, 2)).mean())

    c_med = statistics.median(times["C model (gcc -O2, 1 thread)"])
    rows = []
    for k, v in times.items():
        med = statistics.median(v)
        rows.append(dict(case=k, median_ms_per_sample=med * 1e3, min_ms=min(v) * 1e3,
                         max_ms=max(v) * 1e3, relative_to_c=med / c_med))
    head = f"{'case':<44} {'ms/sample':>10} {'min':>9} {'max':>9} {'x C':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['case']:<44} {r['median_ms_per_sample']:>10.3f} {r['min_ms']:>9.3f} "
                     f"{r['max_ms']:>9.3f} {r['relative_to_c']:>7.1f}")
    lines.append(f"agreement C vs IntegerSNN: {100 * agreement:.2f}% of {args.N} samples "
                 f"(T={args.T}); ROM {mem.rom_bytes} B, RAM {mem.ram_bytes} B")
    table = "\n".join(lines)
    print(table)
    result = dict(
        benchmark="bench_c_runtime", command=" ".join([sys.executable] + sys.argv),
        params=dict(T=args.T, N=args.N, channels=args.channels, repeats=args.repeats,
                    density=args.density, integer=args.integer, quick=args.quick),
        machine=dict(platform=platform.platform(), cpu=cpu_name(), cores=os.cpu_count(),
                     python=platform.python_version(), torch=torch.__version__,
                     snnquant=snnquant.__version__, compiler=compiler_version(args.cc),
                     compile_command=" ".join(Path(c).name if i > 0 and "/" in c else c
                                              for i, c in enumerate(cmd))),
        rom_bytes=mem.rom_bytes, ram_bytes=mem.ram_bytes, agreement=agreement, results=rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "bench_c_runtime_quick" if args.quick else "bench_c_runtime"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{stem}.md").write_text("```\n" + table + "\n```\n\n" + f"`{result['command']}`\n")
    return result


if __name__ == "__main__":
    main()
