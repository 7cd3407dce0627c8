"""The network of ``snnquant train``: the example's float network for each dataset, quantized as
the flags say, and the default learning rate of its weights."""
from __future__ import annotations

import torch.nn as nn

#: ``--lr`` by default: Adam's learning rate
DEFAULT_LR = 2e-3
#: ``--lr`` by default for binary and ternary weights (:func:`default_lr`)
BINARY_LR = 5e-3


def default_lr(weight_bits, weight_quantizer) -> float:
    """The default learning rate: 5e-3 for binary (1-bit) and ternary weights, else 2e-3.

    On the built-in data (30 epochs, seed 0) binary weights reach 95.5% at 2e-3 and 97.5% at
    5e-3, ternary 96.4% and 98.6%, while full precision drops from 98.6% to 97.8% at 5e-3."""
    if weight_bits == 1 or (weight_bits and weight_quantizer == "ternary"):
        return BINARY_LR
    return DEFAULT_LR


def build_csnn(channels: int, tau: float):
    """SpikingJelly-style N-MNIST CSNN: conv-BN-LIF blocks (the first with stride 2, so that the
    34 x 34 input costs little on a CPU), max pooling and a linear LIF read-out."""
    from spikingjelly.activation_based import functional, layer, neuron, surrogate

    def lif(detach):
        return neuron.LIFNode(tau=tau, surrogate_function=surrogate.ATan(), detach_reset=detach)

    net = nn.Sequential(
        layer.Conv2d(2, channels, 3, stride=2, padding=1, bias=False), layer.BatchNorm2d(channels),
        lif(True),                                                          # [C, 17, 17]
        layer.Conv2d(channels, channels, 3, padding=1, bias=False), layer.BatchNorm2d(channels),
        lif(True), layer.MaxPool2d(2),                                      # [C, 8, 8]
        layer.Flatten(),
        layer.Linear(channels * 8 * 8, 10, bias=False), lif(False),
    )
    functional.set_step_mode(net, "m")
    return net


def build_network(args):
    """The example's float network for ``args.dataset`` (``--channels``, ``--tau``), or
    ``--model``'s network of SpikingJelly's model package (:mod:`snnquant.cli.zoo`)."""
    if getattr(args, "model", None):
        from snnquant.cli.zoo import build_zoo
        return build_zoo(args)
    if args.dataset == "nmnist":
        return build_csnn(args.channels, args.tau)
    from snnquant.datasets import default_network
    return default_network(args.dataset, args.channels, args.tau)


def quantize(net, args, example_input=None):
    """``net`` quantized by :func:`snnquant.quantize_model` as the flags say; ``(net, None)`` for
    full precision (``--weight-bits 0 --v-bits 0``), else ``(model, report)``. With
    ``example_input`` (one batch of the training data) BatchNorm pairs are found from a run and
    ``report.deployability`` says what the integer export would refuse after training."""
    import snnquant
    if args.weight_bits == 0 and args.v_bits == 0:
        return net, None
    cfg = snnquant.QuantConfig(weight_bits=args.weight_bits or None,
                               weight_quantizer=args.weight_quantizer,
                               per_channel=not args.per_tensor,
                               v_bits=args.v_bits or None,
                               membrane_quantizer=args.membrane_quantizer, backend=args.backend,
                               fold_batchnorm=not args.no_fold_bn_training)
    if example_input is None:
        return snnquant.quantize_model(net, cfg)
    import warnings

    from snnquant.deployability import DeployabilityWarning
    with warnings.catch_warnings():   # the report is printed with the quantize report
        warnings.simplefilter("ignore", DeployabilityWarning)
        return snnquant.quantize_model(net, cfg, example_input=example_input)

