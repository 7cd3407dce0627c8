r"""Knowledge distillation from the full-precision network into its quantized copy.

A low-bit student (the network after :func:`~snnquant.quantize_model`, or a chip network of
:mod:`snnquant.targets`) trains against its frozen full-precision teacher (the network before
``quantize_model``, or a trained run): a temperature-scaled loss on the outputs (Hinton et al.
2015) mixed with the task loss, plus, selectable, a per-layer alignment of firing rates,
membrane statistics or spiking self-attention maps. Layers are matched by module name: the
student keeps the teacher's names (``quantize_model`` replaces modules in place), and a chip layer
is matched to the source neuron it was converted from (``converted_from``).

The teacher is frozen: :class:`Distiller` puts it in eval mode before every forward, runs it
without gradients and never changes its parameters or BatchNorm statistics. The student is an
ordinary quantized network: it trains with BatchNorm folded in the loop and deploys exactly.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, Mapping, Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

#: the per-layer alignments :class:`Distiller` offers (``align=``)
ALIGNMENTS = ("firing_rate", "membrane", "attention")

__all__ = ["ALIGNMENTS", "Distiller", "distillation_loss", "freeze_teacher", "rate_readout"]


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                      temperature: float) -> torch.Tensor:
    r"""Hinton's knowledge-distillation loss: the temperature-scaled KL divergence from the
    teacher's softened class distribution to the student's, averaged over the batch.

    .. math::

        L_{KD} = \tau^2 \frac{1}{N} \sum_n \sum_c p_{n,c} (\log p_{n,c} - \log q_{n,c}),
        \quad p = \mathrm{softmax}(t / \tau), \quad q = \mathrm{softmax}(s / \tau)

    .. math::

        \frac{\partial L_{KD}}{\partial s_{n,c}} = \frac{\tau}{N} (q_{n,c} - p_{n,c})

    Args:
        student_logits: ``[N, C]`` class scores of the student (for a spiking network, its output
            firing rates: :func:`rate_readout`).
        teacher_logits: ``[N, C]`` class scores of the teacher (no gradient flows into them).
        temperature: :math:`\tau > 0`; below 1 it sharpens scores that lie in [0, 1] (firing
            rates), above 1 it softens logits.
    """
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
    if student_logits.shape != teacher_logits.shape or student_logits.dim() != 2:
        raise ValueError(f"student_logits and teacher_logits must both be [N, C], got "
                         f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}")
    t = float(temperature)
    log_q = F.log_softmax(student_logits.float() / t, dim=-1)
    log_p = F.log_softmax(teacher_logits.detach().float() / t, dim=-1)
    return t * t * F.kl_div(log_q, log_p, reduction="batchmean", log_target=True)


def rate_readout(output: torch.Tensor) -> torch.Tensor:
    r"""The class scores of a multi-step spiking network: its output averaged over time (an
    ``[N, C]`` output, which networks that average themselves return, is taken as it is).

    .. math::

        r_{n,c} = \frac{1}{T} \sum_t o_{t,n,c}

    Args:
        output: ``[T, N, C]`` (or ``[N, C]``) output of the network.
    """
    if output.dim() == 2:
        return output.float()
    if output.dim() != 3:
        raise ValueError(f"rate_readout expects a [T, N, C] (or [N, C]) output, got shape "
                         f"{tuple(output.shape)}; pass Distiller(readout=...) for other outputs")
    return output.float().mean(0)


def freeze_teacher(teacher: nn.Module) -> nn.Module:
    """Put ``teacher`` in eval mode and turn off its parameters' gradients; return it.

    In eval mode BatchNorm uses, and never updates, its running statistics.

    Args:
        teacher: the full-precision network.
    """
    if not isinstance(teacher, nn.Module):
        raise TypeError(f"teacher must be an nn.Module, got {type(teacher).__name__}")
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def _is_neuron(module: nn.Module) -> bool:
    from spikingjelly.activation_based import neuron
    return isinstance(module, neuron.BaseNode)


def _is_chip_layer(module: nn.Module) -> bool:
    return bool(getattr(module, "converted_from", ()))


def _is_attention(module: nn.Module) -> bool:
    # SpikingJelly's SpikingSelfAttention (Spikformer), SpikeDrivenSelfAttention and the QK
    # attentions compute their attention map into a neuron called attn_lif
    return isinstance(getattr(module, "attn_lif", None), nn.Module)


def _channel_stats(x: torch.Tensor) -> torch.Tensor:
    """``[2, C]``: mean and standard deviation per channel (dim 2 of ``[T, N, C, ...]``, dim 1
    of ``[N, C, ...]``) over all other dims."""
    dim = 2 if x.dim() >= 3 else 1
    flat = x.float().transpose(0, dim).reshape(x.shape[dim], -1)
    return torch.stack([flat.mean(1), flat.std(1, unbiased=False)])


class Distiller:
    r"""Train a quantized ``student`` against its frozen full-precision ``teacher``.

    Calling the distiller on an input runs the teacher (eval mode, no gradients, its states reset
    first) and then the student on it, records the matched layers of both through forward hooks,
    and returns the student's output. :meth:`loss` then mixes the task loss with the
    distillation terms:

    .. math::

        L = (1 - \alpha) L_{task} + \alpha L_{KD}(r(s), r(t); \tau)
            + \beta \frac{1}{|M|} \sum_{l \in M} A_l

    where :math:`r` is ``readout`` (:func:`rate_readout` by default), :math:`L_{KD}` is
    :func:`distillation_loss`, :math:`M` are the matched layers and :math:`A_l` the alignment
    (``align``) of layer :math:`l`:

    .. math::

        A^{rate}_l = \mathrm{mean}_{n,i} (\bar s_{n,i} - \bar t_{n,i})^2, \quad
        \bar x = \frac{1}{T} \sum_t x_t \text{ (the neuron's spikes)}

    .. math::

        A^{membrane}_l = \mathrm{mean}_c \frac{(\mu^s_c - \mu^t_c)^2 + (\sigma^s_c - \sigma^t_c)^2}
        {\theta^2}

    with :math:`\mu_c, \sigma_c` the mean and standard deviation over time, batch and positions
    of the input current of channel :math:`c` (what charges the membrane each step) and
    :math:`\theta` the teacher neuron's threshold;

    .. math::

        A^{attention}_l = \frac{\mathrm{mean} (a^s - a^t)^2}{\mathrm{mean} (a^t)^2 + 10^{-8}}

    with :math:`a` the attention map a spiking self-attention sends into its ``attn_lif`` neuron
    (:math:`\sum_i k \odot v` in SpikeDrivenSelfAttention, :math:`v k^\top q \cdot s` in
    Spikformer's SpikingSelfAttention). The gradient flows into the student only.

    Layers are matched by module name: a neuron (``align='firing_rate'`` or ``'membrane'``) or a
    spiking self-attention (``'attention'``) of the student with the module of the same name in
    the teacher, and a chip layer of :mod:`snnquant.targets` (whose names are its position) with
    the source neuron it was converted from. ``layers`` restricts or overrides the matching.

    Args:
        student: the quantized network that trains.
        teacher: its full-precision network (the model before ``quantize_model``, or a trained
            run); frozen with :func:`freeze_teacher`.
        temperature: :math:`\tau` of the output loss (> 0). On firing rates in [0, 1] a value
            below 1 sharpens the teacher's distribution; 0.2 (the default) won on the real
            N-MNIST validation split (``benchmarks/distill_low_bits.py``), with ``kd_weight=0.5``
            and ``align='firing_rate'``.
        kd_weight: :math:`\alpha` in [0, 1]: 0 trains on the task loss alone (plus alignment).
        align: ``None``, one of :data:`ALIGNMENTS`, or several of them.
        align_weight: :math:`\beta \ge 0`.
        layers: the student modules to align (names), or a mapping from student to teacher
            names; default: every matched module of the kind ``align`` asks for.
        readout: turns a network output into ``[N, C]`` class scores.

    Example::

        teacher = build_csnn()                           # trained in full precision
        student, _ = snnquant.quantize_model(teacher, snnquant.QuantConfig(weight_bits=2, v_bits=4))
        distiller = Distiller(student, teacher, kd_weight=0.5, align="firing_rate")
        out = distiller(x)                               # [T, N, 10]
        task = F.mse_loss(out.mean(0), F.one_hot(y, 10).float())
        distiller.loss(out, task).backward()
    """

    def __init__(self, student: nn.Module, teacher: nn.Module, *, temperature: float = 0.2,
                 kd_weight: float = 0.5, align: Union[None, str, Sequence[str]] = None,
                 align_weight: float = 1.0,
                 layers: Union[None, Iterable[str], Mapping[str, str]] = None,
                 readout: Callable[[torch.Tensor], torch.Tensor] = rate_readout):
        if not isinstance(student, nn.Module):
            raise TypeError(f"student must be an nn.Module, got {type(student).__name__}")
        if student is teacher:
            raise ValueError("student and teacher are the same module: distil into a quantized "
                             "copy (snnquant.quantize_model returns one)")
        if not isinstance(temperature, (int, float)) or not temperature > 0:
            raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
        if not isinstance(kd_weight, (int, float)) or not 0 <= kd_weight <= 1:
            raise ValueError(f"kd_weight must be in [0, 1], got {kd_weight!r}")
        if not isinstance(align_weight, (int, float)) or not align_weight >= 0:
            raise ValueError(f"align_weight must be a number >= 0, got {align_weight!r}")
        aligns = () if align is None else (align,) if isinstance(align, str) else tuple(align)
        for a in aligns:
            if a not in ALIGNMENTS:
                raise ValueError(f"align must be None or one of {ALIGNMENTS} (or a list of them), "
                                 f"got {a!r}")
        self.student, self.teacher = student, freeze_teacher(teacher)
        self.temperature, self.kd_weight = float(temperature), float(kd_weight)
        self.align, self.align_weight, self.readout = aligns, float(align_weight), readout
        self.pairs: Dict[str, Dict[str, str]] = {a: self._match(a, layers) for a in aligns}
        self.teacher_output: Optional[torch.Tensor] = None
        #: the terms of the last :meth:`loss` (floats): task, kd, and one per alignment
        self.last: Dict[str, float] = {}
        self._student_rec: Dict[tuple, torch.Tensor] = {}
        self._teacher_rec: Dict[tuple, torch.Tensor] = {}
        self._handles = []
        for a, pairs in self.pairs.items():
            s_mods, t_mods = dict(student.named_modules()), dict(teacher.named_modules())
            for s_name, t_name in pairs.items():
                self._hook(s_mods[s_name], a, s_name, self._student_rec)
                self._hook(t_mods[t_name], a, s_name, self._teacher_rec)

    def _match(self, align: str, layers) -> Dict[str, str]:
        s_mods, t_mods = dict(self.student.named_modules()), dict(self.teacher.named_modules())
        if layers is not None:
            pairs = dict(layers) if isinstance(layers, Mapping) else {n: n for n in layers}
            for s_name, t_name in pairs.items():
                if s_name not in s_mods:
                    raise ValueError(f"layers: the student has no module {s_name!r}")
                if t_name not in t_mods:
                    raise ValueError(f"layers: the teacher has no module {t_name!r} (matched to "
                                     f"the student's {s_name!r})")
        else:
            pairs = {}
            for name, m in s_mods.items():
                if align == "attention":
                    if _is_attention(m) and name in t_mods and _is_attention(t_mods[name]):
                        pairs[name] = name
                elif _is_chip_layer(m):
                    sources = [n for n, _ in m.converted_from if n in t_mods
                               and _is_neuron(t_mods[n])]
                    if sources:
                        pairs[name] = sources[-1]
                elif _is_neuron(m) and name in t_mods and _is_neuron(t_mods[name]):
                    pairs[name] = name
            if not pairs:
                what = {"attention": "spiking self-attention (a module with an attn_lif neuron)",
                        "firing_rate": "neuron", "membrane": "neuron"}[align]
                raise ValueError(f"align={align!r}: no {what} of the student has a teacher module "
                                 f"of the same name; pass layers= to match them")
        for s_name in pairs:
            m = s_mods[s_name]
            if align == "membrane" and _is_chip_layer(m):
                raise ValueError(f"align='membrane': the student's {s_name!r} is a chip layer "
                                 f"({type(m).__name__}), whose synapse and neuron are one module "
                                 f"with no separate input current; use align='firing_rate'")
            if align == "attention" and not _is_attention(m):
                raise ValueError(f"align='attention': the student's {s_name!r} "
                                 f"({type(m).__name__}) has no attn_lif neuron")
        return pairs

    def _hook(self, module: nn.Module, align: str, key: str, store: dict) -> None:
        if align == "attention":
            target = module.attn_lif

            def record(_m, inputs, _out):
                store[(align, key)] = inputs[0]
        elif align == "membrane":
            target = module

            def record(_m, inputs, _out):
                store[(align, key)] = inputs[0]
        else:
            target = module

            def record(_m, _inputs, out):
                store[(align, key)] = out
        self._handles.append(target.register_forward_hook(record))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Run the teacher (frozen, states reset) and the student on ``x``; return the student's
        output. The student's states are the caller's to reset (``functional.reset_net``), as
        in any SpikingJelly training loop."""
        from spikingjelly.activation_based import functional
        self._student_rec.clear()
        self._teacher_rec.clear()
        self.teacher.eval()
        functional.reset_net(self.teacher)
        with torch.no_grad():
            self.teacher_output = self.teacher(x)
        functional.reset_net(self.teacher)
        return self.student(x)

    def alignment(self, align: str) -> torch.Tensor:
        """The alignment term :math:`\\frac{1}{|M|} \\sum_l A_l` of ``align`` from the last call.

        Args:
            align: one of the distiller's ``align``.
        """
        if align not in self.pairs:
            raise ValueError(f"align {align!r} is not one this distiller records "
                             f"({self.align or 'none'})")
        terms = []
        teacher_mods = dict(self.teacher.named_modules())
        for s_name, t_name in self.pairs[align].items():
            key = (align, s_name)
            if key not in self._student_rec or key not in self._teacher_rec:
                raise RuntimeError(f"align={align!r}: layer {s_name!r} did not run in the last "
                                   f"call of the distiller (call it on an input first)")
            s, t = self._student_rec[key].float(), self._teacher_rec[key].detach().float()
            if s.shape != t.shape:
                raise ValueError(f"align={align!r}: the student's {s_name!r} gives "
                                 f"{tuple(s.shape)}, the teacher's {t_name!r} "
                                 f"{tuple(t.shape)}; pass layers= to match others")
            if align == "firing_rate":
                terms.append((s.mean(0) - t.mean(0)).pow(2).mean())
            elif align == "membrane":
                theta = float(getattr(teacher_mods[t_name], "v_threshold", 1.0))
                terms.append((_channel_stats(s) - _channel_stats(t)).pow(2).sum(0).mean()
                             / theta ** 2)
            else:
                terms.append((s - t).pow(2).mean() / (t.pow(2).mean() + 1e-8))
        return torch.stack(terms).mean()

    def loss(self, student_output: torch.Tensor, task_loss: torch.Tensor) -> torch.Tensor:
        """The training loss of the last call: the task loss mixed with the output
        distillation loss, plus the weighted alignments (see the class).

        Args:
            student_output: what the last call returned.
            task_loss: the student's own loss on the labels.
        """
        if self.teacher_output is None:
            raise RuntimeError("call the distiller on an input before asking for its loss")
        total = (1.0 - self.kd_weight) * task_loss
        self.last = {"task": float(task_loss.detach())}
        if self.kd_weight > 0:
            kd = distillation_loss(self.readout(student_output), self.readout(self.teacher_output),
                                   self.temperature)
            total = total + self.kd_weight * kd
            self.last["kd"] = float(kd.detach())
        for a in self.align:
            term = self.alignment(a)
            total = total + self.align_weight * term
            self.last[a] = float(term.detach())
        return total

    def remove(self) -> None:
        """Remove the distiller's hooks from both networks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
