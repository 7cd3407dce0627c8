r"""Membrane-potential (state) quantization onto snntorch's level sets, in O(n) memory."""

from __future__ import annotations

import math

import torch

from .int_limits import check_bit_width
from ._validation import (
    as_tensor_input,
    check_finite_real,
    check_flag,
    check_float_tensor,
)

__all__ = ["state_quant", "StateQuantizer", "STATE_QUANT_MAX_BITS"]

#: Largest ``num_bits`` :func:`state_quant` accepts: its level table holds ``2**num_bits`` values
#: (8 MiB in float64 at 20 bits, built in about half a second); 32 bits would need 32 GiB.
STATE_QUANT_MAX_BITS = 20


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


class LevelTable:
    """A sorted level table in one dtype on one device, ready for :func:`nearest_level`.

    ``grid`` is ``(origin, 1 / spacing)`` when the levels are evenly spaced closely enough that an
    arithmetic estimate of the bracketing pair is always right (checked here, once), else ``None``.
    """

    def __init__(self, levels: torch.Tensor):
        n = levels.numel()
        self.values = levels
        self.next_values = levels[1:].contiguous()
        self.first = float(levels[0])
        self.last = float(levels[-1])
        self.grid = None
        spacing = (self.last - self.first) / (n - 1)
        if spacing > 0:
            position = (levels.detach().cpu().double() - self.first) / spacing
            deviation = float((position - torch.arange(n, dtype=torch.float64)).abs().max())
            # Bound on the error of (x - first) / spacing in this dtype, in units of spacing.
            rounding = 4 * n * torch.finfo(levels.dtype).eps
            if deviation + rounding < 0.25:
                self.grid = (self.first, 1.0 / spacing)


def nearest_level(x: torch.Tensor, table: LevelTable, use_grid: bool = True) -> torch.Tensor:
    """Nearest level of ``table`` to each element of ``x``, in the table's dtype.

    Inner helper (no checks, no autograd). Exact ties go to the lower level; NaN stays NaN; values
    beyond the ends (infinities included) map to the end levels. Memory: a handful of buffers the
    size of ``x``, whatever the number of levels.

    The pair of levels around each value is found arithmetically for evenly spaced levels (where
    ``table.grid`` says it is safe) and by a branchless binary search otherwise (``use_grid=False``
    forces the search). ``torch.bucketize`` would do the search too, several times slower on CPU.
    """
    levels = table.values
    n = levels.numel()
    shape = x.shape
    # Clamping first makes every later value finite (NaN aside) and sends values beyond the ends
    # to the end levels.
    work = torch.clamp(x.reshape(-1).to(levels.dtype), table.first, table.last)
    index_dtype = torch.int32 if n <= 2**30 else torch.int64
    index = torch.empty(work.shape, dtype=index_dtype, device=work.device)
    lower = torch.empty_like(work)
    upper = torch.empty_like(work)
    flag = torch.empty(work.shape, dtype=torch.bool, device=work.device)
    if use_grid and table.grid is not None:
        # index = floor((x - first) / spacing): the bracketing pair, or a pair that holds a level
        # within a quarter spacing of x, which is then the nearest (see LevelTable).
        origin, inverse_spacing = table.grid
        torch.sub(work, origin, out=lower).mul_(inverse_spacing).floor_()
        lower.nan_to_num_(0.0).clamp_(0, n - 2)
        index.copy_(lower)
    else:
        # Afterwards index = #{levels < x} (at most n - 1, x being clamped to the last level);
        # each step is one gather and one comparison into the buffers above.
        probe = torch.empty_like(index)
        index.zero_()
        step = n // 2
        while step >= 1:
            torch.add(index, step - 1, out=probe)
            torch.index_select(levels, 0, probe, out=lower)
            torch.lt(lower, work, out=flag)
            index.add_(flag.view(torch.uint8), alpha=step)
            step //= 2
        index.sub_(1).clamp_(min=0)
    # The nearest level is levels[index] or levels[index + 1]. Compare the two distances as
    # snntorch does (|level - x| in the compute dtype); an exact tie keeps the lower level.
    torch.index_select(levels, 0, index, out=lower)
    torch.index_select(table.next_values, 0, index, out=upper)
    lower.sub_(work).abs_()
    upper.sub_(work).abs_()
    torch.lt(upper, lower, out=flag)
    index.add_(flag.view(torch.uint8))  # adding the uint8 view avoids a converted copy
    out = levels.index_select(0, index)
    # x - x is 0, or NaN where x is NaN.
    out.add_(torch.sub(work, work, out=lower))
    return out.reshape(shape)


class _NearestLevelSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, table):
        return nearest_level(x, table).to(x.dtype)

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
        self.num_bits = check_bit_width(num_bits, "num_bits", fn=fn)
        if self.num_bits > STATE_QUANT_MAX_BITS:
            raise ValueError(
                f"{fn}: num_bits={self.num_bits} is above the limit of {STATE_QUANT_MAX_BITS} bits "
                f"(STATE_QUANT_MAX_BITS): the level set is a table of 2**num_bits values; for wider "
                f"membranes use a uniform grid (snnquant.nn.UniformQuantizer or lsq_quantize)"
            )
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
            try:
                values = _exponential_levels(num_levels, multiplier, min_val, max_val, centre)
            except OverflowError:
                values = None
            if values is None or not all(math.isfinite(v) for v in values):
                raise ValueError(
                    f"{fn}: multiplier={multiplier!r} raised to the power of up to "
                    f"2**num_bits={num_levels} overflows a float; use a multiplier <= 1 or fewer "
                    f"bits"
                )
            self.levels = torch.tensor(values, dtype=torch.float64)
            self._float32_levels = self.levels.to(torch.float32)
        # snntorch's running sums can overshoot the centre by a rounding error (for example at 12
        # bits with thr_centered=False), leaving its list slightly out of order; its argmin does
        # not care, the search here needs sorted levels.
        self.levels = torch.sort(self.levels, stable=True).values
        self._float32_levels = torch.sort(self._float32_levels, stable=True).values
        self._tables = {}

    def levels_for(self, dtype: torch.dtype, device=None) -> torch.Tensor:
        """The level table that inputs of ``dtype`` are compared with, on ``device``.

        float64 inputs use :attr:`levels`; float32, float16 and bfloat16 inputs use float32 levels
        computed as snntorch computes them (uniform levels by ``torch.linspace`` in float32, which
        may differ from ``levels.float()`` by one ulp), and the chosen level is cast to the input's
        dtype.
        """
        return self._table(dtype, device).values

    def _table(self, dtype, device) -> LevelTable:
        device = torch.device("cpu") if device is None else torch.device(device)
        table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        key = (table_dtype, device)
        table = self._tables.get(key)
        if table is None:
            source = self.levels if table_dtype == torch.float64 else self._float32_levels
            table = LevelTable(source.to(device))
            self._tables[key] = table
        return table

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Quantize ``x`` to the nearest level (straight-through gradient)."""
        x = as_tensor_input(x)
        check_float_tensor("state_quant", x)
        return _NearestLevelSTE.apply(x, self._table(x.dtype, x.device))

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

    * Memory is O(n) in the input size (a binary search on the sorted levels) instead of
      snntorch's ``[n, levels]`` broadcast (1 GiB for :math:`2^{20}` float32 values at 8 bits).
    * :math:`+\infty`, and finite values so large that snntorch's float distances all round to the
      same number, map to the highest level; snntorch maps them to the lowest. NaN stays NaN
      (snntorch returns the lowest level).
    * float64 input is compared with float64 levels and returns float64 (snntorch returns float32
      levels); float16/bfloat16 input is compared with the float32 levels and the result cast back
      to the input dtype.

    Exact ties go to the lower level, as snntorch's ``argmin`` (first index) does.

    Args:
        num_bits: Bits per state, an int in ``[1, 20]`` (:data:`STATE_QUANT_MAX_BITS`); the table
            has :math:`2^{\text{num\_bits}}` float64 entries (8 MiB at 20 bits).
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
        ValueError: ``num_bits`` not an int in ``[1, 20]`` (the message names the argument, the
            value and the limit), a non-finite or non-positive ``threshold``, an empty range, a
            ``multiplier`` whose powers overflow, or arguments for which snntorch's construction
            divides by zero.
    """
    return StateQuantizer(num_bits, uniform, thr_centered, threshold, lower_limit, upper_limit,
                          multiplier)
