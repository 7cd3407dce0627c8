r"""Custom neurons: the charge, fire and reset of a neuron written in Python, with snnquant
quantizers inside the time loop.

SpikingJelly 2.0 runs its ``BaseNode`` neurons through ``single_step_functional_forward`` and, for
``IFNode``/``LIFNode``/``ParametricLIFNode`` in multi-step mode, through fused multi-step
functions. None of these call ``neuronal_charge``, ``neuronal_fire`` or ``neuronal_reset``: a
``neuron.BaseNode`` subclass that only defines ``neuronal_charge`` raises ``NotImplementedError``,
and a ``neuron.LIFNode`` subclass that overrides it runs, silently, without the override.

The classes here run the neuron as three methods, in both step modes, so an override is always
honoured:

.. math::

    H[t] &= f(V[t-1], X[t]) &&\text{neuronal\_charge: sets } V \leftarrow H[t]\\
    S[t] &= \Theta(H[t] - V_{th}) &&\text{neuronal\_fire: returns } S[t]
        \text{ (surrogate gradient)}\\
    V[t] &= H[t]\,(1 - S[t]) + V_{reset}\,S[t] &&\text{neuronal\_reset (hard; soft: }
        H[t] - V_{th}\,S[t])

``self.v`` is a tensor shaped like the input already in the first ``neuronal_charge`` (SpikingJelly
fills it from ``v_reset``), so ``Q.step_quantize(self.v, ...)`` works from the first step. In
``'m'`` mode the three methods run once per time step (an autograd loop, no fused kernel), so
quantizers with data-dependent statistics see one step at a time; call a quantizer module as
``quantizer.quantize(h)``, which always has single-step meaning.

* :class:`CustomNode`: subclass it and define ``neuronal_charge`` (like ``neuron.BaseNode`` in
  SpikingJelly 1.x, or ``neuron.SimpleBaseNode``).
* :class:`CustomIFNode`, :class:`CustomLIFNode`: the IF / LIF charge by default; override any of
  the three methods.
* :func:`custom_neuron`: a class decorator that makes an existing subclass of a SpikingJelly 2.0
  neuron (``neuron.LIFNode``, ``neuron.IFNode``, ``neuron.BaseNode``, ...) run through its
  ``neuronal_*`` methods.
"""

from __future__ import annotations

from typing import Optional

import torch
from spikingjelly.activation_based import neuron, surrogate

from ..functional.neuron import neuron_charge

__all__ = ["CustomNode", "CustomIFNode", "CustomLIFNode", "custom_neuron", "NEURONAL_METHODS",
           "refuse_ignored_overrides"]

#: The methods a custom neuron defines, in the order they run each step.
NEURONAL_METHODS = ("neuronal_charge", "neuronal_fire", "neuronal_reset")

_ADVICE = ("subclass snnquant.nn.CustomNode (define neuronal_charge), snnquant.nn.CustomIFNode or "
           "snnquant.nn.CustomLIFNode, or decorate your SpikingJelly neuron subclass with "
           "@snnquant.nn.custom_neuron")


class _ChargeFireReset:
    """Runs ``neuronal_charge``, ``neuronal_fire`` and ``neuronal_reset`` as the neuron's step.

    Implements SpikingJelly 2.0's functional interface (``single_step_functional_forward`` and
    ``multi_step_functional_forward``), so every SpikingJelly path (single step, multi step,
    ``store_v_seq``, ``functional_forward``) goes through the three methods.
    """

    def neuronal_charge(self, x: torch.Tensor) -> None:
        """Set ``self.v`` to the charge :math:`H[t]` from ``self.v`` and the input ``x``."""
        raise NotImplementedError(
            f"{type(self).__name__} must define neuronal_charge(self, x), which sets self.v to "
            f"the charge H[t]; or subclass snnquant.nn.CustomIFNode / CustomLIFNode for the IF / "
            f"LIF charge"
        )

    def neuronal_fire(self) -> torch.Tensor:
        r"""Spikes :math:`S = \Theta(V - V_{th})`, with the surrogate gradient."""
        return self.surrogate_function(self.v - self.v_threshold)

    def neuronal_reset(self, spike: torch.Tensor) -> None:
        """Hard reset to ``v_reset`` where ``spike`` is 1, or soft reset (``v_reset=None``)."""
        spike_d = spike.detach() if self.detach_reset else spike
        if self.v_reset is None:
            self.v = neuron.BaseNode.apply_soft_reset(self.v, spike_d, self.v_threshold)
        else:
            self.v = neuron.BaseNode.apply_hard_reset(self.v, spike_d, self.v_reset)

    def single_step_functional_forward(self, inputs, states, **kwargs):
        """One step with explicit states: charge, fire, reset on the states, memories untouched."""
        memories = self._memories
        saved = dict(memories)
        try:
            # The neuronal_* methods read and write self.v (and any other memory): let them work
            # on the given states, then restore the module's own memories.
            for name, value in zip(list(memories), states):
                memories[name] = value
            self.neuronal_charge(inputs[0])
            spike = self.neuronal_fire()
            self.neuronal_reset(spike)
            new_states = tuple(memories.values())
        finally:
            memories.clear()
            memories.update(saved)
        return (spike,), new_states

    def multi_step_functional_forward(self, inputs, states, **kwargs):
        """``T`` steps of :meth:`single_step_functional_forward` (dim 0 of the inputs is time)."""
        spikes = []
        for t in range(inputs[0].shape[0]):
            (spike,), states = self.single_step_functional_forward(
                tuple(x[t] for x in inputs), states, **kwargs)
            spikes.append(spike)
        return (torch.stack(spikes),), states


class CustomNode(_ChargeFireReset, neuron.BaseNode):
    r"""Base class for a neuron written as ``neuronal_charge`` (+ optional fire and reset).

    .. math::

        H[t] = f(V[t-1], X[t]),\quad S[t] = \Theta(H[t] - V_{th}),\quad
        V[t] = H[t](1 - S[t]) + V_{reset} S[t]

    with :math:`f` your ``neuronal_charge``; override ``neuronal_fire`` / ``neuronal_reset`` to
    change the other two. Works in ``step_mode='s'`` and ``'m'`` (a per-step loop).

    Args:
        v_threshold: Firing threshold :math:`V_{th}` (a float, as SpikingJelly requires).
        v_reset: Hard-reset value, or ``None`` for soft reset.
        surrogate_function: Surrogate gradient of the spike.
        detach_reset: Cut the gradient through the spike in the reset.
        step_mode: ``'s'`` or ``'m'``.
        store_v_seq: Keep the membrane of every step in ``v_seq`` (``'m'`` mode).
    """

    def __init__(self, v_threshold: float = 1.0, v_reset: Optional[float] = 0.0,
                 surrogate_function=None, detach_reset: bool = False, step_mode: str = "s",
                 store_v_seq: bool = False):
        if surrogate_function is None:
            surrogate_function = surrogate.Sigmoid()
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode,
                         store_v_seq)


class CustomIFNode(_ChargeFireReset, neuron.IFNode):
    r"""``neuron.IFNode`` run through its ``neuronal_*`` methods, so that overrides are honoured.

    The default charge is the IF charge :math:`H[t] = V[t-1] + X[t]`. Same arguments as
    ``spikingjelly.activation_based.neuron.IFNode``.
    """

    def neuronal_charge(self, x: torch.Tensor) -> None:
        r""":math:`H[t] = V[t-1] + X[t]`."""
        self.v = neuron_charge("if", self.v, x, None, None, True, None)


class CustomLIFNode(_ChargeFireReset, neuron.LIFNode):
    r"""``neuron.LIFNode`` run through its ``neuronal_*`` methods, so that overrides are honoured.

    The default charge is SpikingJelly's LIF charge:

    .. math::

        H[t] = V[t-1] + \frac{X[t] - (V[t-1] - V_r)}{\tau}\ \text{(decay\_input)},\qquad
        H[t] = V[t-1] - \frac{V[t-1] - V_r}{\tau} + X[t]\ \text{(otherwise)}

    with :math:`V_r` = ``v_reset`` (0 for soft reset). Same arguments as
    ``spikingjelly.activation_based.neuron.LIFNode``.
    """

    def neuronal_charge(self, x: torch.Tensor) -> None:
        """The LIF charge (see the class docstring)."""
        v_rest = 0.0 if self.v_reset is None else self.v_reset
        self.v = neuron_charge("lif", self.v, x, self.tau, None, self.decay_input, v_rest)


def _user_overrides(cls) -> list:
    """The ``neuronal_*`` methods that ``cls`` or a user class between it and the library's
    classes defines."""
    names = []
    for klass in cls.__mro__:
        module = klass.__module__ or ""
        if module.startswith(("spikingjelly.", "snnquant.")) or klass is object:
            continue
        names += [name for name in NEURONAL_METHODS if name in vars(klass) and name not in names]
    return names


def refuse_ignored_overrides(cls, fused_base: str) -> None:
    """Raise ``TypeError`` if ``cls`` overrides a ``neuronal_*`` method that ``fused_base`` never
    calls (used by the quantized neurons, whose membrane update is fused)."""
    names = _user_overrides(cls)
    if names:
        raise TypeError(
            f"{cls.__name__} overrides {', '.join(names)}, but {fused_base} never calls "
            f"{'it' if len(names) == 1 else 'them'} (its membrane update is fused), so the "
            f"override would be ignored. To write your own neuron dynamics, {_ADVICE}, and "
            f"quantize the membrane inside neuronal_charge"
        )


def custom_neuron(cls):
    r"""Class decorator: make a subclass of a SpikingJelly 2.0 neuron run its ``neuronal_*`` methods.

    .. code-block:: python

        @snnquant.nn.custom_neuron
        class MyLIF(neuron.LIFNode):
            def neuronal_charge(self, x):
                h = self.v + (x - (self.v - self.v_reset)) / self.tau
                self.v = Q.lsq_quantize(h, step=0.125, qmin=-16, qmax=15)

    The class gets the functional step of :class:`CustomNode` (charge, fire, reset each step,
    in ``'s'`` and ``'m'`` mode), plus, where it defines none: SpikingJelly's fire and reset, and
    the IF / LIF charge for ``IFNode`` / ``LIFNode`` subclasses. The class is changed in place
    and returned. ``super().neuronal_charge(x)`` has no SpikingJelly method to reach; to extend
    the default charge, subclass :class:`CustomLIFNode` or :class:`CustomIFNode` instead.

    Raises:
        TypeError: ``cls`` is not a subclass of ``neuron.BaseNode`` (or is one of SpikingJelly's
            own classes, which would change it for everyone), defines its own
            ``single_step_functional_forward`` / ``multi_step_functional_forward`` (then it already
            has a functional step, and the decorator would replace it), or has no
            ``neuronal_charge`` and no default one.
    """
    if not isinstance(cls, type) or not issubclass(cls, neuron.BaseNode):
        if isinstance(cls, type) and issubclass(cls, neuron.SimpleBaseNode):
            return cls  # SimpleBaseNode already runs charge, fire and reset
        raise TypeError(
            f"custom_neuron: expected a subclass of spikingjelly's neuron.BaseNode (for example of "
            f"neuron.LIFNode), got {cls!r}"
        )
    if (cls.__module__ or "").startswith(("spikingjelly.", "snnquant.")):
        raise TypeError(
            f"custom_neuron: {cls.__name__} is a library class; decorating it would change it for "
            f"every user. Decorate your own subclass, or {_ADVICE}"
        )
    if issubclass(cls, _ChargeFireReset):
        return cls
    for name in ("single_step_functional_forward", "multi_step_functional_forward"):
        for klass in cls.__mro__:
            if name in vars(klass):
                if not (klass.__module__ or "").startswith("spikingjelly."):
                    raise TypeError(
                        f"custom_neuron: {cls.__name__} defines {name} (in {klass.__name__}), a "
                        f"functional step of its own, which the decorator would replace; remove it "
                        f"and write the dynamics in neuronal_charge/fire/reset, or do not decorate"
                    )
                break
    methods = {
        "single_step_functional_forward": _ChargeFireReset.single_step_functional_forward,
        "multi_step_functional_forward": _ChargeFireReset.multi_step_functional_forward,
    }
    if not hasattr(cls, "neuronal_fire"):
        methods["neuronal_fire"] = _ChargeFireReset.neuronal_fire
    if not hasattr(cls, "neuronal_reset"):
        methods["neuronal_reset"] = _ChargeFireReset.neuronal_reset
    if not hasattr(cls, "neuronal_charge"):
        if issubclass(cls, neuron.LIFNode):
            methods["neuronal_charge"] = CustomLIFNode.neuronal_charge
        elif issubclass(cls, neuron.IFNode):
            methods["neuronal_charge"] = CustomIFNode.neuronal_charge
        else:
            raise TypeError(
                f"custom_neuron: {cls.__name__} defines no neuronal_charge(self, x) and has no "
                f"default one (only IFNode and LIFNode subclasses do)"
            )
    for name, function in methods.items():
        setattr(cls, name, function)
    return cls
