"""The ``state_dict`` check of the quantized neurons' constants.

A neuron's dynamics depend on constants that are not parameters (``tau``, ``v_threshold``,
``v_reset``, ``decay_input``): SpikingJelly saves none of them, so a state saved with ``tau=4``
loads into a ``tau=2`` neuron without a word and the network spikes differently. The quantized
neurons save them as one float64 tensor and refuse a state saved with other values.
"""

from __future__ import annotations

import math

import torch

_KEY = "neuron_config"
# Each constant is saved as the pair (1, value), or (0, 0) for None (no such constant, or
# v_reset=None for the soft reset): no NaN, so that saved states compare equal with torch.equal.
_FIELDS = ("v_threshold", "v_reset", "tau", "decay_input")


def _constants(neuron) -> tuple:
    values = []
    for name in _FIELDS:
        value = getattr(neuron, name, None)
        # ParametricLIFNode's tau is the learned parameter w (saved on its own), not a constant.
        if name == "tau" and not isinstance(value, (int, float)):
            value = None
        values.append(math.nan if value is None else float(value))
    return tuple(values)


def _encode(values) -> torch.Tensor:
    pairs = [(0.0, 0.0) if math.isnan(v) else (1.0, v) for v in values]
    return torch.tensor(pairs, dtype=torch.float64)


def _decode(saved: torch.Tensor) -> tuple:
    return tuple(value if present else math.nan for present, value in saved.tolist())


def _describe(values) -> str:
    return ", ".join(f"{name}={_shown(name, v)}" for name, v in zip(_FIELDS, values))


def _shown(name: str, value: float):
    if math.isnan(value):
        return "None"
    if name == "decay_input":
        return bool(value)
    return value


class NeuronConfigCheckMixin:
    """Saves the neuron's constants (``v_threshold``, ``v_reset``, ``tau``, ``decay_input``) in
    ``state_dict`` as the float64 tensor ``<prefix>neuron_config`` (one row (present, value) per
    constant) and refuses a state saved with
    other values, naming the module and each constant that differs. Runs under ``strict=False``
    too (as :class:`~snnquant.nn.quantizers.base.ConfigCheckMixin`); a state saved without the
    constants (older snnquant, SpikingJelly) loads unchecked."""

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + _KEY] = _encode(_constants(self))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        key = prefix + _KEY
        if key in state_dict:
            saved = state_dict[key]
            layer = prefix[:-1] if prefix else "<root>"
            if not isinstance(saved, torch.Tensor) or tuple(saved.shape) != (len(_FIELDS), 2):
                raise ValueError(f"state_dict for {layer!r}: {key!r} must be a "
                                 f"[{len(_FIELDS)}, 2] tensor (present, value) for "
                                 f"{', '.join(_FIELDS)}; got {saved!r}")
            saved = _decode(saved)
            mine = _constants(self)
            differ = [i for i, (a, b) in enumerate(zip(saved, mine))
                      if not (a == b or (math.isnan(a) and math.isnan(b)))]
            if differ:
                what = "; ".join(f"{_FIELDS[i]} {_shown(_FIELDS[i], saved[i])} saved, "
                                 f"{_shown(_FIELDS[i], mine[i])} here" for i in differ)
                raise ValueError(
                    f"state_dict for {layer!r} was saved with other neuron constants than this "
                    f"{type(self).__name__} has ({what}): construct the neuron with the saved "
                    f"values ({_describe(saved)}) to load it"
                )
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        if key in unexpected_keys:
            unexpected_keys.remove(key)
