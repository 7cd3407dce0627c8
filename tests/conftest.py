"""Helpers shared by the test files (import them with ``from conftest import ...``)."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(path, name=None):
    """Load a script of the repository (``examples/``, ``benchmarks/``) as a module without running
    its ``__main__`` block; ``path`` is relative to the repository root, ``name`` defaults to the
    file's stem. The script's folder is on ``sys.path`` while it loads, because scripts import
    their siblings by bare name."""
    path = ROOT / path
    folder = str(path.parent)
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(name or path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


def neuron_outputs(model, x):
    """``(output, {name: output of every SpikingJelly neuron layer})`` of ``model`` on ``x``,
    without gradients, its states reset first (forward hooks)."""
    import torch
    from spikingjelly.activation_based import functional as sjf
    from spikingjelly.activation_based import neuron

    outputs = {}
    hooks = [m.register_forward_hook(lambda mod, i, o, n=n: outputs.__setitem__(n, o.detach()))
             for n, m in model.named_modules() if isinstance(m, neuron.BaseNode)]
    sjf.reset_net(model)
    try:
        with torch.no_grad():
            y = model(x)
    finally:
        for h in hooks:
            h.remove()
    return y, outputs


def assert_spikes_equal(desc, model, x):
    """Run :class:`~snnquant.export.IntegerSNN` on ``desc`` and ``model`` (the folded float
    network) on the spike input ``x`` and assert that every neuron layer of the model is one of
    ``desc``'s, spikes at least once, and spikes identically in both at every step and sample;
    returns ``(integer output, float output)``."""
    import torch
    from snnquant.export import IntegerSNN

    out, layers = IntegerSNN(desc)(x.long(), record=True)
    y, spikes = neuron_outputs(model, x)
    assert sorted(desc.neuron_names) == sorted(spikes)
    silent = [k for k, s in spikes.items() if float(s.sum()) == 0]
    assert not silent, f"layers that never spike check nothing: {silent}"
    for layer_name, s in spikes.items():
        assert torch.equal(layers[layer_name].float(), s), layer_name
    return out, y


def integer_layers(net, x):
    """What every layer of the chip network ``net`` sends when its export
    (:func:`~snnquant.export.to_integer`, the chip's operations) runs on
    :class:`~snnquant.export.IntegerSNN`: ``[N, T, ...]`` arrays in layer order, for the input
    counts ``x`` ``[T, N, ...]``."""
    import torch
    from snnquant.export import IntegerSNN, to_integer

    desc = to_integer(net)
    assert desc.chip is not None
    _, layers = IntegerSNN(desc)(x.to(torch.int64), record=True)
    return [layers[op.name].transpose(0, 1).numpy() for op in desc.ops]


def csnn(channels=8, head_batchnorm=False):
    """SpikingJelly's N-MNIST style CSNN (conv-BN-LIF-maxpool blocks, a linear LIF read-out,
    multi-step); with ``head_batchnorm`` the read-out is ``Linear(bias=False) -> BatchNorm1d``."""
    import torch.nn as nn
    from spikingjelly.activation_based import functional as sjf
    from spikingjelly.activation_based import layer, neuron, surrogate

    c = channels
    head = [layer.Linear(c * 4 * 4, 10, bias=False), layer.BatchNorm1d(10)] if head_batchnorm \
        else [layer.Linear(c * 4 * 4, 10)]
    net = nn.Sequential(
        layer.Conv2d(2, c, 3, padding=1, bias=False), layer.BatchNorm2d(c),
        neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan(), detach_reset=True),
        layer.MaxPool2d(2),
        layer.Conv2d(c, c, 3, padding=1, bias=False), layer.BatchNorm2d(c),
        neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan(), detach_reset=True),
        layer.MaxPool2d(2), layer.Flatten(),
        *head, neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan()),
    )
    sjf.set_step_mode(net, "m")
    return net


def real_split_bench(script, recordings, tmp_path, monkeypatch, epochs: int, T: int):
    """``(module, bench)``: the benchmark ``script`` loaded (:func:`load_script`) and its
    ``_nmnist_common.Bench`` on the fixed stratified 800/200 split of ``recordings`` (the shared
    real N-MNIST), laid out under ``tmp_path``, with ``SNNQUANT_DATA`` there too."""
    module = load_script(script)
    split = load_script("benchmarks/accuracy_nmnist_real.py")
    root = tmp_path / "split"
    split.lay_out_split(recordings, root, quick=False)
    monkeypatch.setenv("SNNQUANT_DATA", str(tmp_path / "cache"))
    return module, module.common.Bench(epochs, str(root), T=T)


def host_reads():
    """A ``TorchDispatchMode`` that records the operations copying a device value to the host
    (item, bool, tolist, nonzero) in its ``reads`` list: a hot path that must not wait on the
    device (nor break a compiled graph) runs with none."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class HostReads(TorchDispatchMode):
        READS = ("aten._local_scalar_dense", "aten.is_nonzero", "aten.nonzero", "aten.equal")

        def __init__(self):
            super().__init__()
            self.reads = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(str(func).startswith(r) for r in self.READS):
                self.reads.append(str(func))
            return func(*args, **(kwargs or {}))

    return HostReads()


def assert_no_host_reads(net, x):
    """One training step of ``net`` on ``x`` after a first one (initialisation may read the
    data once) copies nothing from the device to the host (:func:`host_reads`)."""
    from spikingjelly.activation_based import functional as sjf

    net(x).sum().backward()
    sjf.reset_net(net)
    with host_reads() as rec:
        net(x).sum().backward()
    sjf.reset_net(net)
    assert rec.reads == []
