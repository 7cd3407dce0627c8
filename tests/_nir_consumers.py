"""Shared by tests/test_nir_interop.py and benchmarks/nir_agreement.py: small exported networks and
one runner per NIR consumer (each consumer's own importer, run step by step on the same input)."""
import contextlib
import io
import logging

import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

from snnquant import QuantConfig, quantize_model
from snnquant.export import (NeuronOp, shift_flatten_dims, simulate_nir, to_integer,
                             widen_membrane_range)

ARCHS = ("dense", "mlp", "conv", "conv_pool")
CONSUMERS = ("spikingjelly", "snntorch", "norse")
# init='default': PyTorch's default initialisation (uniform in +-1/sqrt(fan_in), mixed sign) times
# this gain, without which LIF layers after the first never reach the threshold on events
DEFAULT_INIT_GAIN = {"if": 2.0, "lif": 4.0}
# the residual network's four LIF layers need more (its read-out is silent at 4)
RESIDUAL_LIF_GAIN = 2.0


class ResidualCSNN(nn.Module):
    """A small residual convolutional SNN (SpikingJelly's ``spiking_resnet`` block: the shortcut's
    spikes added to the second convolution's current before the neuron), then a linear head."""

    def __init__(self, nrn, channels=4, size=6, classes=5):
        super().__init__()
        self.conv0, self.sn0 = layer.Conv2d(2, channels, 3, padding=1), nrn()
        self.conv1, self.sn1 = layer.Conv2d(channels, channels, 3, padding=1), nrn()
        self.conv2, self.sn2 = layer.Conv2d(channels, channels, 3, padding=1), nrn()
        self.flat, self.fc, self.sn3 = layer.Flatten(), layer.Linear(channels * size * size,
                                                                     classes), nrn()

    def forward(self, x):
        s = self.sn0(self.conv0(x))
        out = self.sn2(self.conv2(self.sn1(self.conv1(s))) + s)
        return self.sn3(self.fc(self.flat(out)))


def build_network(arch, kind, weight_bits, seed, *, v_bits=12, v_reset=0.0, decay_input=True,
                  tau=2.0, init="excitatory", headroom_bits=0):
    """``(IntegerNetwork, per-sample input shape)`` of a small random network, via
    quantize_model -> to_integer. With ``init='excitatory'`` weights lean excitatory so that
    spikes are frequent and IF membranes stay above ``v_min`` on :func:`events` input; with
    ``'default'`` they keep PyTorch's default (mixed-sign) initialisation, scaled by
    :data:`DEFAULT_INIT_GAIN`. ``arch='residual'`` (not in :data:`ARCHS`) is
    :class:`ResidualCSNN`. ``headroom_bits`` > 0
    widens every membrane grid by that many bits at the same step (``widen_membrane_range``)."""
    if init not in ("excitatory", "default"):
        raise ValueError(f"init must be 'excitatory' or 'default', got {init!r}")
    torch.manual_seed(seed)
    if kind == "if":
        def nrn():
            return neuron.IFNode(v_reset=v_reset)
    else:
        def nrn():
            return neuron.LIFNode(tau=tau, decay_input=decay_input, v_reset=v_reset)
    if arch == "dense":
        mods, shape = [layer.Linear(16, 8), nrn()], (16,)
    elif arch == "mlp":
        mods, shape = [layer.Linear(16, 12), nrn(), layer.Linear(12, 6), nrn()], (16,)
    elif arch == "conv":
        mods = [layer.Conv2d(2, 4, 3, padding=1), nrn(), layer.Flatten(), layer.Linear(4 * 36, 5),
                nrn()]
        shape = (2, 6, 6)
    elif arch == "conv_pool":
        mods = [layer.Conv2d(2, 4, 3, padding=1), nrn(), layer.MaxPool2d(2), layer.Flatten(),
                layer.Linear(4 * 9, 5), nrn()]
        shape = (2, 6, 6)
    elif arch == "residual":
        mods, shape = None, (2, 6, 6)
    else:
        raise ValueError(f"arch must be one of {ARCHS + ('residual',)}, got {arch!r}")
    net = nn.Sequential(*mods) if mods else ResidualCSNN(nrn)
    gain, later = (0.5, 0.6) if kind == "if" else (1.0, 1.6)
    synapses = [x for x in net.modules() if isinstance(x, (nn.Linear, nn.Conv2d))]
    with torch.no_grad():
        for m in synapses if init == "default" else []:
            gain_default = DEFAULT_INIT_GAIN[kind] * (RESIDUAL_LIF_GAIN if arch == "residual"
                                                      and kind == "lif" else 1.0)
            m.weight.mul_(gain_default)  # keeps the sign mix, makes every layer spike
            m.bias.mul_(gain_default)
        for i, m in enumerate(synapses if init == "excitatory" else []):
            fan = m.weight[0].numel()
            m.weight.uniform_(-0.4, 1.0).mul_(gain * (1.0 if i == 0 else later) * 2.0 / fan ** 0.5)
            m.bias.uniform_(-0.1, 0.2)
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=weight_bits, weight_quantizer="lsq_pow2",
                                           v_bits=v_bits))
    if headroom_bits:
        q = widen_membrane_range(q, headroom_bits)
    return to_integer(q.eval()), shape


def events(shape, T=8, N=16, seed=0, max_count=1):
    """Integer event counts ``[T, N, *shape]`` in ``[0, max_count]``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, max_count + 1, (T, N) + tuple(shape), generator=g)


def saturation_free(graph, x):
    """``(ok, worst)``: whether NIR's unrounded membrane (:func:`simulate_nir`) never leaves a
    neuron's saturation bounds in a way that matters: it stays >= ``v_min``, and any value above
    ``v_max`` fires (and is reset) in the same step. ``worst`` names the first violation."""
    _, rec = simulate_nir(graph, x, record=True)
    for name, r in rec.items():
        meta = graph.nodes[name].metadata
        if meta.get("snnquant_op") != "neuron":
            continue
        u = float(meta["membrane_unit"])
        low = r["v"] < float(meta["v_min"]) * u
        high = (r["v"] > float(meta["v_max"]) * u) & (r["spikes"] == 0)
        if bool(low.any()) or bool(high.any()):
            return False, (f"{name}: membrane range [{float(r['v'].min()) / u:.1f}, "
                           f"{float(r['v'].max()) / u:.1f}] vs [{meta['v_min']}, {meta['v_max']}]")
    return True, ""


def nir_exact_layers(desc):
    """Whether every neuron layer is an IF whose currents lie on its membrane grid (grid_shift 0)."""
    return all(op.kind == "if" and op.grid_shift == 0 for op in desc.ops if isinstance(op, NeuronOp))


def run_spikingjelly(graph, x, dt, shift_flatten=False):
    from spikingjelly.activation_based.nir_exchange.from_nir import import_from_nir
    m = import_from_nir(graph, dt=dt, dtype=torch.float64)
    state, out = None, []
    for t in range(x.shape[0]):
        o, state = m(x[t].to(torch.float64), state)
        out.append(o)
    return torch.stack(out)


def run_snntorch(graph, x, dt, shift_flatten=False):
    """snnTorch takes no dt: its importer assumes dt = 1e-4 for LIF."""
    import snntorch.import_nir as snn_nir
    import snntorch.utils as snn_utils
    with contextlib.redirect_stdout(io.StringIO()):  # the importer prints
        m = snn_nir.import_from_nir(graph)
    if shift_flatten:
        shift_flatten_dims(m)
    snn_utils.reset(m)
    return torch.stack([m(x[t].to(torch.float32))[0] for t in range(x.shape[0])])


def run_norse(graph, x, dt, shift_flatten=False):
    import norse.torch
    logging.getLogger().setLevel(logging.ERROR)  # Norse warns through the root logger
    m = norse.torch.from_nir(graph, dt=dt)
    if shift_flatten:
        shift_flatten_dims(m)
    state, out = None, []
    for t in range(x.shape[0]):
        o, state = m(x[t].to(torch.float32), state)
        out.append(o)
    return torch.stack(out)


RUNNERS = {"spikingjelly": run_spikingjelly, "snntorch": run_snntorch, "norse": run_norse}


def samples_identical(out, ref):
    """Fraction of samples whose whole output spike train equals ``ref`` (``[T, N, ...]``)."""
    same = (out.to(torch.int8) == ref.to(torch.int8)).reshape(ref.shape[0], ref.shape[1], -1)
    return float(same.all(dim=2).all(dim=0).double().mean())
