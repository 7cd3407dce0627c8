"""``snnquant train --model NAME``: a network of SpikingJelly's model package
(``spikingjelly.activation_based.model``) by name, with its constructor arguments, on any
``--dataset``; the example input the run hands to :func:`snnquant.quantize_model` (for the
deployability report and BatchNorm folding); ``--crop``, a centre crop of every frame."""
from __future__ import annotations

import ast
import inspect
from typing import Dict, List, Optional

import torch

#: the modules of ``spikingjelly.activation_based.model`` whose networks ``--model`` names
ZOO_MODULES = ("spike_driven_transformer", "spikformer", "qkformer", "ms_resnet",
               "parametric_lif_net", "spiking_resnet", "sew_resnet", "spiking_vgg", "maxformer",
               "masnn")


def zoo_names() -> List[str]:
    """Every network ``--model`` accepts, as ``module.Name``."""
    import importlib
    names = []
    for mod in ZOO_MODULES:
        try:
            m = importlib.import_module(f"spikingjelly.activation_based.model.{mod}")
        except ImportError:  # pragma: no cover - a SpikingJelly without it
            continue
        names += [f"{mod}.{n}" for n in getattr(m, "__all__", []) if _is_network(getattr(m, n))]
    return names


def _is_network(obj) -> bool:
    """A network class (an ``nn.Module``) or a factory function, not a configuration class."""
    import torch.nn as nn
    return inspect.isfunction(obj) or (inspect.isclass(obj) and issubclass(obj, nn.Module))


def resolve_zoo(name: str):
    """The class or factory ``name`` (``SpikeDrivenTransformer`` or
    ``spike_driven_transformer.SpikeDrivenTransformer``) of SpikingJelly's model package.

    Raises:
        ValueError: no such network (the message lists them).
    """
    import importlib
    names = zoo_names()
    matches = [n for n in names if n == name or n.split(".")[-1] == name]
    if len(matches) != 1:
        raise ValueError(f"--model must name one network of spikingjelly.activation_based.model, "
                         f"got {name!r}; choose from: {', '.join(names)}")
    mod, _, attr = matches[0].rpartition(".")
    return getattr(importlib.import_module(f"spikingjelly.activation_based.model.{mod}"), attr)


def parse_model_args(items: Optional[List[str]]) -> Dict[str, object]:
    """``--model-arg KEY=VALUE`` (repeated) as keyword arguments; a VALUE is a Python literal
    (``2.0``, ``(1, 2, 2)``, ``'1111'``) or else a string; an item ``{'key': value, ...}`` gives
    several at once.

    Raises:
        ValueError: an item without ``=``.
    """
    kwargs = {}
    for item in items or ():
        if item.lstrip().startswith("{"):   # several at once: "{'embed_dims': 64}"
            try:
                given = ast.literal_eval(item)
            except (ValueError, SyntaxError):
                given = None
            if not isinstance(given, dict) or not all(isinstance(k, str) and k.isidentifier()
                                                      for k in given):
                raise ValueError(f"--model-arg must be KEY=VALUE or a dict of constructor "
                                 f"arguments, got {item!r}")
            kwargs.update(given)
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"--model-arg must be KEY=VALUE (a constructor argument), got "
                             f"{item!r}")
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return kwargs


def frame_shape(args) -> tuple:
    """One frame's shape of the run's dataset after ``--crop``."""
    from snnquant.datasets import dataset_info
    shape = tuple(dataset_info(args.dataset).frame_shape)
    crop = getattr(args, "crop", None)
    if crop and len(shape) == 3:
        shape = (shape[0], crop, crop)
    return shape


def build_zoo(args):
    """The network ``args.model`` with ``--model-arg``'s arguments; the dataset's channels,
    classes, image size and ``-T`` fill the constructor arguments of those names that were not
    given. Multi-step."""
    from spikingjelly.activation_based import functional

    from snnquant.datasets import dataset_info
    build = resolve_zoo(args.model)
    kwargs = parse_model_args(getattr(args, "model_arg", None))
    shape = frame_shape(args)
    known = {"T": args.T, "in_channels": shape[0],
             "num_classes": dataset_info(args.dataset).num_classes}
    if len(shape) == 3:
        known.update(img_size_h=shape[1], img_size_w=shape[2])
    params = inspect.signature(build).parameters
    for key, value in known.items():
        if key in params and key not in kwargs:
            kwargs[key] = value
    if "spiking_neuron" in params:
        kwargs["spiking_neuron"] = _neuron_class(kwargs.get("spiking_neuron"), args.model)
    try:
        net = build(**kwargs)
    except TypeError as exc:
        raise ValueError(f"--model {args.model} with {kwargs}: {exc}") from None
    functional.set_step_mode(net, "m")
    return net


def _neuron_class(name, model: str):
    """``--model-arg spiking_neuron=NAME``: the class of ``spikingjelly.activation_based.neuron``;
    by default ``ParametricLIFNode`` for the parametric-LIF nets (their paper's neuron: the
    deployability report says what its learned tau needs) and ``LIFNode`` for the others."""
    from spikingjelly.activation_based import neuron
    if name is None:
        name = ("ParametricLIFNode" if "parametric_lif_net" in str(resolve_zoo(model).__module__)
                else "LIFNode")
    if not isinstance(name, str):
        return name
    cls = getattr(neuron, name, None)
    if not (inspect.isclass(cls) and issubclass(cls, neuron.BaseNode)):
        raise ValueError(f"--model-arg spiking_neuron must name a neuron class of "
                         f"spikingjelly.activation_based.neuron (LIFNode, IFNode, "
                         f"ParametricLIFNode, ...), got {name!r}")
    return cls


def example_batch(train_set, n: int = 2) -> torch.Tensor:
    """The first ``n`` training samples as one multi-step batch ``[T, n, ...]`` (float)."""
    frames = [torch.as_tensor(train_set[i][0]) for i in range(min(n, len(train_set)))]
    return torch.stack(frames, 0).float().transpose(0, 1)


def data_input_max(dataset, batch_size: int = 64) -> int:
    """The largest event count of a whole dataset (the integer export's ``input_max``: the
    C model's ``SNN_INPUT_MAX``), at least 1."""
    from torch.utils.data import DataLoader
    largest = 1
    for frames, _ in DataLoader(dataset, batch_size=batch_size):
        largest = max(largest, int(torch.as_tensor(frames).abs().max().ceil()))
    return largest


class CroppedDataset(torch.utils.data.Dataset):
    """A dataset of frame sequences ``[T, C, H, W]`` cropped to ``[T, C, size, size]`` at the
    centre (``--crop``: N-MNIST's 34x34 to 32x32, so that a network's means run over powers of
    two)."""

    def __init__(self, dataset, size: int):
        self.dataset, self.size = dataset, int(size)

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        frames, label = self.dataset[index]
        frames = torch.as_tensor(frames)
        h, w = frames.shape[-2:]
        if self.size > min(h, w):
            raise ValueError(f"--crop {self.size} is larger than the frames ({h}x{w})")
        top, left = (h - self.size) // 2, (w - self.size) // 2
        return frames[..., top:top + self.size, left:left + self.size], label
