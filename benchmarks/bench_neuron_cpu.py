"""CPU benchmark: quantized LIF neuron vs SpikingJelly's LIFNode, and one CSNN training step.

Prints a table and writes benchmarks/results/bench_neuron_cpu.json (and .md).

Measured side by side in one process, alternating the cases, median of several runs:
  (1) forward+backward of QuantLIFNode(v_quant=8) vs LIFNode, step_mode='m', T=16, N=64, 4096
      features (target ratio <= 1.25), plus bytes saved for backward (autograd's saved tensors,
      counted with saved_tensors_hooks) and the peak RSS above steady state of a second call in a fresh subprocess (Linux VmHWM);
  (2) one training step (forward, backward, Adam) of the CSNN quantized with quantize_model
      (4-bit LSQ weights, 8-bit membrane) vs the same network unquantized (target <= 1.4).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron, surrogate

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import snnquant  # noqa: E402
from snnquant import QuantConfig, quantize_model  # noqa: E402
from snnquant.nn import QuantLIFNode  # noqa: E402


def make_neuron(kind):
    if kind == "sj":
        return neuron.LIFNode(tau=2.0, step_mode="m")
    return QuantLIFNode(tau=2.0, step_mode="m", v_quant=8)


def neuron_step(node, x):
    sjf.reset_net(node)
    y = node(x)
    y.sum().backward()


def saved_bytes(node, x):
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        sjf.reset_net(node)
        y = node(x)
    y.sum().backward()
    return total[0]


def csnn(channels=32):
    net = nn.Sequential(
        layer.Conv2d(2, channels, 3, padding=1, bias=False), layer.BatchNorm2d(channels),
        neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan(), detach_reset=True),
        layer.MaxPool2d(2),
        layer.Conv2d(channels, channels, 3, padding=1, bias=False), layer.BatchNorm2d(channels),
        neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan(), detach_reset=True),
        layer.MaxPool2d(2), layer.Flatten(),
        layer.Linear(channels * 8 * 8, 10), neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan()),
    )
    sjf.set_step_mode(net, "m")
    return net


def train_step(net, opt, x, y):
    sjf.reset_net(net)
    loss = nn.functional.cross_entropy(net(x).mean(0), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def timeit(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def child_peak_rss(kind, T, N, F):
    # Linux: writing 5 to /proc/self/clear_refs resets the peak-RSS mark (VmHWM), so the peak of
    # the measured call is not hidden by the peak reached while importing torch.
    code = (
        "import torch, sys; sys.path.insert(0, %r);"
        "from benchmarks.bench_neuron_cpu import make_neuron, neuron_step;"
        "kb = lambda key: int([l for l in open('/proc/self/status') if l.startswith(key)][0].split()[1]);"
        "x = torch.rand(%d, %d, %d) * 2; x.requires_grad_(True);"
        "node = make_neuron(%r); neuron_step(node, x);"
        "open('/proc/self/clear_refs', 'w').write('5'); base = kb('VmRSS');"
        "neuron_step(node, x);"
        "print(kb('VmHWM') - base)"
    ) % (os.path.dirname(HERE), T, N, F, kind)
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        return int(out.stdout.strip().splitlines()[-1]) * 1024
    except (subprocess.CalledProcessError, OSError, ValueError, IndexError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-T", type=int, default=16)
    ap.add_argument("-N", type=int, default=64)
    ap.add_argument("-F", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--train-repeats", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    torch.manual_seed(0)
    T, N, F = args.T, args.N, args.F

    x = (torch.rand(T, N, F) * 2).requires_grad_(True)
    nodes = {"snnquant QuantLIFNode(v_quant=8)": make_neuron("q"), "spikingjelly LIFNode": make_neuron("sj")}
    for node in nodes.values():  # warm-up
        for _ in range(2):
            neuron_step(node, x)
    times = {k: [] for k in nodes}
    for _ in range(args.repeats):  # alternate the cases so that machine noise hits both
        for k, node in nodes.items():
            times[k] += timeit(lambda: neuron_step(node, x), 1)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    saved = {k: saved_bytes(node, x) for k, node in nodes.items()}
    rss = {"snnquant QuantLIFNode(v_quant=8)": child_peak_rss("q", T, N, F),
           "spikingjelly LIFNode": child_peak_rss("sj", T, N, F)}
    q_key, sj_key = list(nodes)
    neuron_ratio = med[q_key] / med[sj_key]

    base = csnn()
    quant, _ = quantize_model(base, QuantConfig(weight_bits=4, v_bits=8))
    xb = (torch.rand(T, 16, 2, 32, 32) > 0.8).float()
    yb = torch.randint(0, 10, (16,))
    nets = {"CSNN 4-bit weights, 8-bit membrane": quant, "CSNN unquantized": base}
    opts = {k: torch.optim.Adam(n.parameters(), 1e-3) for k, n in nets.items()}
    for k in nets:
        for _ in range(2):
            train_step(nets[k], opts[k], xb, yb)
    ttimes = {k: [] for k in nets}
    for _ in range(args.train_repeats):
        for k in nets:
            ttimes[k] += timeit(lambda: train_step(nets[k], opts[k], xb, yb), 1)
    tmed = {k: statistics.median(v) * 1e3 for k, v in ttimes.items()}
    qk, bk = list(nets)
    train_ratio = tmed[qk] / tmed[bk]

    result = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__, "snnquant": snnquant.__version__},
        "neuron": {"T": T, "N": N, "features": F, "repeats": args.repeats,
                   "median_ms": med, "saved_for_backward_bytes": saved, "child_peak_rss_bytes": rss,
                   "ratio_quant_over_sj": neuron_ratio, "target": 1.25},
        "train_step": {"T": T, "batch": 16, "input": [2, 32, 32], "median_ms": tmed,
                       "ratio_quant_over_fp": train_ratio, "target": 1.4},
    }
    lines = ["| case | median ms | saved for backward (MiB) | peak RSS above steady state, 2nd call (MiB) |",
             "|---|---|---|---|"]
    for k in nodes:
        peak = "n/a" if rss[k] is None else f"{rss[k] / 2**20:.1f}"
        lines.append(f"| {k} fwd+bwd | {med[k]:.1f} | {saved[k] / 2**20:.1f} | {peak} |")
    lines.append(f"| ratio QuantLIFNode / LIFNode | {neuron_ratio:.2f} (target <= 1.25) | | |")
    for k in nets:
        lines.append(f"| {k} train step | {tmed[k]:.1f} | | |")
    lines.append(f"| ratio quantized / unquantized CSNN step | {train_ratio:.2f} (target <= 1.4) | | |")
    table = "\n".join(lines)
    print(f"T={T}, N={N}, features={F}, torch threads={torch.get_num_threads()}")
    print(table)
    os.makedirs(args.out, exist_ok=True)
    for name, text in (("bench_neuron_cpu.json", json.dumps(result, indent=2)),
                       ("bench_neuron_cpu.md", table + "\n")):
        tmp = os.path.join(args.out, name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(args.out, name))


if __name__ == "__main__":
    main()
