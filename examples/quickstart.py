"""Quickstart: quantize a SpikingJelly network in one call, print its summary, train a few steps.

    python examples/quickstart.py [--steps 20]
"""
import argparse

import torch
import torch.nn as nn
from spikingjelly.activation_based import functional, layer, neuron, surrogate

import snnquant


def build_net():
    net = nn.Sequential(
        layer.Conv2d(2, 16, 3, padding=1, bias=False), layer.BatchNorm2d(16),
        neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan(), detach_reset=True),
        layer.MaxPool2d(2), layer.Flatten(),
        layer.Linear(16 * 8 * 8, 10), neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan()),
    )
    functional.set_step_mode(net, "m")
    return net


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("-T", type=int, default=4)
    args = ap.parse_args(argv)
    torch.manual_seed(0)

    net, report = snnquant.quantize_model(
        build_net(), snnquant.QuantConfig(weight_bits=4, v_bits=8))
    print(report)
    print(snnquant.summary(net))

    # a toy task: the class is which quadrant of a 16x16 event frame is most active
    def batch(n=32):
        y = torch.randint(0, 4, (n,))
        x = (torch.rand(args.T, n, 2, 16, 16) < 0.05).float()
        for i, c in enumerate(y.tolist()):
            r, q = divmod(c, 2)
            x[:, i, :, 8 * r:8 * r + 8, 8 * q:8 * q + 8] += (torch.rand(args.T, 2, 8, 8) < 0.3).float()
        return x.clamp(max=1), y

    opt = torch.optim.Adam(net.parameters(), lr=5e-3)
    losses = []
    for step in range(args.steps):
        x, y = batch()
        functional.reset_net(net)
        rate = net(x).mean(0)
        loss = nn.functional.cross_entropy(rate * 10, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"step {step:3d}  loss {loss.item():.4f}  acc {(rate.argmax(1) == y).float().mean():.2f}")
    return losses


if __name__ == "__main__":
    main()
