"""Run a Speck network (written by :func:`snnquant.targets.speck.run_sinabs`) through Sinabs'
``DynapcnnNetwork``: its chip checks (layers to cores by its memory constraints) and its
discretised simulation, in the Python that has Sinabs installed (sinabs 3.1 pins nir <= 1.0.4,
older than snnquant's: keep it in its own environment).

This file imports only numpy, torch and Sinabs, never snnquant: it is run as a script,
``python sinabs_script.py IN.npz OUT.npz``. ``IN.npz`` holds ``x`` (``[N, T, C, H, W]`` input
event counts), ``input_shape``, ``n_layers``, ``device`` and, per layer ``k``, ``kind{k}``
(0 conv, 1 linear), ``w{k}``, ``b{k}`` (absent without a bias), ``threshold{k}``,
``min_v_mem{k}``, ``stride{k}``, ``padding{k}``, ``pool{k}`` and ``multi{k}`` (1 for Sinabs'
``MultiSpike``, 0 for ``SingleSpike``). With ``exact`` = 1 (the default) the script fails
unless Sinabs' common scale factor is 1 for every layer. With ``exact`` = 0 (the NIR route) the
weights, biases and thresholds are a float network's, each ``pool{k}`` an average pooling: the
script writes them as a NIR graph (nir's ``Conv2d``/``Affine``, ``IF``, ``SumPool2d`` with the
average's :math:`1/k^2` in the next layer's weights, as Sinabs' importer takes no ``AvgPool2d``),
reads the file back, imports it with Sinabs' ``from_nir`` and lets ``DynapcnnNetwork``
discretise it (the vendor's own post-training conversion). ``OUT.npz`` holds ``s{k}`` (``[N, T, ...]``, what layer
``k`` sends on: its spikes after its sum pooling), ``core{k}`` (the core Sinabs assigned) and
``kernel{k}``, ``neuron{k}``, ``bias{k}`` (the layer's memory as Sinabs counts it).

The ``samna`` package (SynSense's device driver, which Sinabs' ``dynapcnn`` backend imports at
its top) is only needed to configure and talk to a device; where it is not installed, this
script gives the import an empty shell whose every use raises, so a path that needed the device
would fail loudly rather than pass.
"""

import importlib
import importlib.abc
import importlib.machinery
import sys
import tempfile
import types

import numpy as np


class _Absent:
    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: samna is not installed (device configuration only)")

    def __getattr__(self, item):
        return _Absent(f"{self._name}.{item}")

    def __mro_entries__(self, bases):
        return (object,)


class _ShellModule(types.ModuleType):
    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Absent(f"{self.__name__}.{item}")


class _ShellFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    roots = ("samna", "samnagui")

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _ShellModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def _import_dynapcnn():
    try:
        importlib.import_module("samna")
    except ImportError:
        sys.meta_path.insert(0, _ShellFinder())
    from sinabs.backend.dynapcnn import DynapcnnNetwork
    from sinabs.backend.dynapcnn.chip_factory import ChipFactory
    return DynapcnnNetwork, ChipFactory


def _from_nir(data, n: int, tmp: str):
    """A float network of ``data`` as a NIR graph file, read back and imported by Sinabs."""
    import nir
    import sinabs

    shape = tuple(int(v) for v in data["input_shape"])
    nodes, order, scale = {"input": nir.Input(input_type={"input": np.array(shape)})}, ["input"], 1.0
    for k in range(int(data["n_layers"])):
        w = data[f"w{k}"].astype(np.float32) * np.float32(scale)
        b = (data[f"b{k}"] if f"b{k}" in data else np.zeros(w.shape[0])).astype(np.float32)
        if int(data[f"kind{k}"]) == 0:
            stride, pad = int(data[f"stride{k}"]), int(data[f"padding{k}"])
            nodes[f"syn{k}"] = nir.Conv2d(input_shape=shape[1:], weight=w, stride=stride,
                                          padding=pad, dilation=1, groups=1, bias=b)
            side = [(s + 2 * pad - w.shape[2]) // stride + 1 for s in shape[1:]]
            shape = (w.shape[0], *side)
            order.append(f"syn{k}")
        else:
            if len(shape) == 3:
                nodes[f"flat{k}"] = nir.Flatten(input_type={"input": np.array(shape)},
                                                start_dim=0, end_dim=-1)
                order.append(f"flat{k}")
            nodes[f"syn{k}"] = nir.Affine(weight=w, bias=b)
            shape = (w.shape[0],)
            order.append(f"syn{k}")
        nodes[f"if{k}"] = nir.IF(r=np.array(1.0, np.float32),
                                 v_threshold=np.array(float(data[f"threshold{k}"]), np.float32))
        order.append(f"if{k}")
        pool, scale = int(data[f"pool{k}"]), 1.0
        if pool > 1:
            nodes[f"pool{k}"] = nir.SumPool2d(kernel_size=np.array([pool, pool]),
                                              stride=np.array([pool, pool]),
                                              padding=np.array([0, 0]))
            order.append(f"pool{k}")
            shape, scale = (shape[0], shape[1] // pool, shape[2] // pool), 1.0 / (pool * pool)
    nodes["output"] = nir.Output(output_type={"output": np.array(shape)})
    order.append("output")
    path = f"{tmp}/network.nir"
    nir.write(path, nir.NIRGraph(nodes=nodes, edges=list(zip(order[:-1], order[1:]))))
    return sinabs.from_nir(nir.read(path), batch_size=n)


def main(src: str, dst: str) -> None:
    import torch
    import torch.nn as nn
    import sinabs.layers as sl
    from sinabs.activation import MultiSpike, SingleSpike

    DynapcnnNetwork, ChipFactory = _import_dynapcnn()
    data = np.load(src)
    x = data["x"]
    n, t = x.shape[:2]
    input_shape = tuple(int(v) for v in data["input_shape"])
    n_layers = int(data["n_layers"])
    exact = int(data["exact"]) if "exact" in data else 1
    modules, given = [], []
    for k in range(n_layers if exact else 0):
        w = torch.tensor(data[f"w{k}"], dtype=torch.float32)
        has_bias = f"b{k}" in data
        if int(data[f"kind{k}"]) == 0:
            stride, padding = int(data[f"stride{k}"]), int(data[f"padding{k}"])
            lin = nn.Conv2d(w.shape[1], w.shape[0], w.shape[2], stride=stride, padding=padding,
                            bias=has_bias)
        else:
            if k == 0 or int(data[f"kind{k - 1}"]) == 0:
                modules.append(nn.Flatten())
            lin = nn.Linear(w.shape[1], w.shape[0], bias=has_bias)
        with torch.no_grad():
            lin.weight.copy_(w)
            if has_bias:
                lin.bias.copy_(torch.tensor(data[f"b{k}"], dtype=torch.float32))
        spike_fn = MultiSpike if int(data[f"multi{k}"]) else SingleSpike
        modules += [lin, sl.IAFSqueeze(batch_size=n, spike_threshold=float(data[f"threshold{k}"]),
                                       min_v_mem=float(data[f"min_v_mem{k}"]), spike_fn=spike_fn)]
        if int(data[f"pool{k}"]) > 1:
            modules.append(sl.SumPool2d(int(data[f"pool{k}"])))
        given.append((w, data[f"b{k}"] if has_bias else None, float(data[f"threshold{k}"])))
    with tempfile.TemporaryDirectory() as tmp:
        source = nn.Sequential(*modules) if exact else _from_nir(data, n, tmp)
        net = DynapcnnNetwork(source, input_shape=input_shape, batch_size=n, discretize=True)
    layers = [net.dynapcnn_layers[i] for i in sorted(net.dynapcnn_layers)]
    if len(layers) != n_layers:
        raise SystemExit(f"Sinabs made {len(layers)} DynapcnnLayers of {n_layers} layers")
    for k, (layer, (w, b, threshold)) in enumerate(zip(layers, given)):
        # discretize=True rescales by one common factor per layer; the exported integers must be
        # what the chip gets, so that factor has to be 1.
        conv = layer.conv_layer
        if not torch.equal(conv.weight.reshape(w.shape), w):
            raise SystemExit(f"layer {k}: Sinabs' discretisation changed the weights")
        if b is not None and not torch.equal(conv.bias, torch.tensor(b, dtype=torch.float32)):
            raise SystemExit(f"layer {k}: Sinabs' discretisation changed the bias")
        if float(layer.spk_layer.spike_threshold) != threshold:
            raise SystemExit(f"layer {k}: Sinabs' discretisation changed the threshold")
    builder = ChipFactory(str(data["device"])).get_config_builder()
    cores = builder.map_layers_to_cores(net.dynapcnn_layers)
    xin = torch.tensor(x, dtype=torch.float32).reshape(n * t, *x.shape[2:])
    with torch.no_grad():
        outs = net(xin, return_complete=True)
    result = {}
    for k, i in enumerate(sorted(net.dynapcnn_layers)):
        out = list(outs[i].values())[0]
        result[f"s{k}"] = out.reshape(n, t, *out.shape[1:]).numpy().astype(np.int32)
        result[f"core{k}"] = np.int64(cores[i])
        for key, val in net.dynapcnn_layers[i].memory_summary().items():
            result[f"{key}{k}"] = np.int64(val)
    np.savez(dst, **result)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
