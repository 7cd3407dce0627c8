"""A custom SpikingJelly neuron whose charge uses snnquant.functional quantizers.

The neuron below is a LIF neuron whose synaptic input is rounded to a 1/8 grid (straight-through)
and whose membrane is kept on a 6-bit LSQ grid with a fixed step; the same quantizers work in any
neuron you write. It subclasses ``snnquant.nn.CustomLIFNode``, which runs ``neuronal_charge``
every step in both step modes (SpikingJelly 2.0's ``neuron.LIFNode`` would bypass the override in
its fused multi-step path); the main loop checks that the membrane is on the grid.

    python examples/custom_neuron.py [--steps 30]
"""
import argparse

import torch
import torch.nn as nn
from spikingjelly.activation_based import functional, layer, surrogate

from snnquant import functional as Q
from snnquant.nn import CustomLIFNode

MEMBRANE_STEP = 1 / 16


class RoundedInputLIFNode(CustomLIFNode):
    r"""LIF neuron with quantized input and membrane.

    .. math::

        H[t] = Q_v\big(V[t-1] + (\mathrm{round}_{1/8}(X[t]) - V[t-1]) / \tau\big),\quad
        Q_v(h) = s\,\mathrm{clamp}(\mathrm{round}(h/s), -32, 31),\ s = 1/16
    """

    def __init__(self, tau=2.0, **kwargs):
        super().__init__(tau=tau, decay_input=True, surrogate_function=surrogate.ATan(), **kwargs)

    def neuronal_charge(self, x: torch.Tensor):
        x = Q.step_quantize(x, 0.125)
        h = self.v + (x - (self.v - self.v_reset)) / self.tau
        self.v = Q.lsq_quantize(h, MEMBRANE_STEP, -32, 31)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    net = nn.Sequential(layer.Linear(20, 32), RoundedInputLIFNode(v_threshold=0.5),
                        layer.Linear(32, 2), RoundedInputLIFNode(v_threshold=0.5))
    functional.set_step_mode(net, "m")
    opt = torch.optim.Adam(net.parameters(), lr=2e-2)
    w_true = torch.randn(20)
    losses = []
    for step in range(args.steps):
        x = torch.randn(64, 20)
        y = (x @ w_true > 0).long()
        x_seq = 2 * x.unsqueeze(0).repeat(6, 1, 1)  # [T, N, 20]
        functional.reset_net(net)
        rate = net(x_seq).mean(0)
        loss = nn.functional.cross_entropy(rate * 8, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        for node in (net[1], net[3]):  # the quantizer ran inside the loop: membrane on the grid
            assert torch.equal(node.v, torch.round(node.v / MEMBRANE_STEP) * MEMBRANE_STEP)
        if step % 5 == 0 or step == args.steps - 1:
            print(f"step {step:3d} loss {loss.item():.4f} acc {(rate.argmax(1) == y).float().mean():.2f}")
    return losses


if __name__ == "__main__":
    main()
