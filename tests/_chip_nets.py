"""The chip networks that the chip tests build, written once: random networks of each chip's
layers (mixed-sign random integer weights and biases, parameters drawn from one generator in a
fixed order, so a seed names one network) and the small float SpikingJelly networks that the
chip conversions start from."""
import numpy as np
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

from snnquant.targets import LoihiLIFLayer, SpeckIAFLayer, XyloLIFLayer


def _random_weights(m, rng, bias_range=None):
    """Random 8-bit integer weights for layer ``m`` and, with ``bias_range`` ``(lo, hi)``,
    random integer biases in ``[lo, hi)``."""
    with torch.no_grad():
        m.weight.copy_(torch.from_numpy(rng.integers(-128, 128, m.weight.shape)).float())
        if bias_range is not None:
            m.bias.copy_(torch.from_numpy(rng.integers(*bias_range, m.out_features)).float())
    return m


def xylo_network(rng, saturate: bool, bias: bool):
    """1 to 3 hidden Xylo layers and a readout, random decays, thresholds and weight shifts;
    with ``saturate`` thresholds and shifts large enough to reach the 16-bit bounds."""
    n_in = int(rng.integers(1, 17))
    dims = [n_in] + [int(rng.integers(1, 40)) for _ in range(int(rng.integers(1, 4)))] \
        + [int(rng.integers(1, 9))]
    shift_rec = int(rng.integers(0, 8)) if saturate else 0
    layers, previous = [], None
    for i in range(len(dims) - 1):
        last = i == len(dims) - 2
        shift = (int(rng.integers(0, 8)) if saturate else 0) if i in (0, len(dims) - 2) \
            else shift_rec
        m = XyloLIFLayer(dims[i], dims[i + 1],
                         threshold=int(rng.integers(1, 30000 if saturate else 3000)),
                         dash_syn=int(rng.integers(0, 16)), dash_mem=int(rng.integers(0, 16)),
                         weight_step=1.0, weight_shift=shift, max_spikes=1 if last else 31,
                         delay=0 if i == 0 else 1, bias=bias,
                         input_max=15 if previous is None else previous.max_spikes,
                         step_mode="m")
        layers.append(_random_weights(m, rng, (-20000, 20000) if bias else None))
        previous = m
    return nn.Sequential(*layers)


def loihi_network(rng, saturate: bool, bias: bool):
    """1 to 3 Loihi layers, random thresholds, decays and weight exponents; with ``saturate``
    exponents large enough to wrap the 24-bit current."""
    dims = [int(rng.integers(1, 30))] + [int(rng.integers(1, 30))
                                         for _ in range(int(rng.integers(1, 4)))]
    layers = []
    for i in range(len(dims) - 1):
        m = LoihiLIFLayer(dims[i], dims[i + 1],
                          vth=int(rng.integers(0, 20000 if saturate else 300)),
                          du=int(rng.integers(0, 4096)), dv=int(rng.integers(0, 4096)),
                          weight_step=1.0,
                          weight_exp=int(rng.integers(3, 8) if saturate else rng.integers(-3, 3)),
                          bias=bias, step_mode="m")
        layers.append(_random_weights(m, rng, (-4096, 4096) if bias else None))
    return nn.Sequential(*layers)


def speck_network(rng, bias: bool, spike: str):
    """1 or 2 Speck convolutions (strides, padding, sum pooling) and 1 or 2 linear layers,
    random thresholds, spiking by ``spike`` (``'multi'`` or ``'single'``)."""
    c, h = int(rng.integers(1, 4)), int(rng.choice([8, 12]))
    shape, layers = (c, h, h), []
    for i in range(int(rng.integers(1, 3))):  # convolutions
        k = int(rng.choice([1, 3]))
        stride = int(rng.choice([1, 2])) if shape[1] % 2 == 0 else 1
        pad = k // 2
        out_h = (shape[1] + 2 * pad - k) // stride + 1
        pool = 2 if out_h % 2 == 0 and out_h > 2 else 1
        layers.append(SpeckIAFLayer(shape, int(rng.integers(2, 7)), k,
                                    threshold=int(rng.integers(20, 400)), stride=stride,
                                    padding=pad, pool=pool, bias=bias, weight_step=1.0,
                                    spike=spike, input_max=2 ** 15 if i else 6, step_mode="m"))
        shape = layers[-1].out_shape
    for _ in range(int(rng.integers(1, 3))):  # linear layers
        layers.append(SpeckIAFLayer(shape, int(rng.integers(2, 9)), None,
                                    threshold=int(rng.integers(20, 400)), bias=bias,
                                    weight_step=1.0, spike=spike, input_max=2 ** 15,
                                    step_mode="m"))
        shape = layers[-1].out_shape
    for m in layers:
        _random_weights(m, rng, (-128, 128) if bias else None)
    return nn.Sequential(*layers)


def layer_outputs(net, x):
    """What every layer of the chip network ``net`` sends for the input ``x`` ``[T, N, ...]``:
    one int64 array ``[N, T, ...]`` per layer, from a fresh state."""
    sjf.reset_net(net)
    outs, h = [], x
    with torch.no_grad():
        for m in net:
            h = m(h)
            outs.append(h.transpose(0, 1).numpy().astype(np.int64))
    return outs


def dense_float_net(n_in: int, v_reset, widths=(24, 12, 4)):
    """``Flatten``, then ``Linear`` layers of ``widths`` outputs from ``n_in`` inputs, each
    followed by a neuron: LIF (tau 2), IF, LIF (tau 4), with ``v_reset``; weights from seed 0."""
    torch.manual_seed(0)
    neurons = (lambda: neuron.LIFNode(tau=2.0, v_reset=v_reset, step_mode="m"),
               lambda: neuron.IFNode(v_reset=v_reset, step_mode="m"),
               lambda: neuron.LIFNode(tau=4.0, v_reset=v_reset, step_mode="m"))
    modules, n = [layer.Flatten(step_mode="m")], n_in
    for width, make in zip(widths, neurons):
        modules += [layer.Linear(n, width, step_mode="m"), make()]
        n = width
    return nn.Sequential(*modules)


def speck_float_net():
    """Two convolutions (the second strided, without bias), sum pooling and a linear readout on
    ``(2, 8, 8)`` inputs, IF neurons without reset to a value; weights from seed 0."""
    torch.manual_seed(0)
    return nn.Sequential(layer.Conv2d(2, 4, 3, padding=1, step_mode="m"),
                         neuron.IFNode(v_reset=None, step_mode="m"),
                         layer.AvgPool2d(2, step_mode="m"),
                         layer.Conv2d(4, 6, 3, stride=2, padding=1, bias=False, step_mode="m"),
                         neuron.IFNode(v_reset=None, step_mode="m"),
                         layer.Flatten(step_mode="m"),
                         layer.Linear(6 * 2 * 2, 4, step_mode="m"),
                         neuron.IFNode(v_reset=None, step_mode="m"))
