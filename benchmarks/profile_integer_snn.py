"""Where ``IntegerSNN`` spends its time: ``torch.profiler`` over three batch calls on the N-MNIST
example's CSNN (W4/V8, trained 1 epoch on the built-in data, T=8, 64 test samples, one thread).

    OMP_NUM_THREADS=1 python benchmarks/profile_integer_snn.py

Prints the operators by self CPU time. Seen 2026-11-26 with integer synapses:
``aten::_slow_conv2d_forward``, PyTorch's integer convolution, about half of the total; with the
float32 synapses (``synapse_arithmetic='auto'``) and compiled neuron loops:
``aten::mkldnn_convolution`` about 67%, max pooling about 18%, type conversions (``aten::copy_``,
mostly the input to float32 and the small read-out layer's torch step) about 12%. The compiled
neuron loops run outside torch (through ctypes) and are not in the table.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_c_runtime  # noqa: E402


def main():
    from torch.profiler import ProfilerActivity, profile

    from snnquant.export import IntegerSNN

    torch.set_num_threads(1)
    desc, _, x = bench_c_runtime.example_network(16, epochs=1)
    sim = IntegerSNN(desc)
    sim(x)  # warm-up: the per-call plans
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            sim(x)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))


if __name__ == "__main__":
    main()
