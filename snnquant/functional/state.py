r"""Membrane-potential (state) quantization onto snntorch's level sets, in O(n) memory."""

from __future__ import annotations

import math

import torch

from ._validation import check_bits, check_finite_real, check_flag, check_float_tensor

__all__ = ["state_quant", "StateQuantizer"]


def _default_multiplier(num_bits: int) -> float:
    """snntorch's base of the exponential level spacing for ``num_bits`` bits."""
    if num_bits == 1:
        return 0.05
    table = {2: 0.1, 3: 0.3, 4: 0.5, 5: 0.7, 6: 0.9, 7: 0.925}
    return table.get(num_bits, 0.95)


def _exponential_levels(num_levels, multiplier, min_val, max_val, centre):
    """snntorch's exponentially spaced levels, dense near ``centre`` (Python floats, same order of
    operations so that the values are bit-identical)."""
    overall_range = max_val - min_val
    lower_range = centre - min_val
    upper_range = max_val - centre
    lower_bits = math.floor(num_levels * (lower_range / overall_range))
    upper_bits = num_levels - lower_bits
    if lower_bits != 0 and not lower_range > 0:
        raise ValueError(
            f"state_quant: the range below {centre!r} is {lower_range!r}; it must be > 0 for "
            "non-uniform levels (check threshold and lower_limit)"
        )
    if upper_bits != 0 and not upper_range > 0:
        raise ValueError(
            f"state_quant: the range above {centre!r} is {upper_range!r}; it must be > 0 for "
            "non-uniform levels (check threshold and upper_limit)"
        )
    values = []
    if lower_bits != 0:
        summation = 0
        for j in reversed(range(lower_bits)):
            summation += multiplier**j
        room = summation / lower_range
        level = min_val
        for j in range(lower_bits):
            values.append(level)
            level += multiplier**j / room
    if upper_bits != 0:
        summation = 0
        for j in reversed(range(upper_bits)):
            summation += multiplier**j
        room = summation / upper_range
        level = centre
        for j in reversed(range(upper_bits)):
            level += multiplier**j / room
            values.append(level)
    return values


class _NearestLevelSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, table):
        work = x.to(table.dtype)
        last = table.numel() - 1
        # bucketize gives i with table[i-1] < x <= table[i]; the nearest level is table[i-1] or
        # table[i]. Ties go to the lower level, which is what snntorch's argmin (first index) does.
        upper_index = torch.bucketize(work, table, out_int32=True)
        lower_index = (upper_index - 1).clamp_(min=0)
        upper_index.clamp_(max=last)
        lower = table[lower_index]
        upper = table[upper_index]
        take_lower = (lower - work).abs_() <= (upper - work).abs_()
        # NaN compares False both ways: the last where puts it back.
        out = torch.where(take_lower, lower, torch.where(torch.isnan(work), work, upper))
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None


class StateQuantizer:
    r"""Quantize a membrane potential to the nearest of a fixed set of levels (snntorch's SQUAT).

    Built by :func:`state_quant`; call it on a tensor. The levels are those that
    ``snntorch.functional.quant.state_quant`` builds for the same arguments.

    .. math::

        y = \ell_{j^*}, \quad j^* = \min \operatorname*{arg\,min}_j |\ell_j - x|, \qquad
        \frac{\partial y}{\partial x} = 1

    (ties go to the lower level). NaN stays NaN, :math:`+\infty` maps to the highest level and
    :math:`-\infty` to the lowest.

    Attributes:
        levels: The sorted levels, a float64 CPU tensor of :math:`2^{\text{num\_bits}}` values.
        num_bits, uniform, thr_centered, threshold, lower_limit, upper_limit: The arguments.
        multiplier: The base of the exponential spacing actually used (``None`` when uniform).
    """

    def __init__(self, num_bits=8, uniform=True, thr_centered=True, threshold=1.0, lower_limit=0.0,
                 upper_limit=0.2, multiplier=None):
        fn = "state_quant"
        self.num_bits = check_bits(fn, "num_bits", num_bits)
        self.uniform = check_flag(fn, "uniform", uniform)
        self.thr_centered = check_flag(fn, "thr_centered", thr_centered)
        self.threshold = check_finite_real(fn, "threshold", threshold)
        if self.threshold <= 0:
            raise ValueError(f"{fn}: threshold must be > 0, got {threshold!r}")
        self.lower_limit = check_finite_real(fn, "lower_limit", lower_limit)
        self.upper_limit = check_finite_real(fn, "upper_limit", upper_limit)
        # snntorch's arithmetic, kept in its order (with the caller's int/float types).
        min_val = -threshold - threshold * lower_limit
        max_val = threshold + threshold * upper_limit
        if not max_val > min_val:
            raise ValueError(
                f"{fn}: the level range [{min_val!r}, {max_val!r}] from threshold={threshold!r}, "
                f"lower_limit={lower_limit!r}, upper_limit={upper_limit!r} is empty"
            )
        num_levels = 2**self.num_bits
        self._float32_levels = None
        if self.uniform:
            self.multiplier = None
            self.levels = torch.linspace(min_val, max_val, num_levels, dtype=torch.float64)
            # snntorch builds float32 levels with torch.linspace in float32, whose values differ
            # from the float64 ones rounded to float32 by one ulp here and there: keep both.
            self._float32_levels = torch.linspace(min_val, max_val, num_levels, dtype=torch.float32)
        else:
            if multiplier is None:
                multiplier = _default_multiplier(self.num_bits)
            elif not (check_finite_real(fn, "multiplier", multiplier) > 0):
                raise ValueError(f"{fn}: multiplier must be > 0, got {multiplier!r}")
            self.multiplier = float(multiplier)
            centre = threshold if self.thr_centered else 0
            values = _exponential_levels(num_levels, multiplier, min_val, max_val, centre)
            self.levels = torch.tensor(values, dtype=torch.float64)
        if not bool(torch.all(self.levels[1:] >= self.levels[:-1])):
            raise ValueError(f"{fn}: these arguments give unsorted levels; check them: {self!r}")
        if self._float32_levels is None:
            self._float32_levels = self.levels.to(torch.float32)
        self._tables = {}

    def levels_for(self, dtype: torch.dtype, device=None) -> torch.Tensor:
        """The level table that inputs of ``dtype`` are compared with, on ``device``.

        float64 inputs use :attr:`levels`; float32, float16 and bfloat16 inputs use float32 levels
        computed as snntorch computes them (uniform levels by ``torch.linspace`` in float32, which
        may differ from ``levels.float()`` by one ulp), and the chosen level is cast to the input's
        dtype.
        """
        device = torch.device("cpu") if device is None else torch.device(device)
        table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        key = (table_dtype, device)
        table = self._tables.get(key)
        if table is None:
            source = self.levels if table_dtype == torch.float64 else self._float32_levels
            table = source.to(device)
            self._tables[key] = table
        return table

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Quantize ``x`` to the nearest level (straight-through gradient)."""
        check_float_tensor("state_quant", x)
        return _NearestLevelSTE.apply(x, self.levels_for(x.dtype, x.device))

    def __repr__(self) -> str:
        args = (
            f"num_bits={self.num_bits}, uniform={self.uniform}, thr_centered={self.thr_centered}, "
            f"threshold={self.threshold}, lower_limit={self.lower_limit}, "
            f"upper_limit={self.upper_limit}"
        )
        if not self.uniform:
            args += f", multiplier={self.multiplier}"
        return f"StateQuantizer({args})"


def state_quant(num_bits=8, uniform=True, thr_centered=True, threshold=1.0, lower_limit=0.0,
                upper_limit=0.2, multiplier=None) -> StateQuantizer:
    r"""Build a membrane-potential quantizer on snntorch's level set (uniform or exponential).

    Same arguments and same levels as ``snntorch.functional.quant.state_quant``; the returned
    :class:`StateQuantizer` maps each element to the nearest level with a straight-through
    gradient:

    .. math::

        y = \ell_{j^*}, \quad j^* = \min \operatorname*{arg\,min}_j |\ell_j - x|, \qquad
        \frac{\partial y}{\partial x} = 1

    Levels, with :math:`n = 2^{\text{num\_bits}}`, :math:`\theta` = ``threshold``,
    :math:`a = -\theta(1 + \text{lower\_limit})` and :math:`b = \theta(1 + \text{upper\_limit})`:

    * ``uniform=True``: :math:`n` evenly spaced levels from :math:`a` to :math:`b`
      (``thr_centered`` and ``multiplier`` are ignored).
    * ``uniform=False``: levels spaced by powers of ``multiplier`` (default from ``num_bits``, as in
      snntorch), densest just above and below the centre :math:`c` = :math:`\theta` if
      ``thr_centered`` else 0: :math:`\lfloor n (c - a)/(b - a) \rfloor` levels in :math:`[a, c)`
      and the rest in :math:`(c, b]`.

    Differences from snntorch, on purpose:

    * Memory is O(n) in the input size (a binary search on the sorted levels, ``torch.bucketize``)
      instead of snntorch's ``[n, levels]`` broadcast (1 GiB for :math:`2^{20}` float32 values at
      8 bits).
    * :math:`+\infty`, and finite values so large that snntorch's float distances all round to the
      same number, map to the highest level; snntorch maps them to the lowest. NaN stays NaN
      (snntorch returns the lowest level).
    * float64 input is compared with float64 levels and returns float64 (snntorch returns float32
      levels); float16/bfloat16 input is compared with the float32 levels and the result cast back
      to the input dtype.

    Exact ties go to the lower level, as snntorch's ``argmin`` (first index) does.

    Args:
        num_bits: Bits per state, an int in ``[1, 32]``; the table has :math:`2^{\text{num\_bits}}`
            float64 entries (8 MiB at 20 bits), so keep it modest.
        uniform: Evenly spaced levels (else exponentially spaced).
        thr_centered: For non-uniform levels, cluster them around the threshold (else around 0).
        threshold: Firing threshold :math:`\theta`, finite and ``> 0``.
        lower_limit: How far below :math:`-\theta` the lowest level lies, as a fraction of
            :math:`\theta`.
        upper_limit: How far above :math:`\theta` the highest level lies, as a fraction of
            :math:`\theta`.
        multiplier: Base of the exponential spacing (non-uniform only), ``> 0``; ``None`` picks
            snntorch's default for ``num_bits``.

    Returns:
        A :class:`StateQuantizer` with a ``levels`` attribute (sorted float64 tensor).

    Raises:
        ValueError: ``num_bits`` not an int in ``[1, 32]``, a non-finite or non-positive
            ``threshold``, an empty range, or arguments for which snntorch's construction divides
            by zero.
    """
    return StateQuantizer(num_bits, uniform, thr_centered, threshold, lower_limit, upper_limit,
                          multiplier)
