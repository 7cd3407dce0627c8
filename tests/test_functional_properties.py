"""Property tests (hypothesis): outputs lie on the quantization grid and in range, quantizing twice
equals quantizing once, and the forward is monotone non-decreasing."""

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from snnquant import functional as Q  # noqa: E402

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)

values = st.lists(
    st.floats(min_value=-40.0, max_value=40.0, allow_nan=False, width=64), min_size=1, max_size=24
)
unit_values = st.lists(
    st.floats(min_value=0.0, max_value=1.0, allow_nan=False, width=64), min_size=1, max_size=24
)

_STATE_QUANTIZERS = {}


def _state_quantizer(config):
    if config not in _STATE_QUANTIZERS:
        num_bits, uniform, thr_centered = config
        _STATE_QUANTIZERS[config] = Q.state_quant(num_bits, uniform, thr_centered, threshold=1.5)
    return _STATE_QUANTIZERS[config]


def _tensor(data):
    return torch.tensor(data, dtype=torch.float64)


def _check_common(fn, x, grid_index, low, high):
    """grid_index(y) gives the grid coordinate of y (an integer for values on the grid)."""
    y = fn(x)
    index = grid_index(y)
    assert torch.allclose(index, torch.round(index), rtol=0, atol=1e-9), "off the grid"
    assert (y >= low).all() and (y <= high).all(), "out of range"
    assert torch.equal(fn(y), y), "quantizing twice differs from once"
    ordered = fn(torch.sort(x).values)
    assert (ordered[1:] >= ordered[:-1]).all(), "not monotone"


@SETTINGS
@given(values, st.sampled_from([0.1, 0.25, 1.0, 3.0]))
def test_step_quantize_properties(data, step):
    x = _tensor(data)
    _check_common(lambda t: Q.step_quantize(t, step), x, lambda y: y / step, -41.0 - step, 41.0 + step)


@SETTINGS
@given(values, st.sampled_from([Q.round, Q.ceil, Q.floor, Q.pass_round, Q.soft_round, Q.round_through]))
def test_integer_rounding_properties(data, fn):
    x = _tensor(data)
    _check_common(fn, x, lambda y: y, -41.0, 41.0)


@SETTINGS
@given(unit_values, st.integers(min_value=1, max_value=8))
def test_k_bit_quantize_properties(data, k):
    x = _tensor(data)
    levels = 2**k - 1
    _check_common(lambda t: Q.k_bit_quantize(t, k), x, lambda y: y * levels, 0.0, 1.0)


@SETTINGS
@given(
    values,
    st.integers(min_value=1, max_value=8),
    st.integers(min_value=-2, max_value=3),
    st.booleans(),
    st.booleans(),
)
def test_quantized_bits_properties(data, bits, integer, symmetric, keep_negative):
    x = _tensor(data)
    unsigned_bits = bits - int(keep_negative)
    m = 2.0**unsigned_bits
    m_i = 2.0**integer
    if unsigned_bits == 0:
        low, high, index = -1.0, 1.0, lambda y: y
    else:
        low = int(keep_negative) * (-m + int(symmetric)) * m_i / m
        high = (m - 1) * m_i / m
        index = lambda y: y * m / m_i  # noqa: E731
    fn = lambda t: Q.quantized_bits(t, bits, integer, symmetric, keep_negative)  # noqa: E731
    _check_common(fn, x, index, low, high)


@SETTINGS
@given(
    values,
    st.sampled_from([0.05, 0.5, 2.0]),
    st.sampled_from([(-8, 7), (0, 15), (-1, 1), (-128, 127)]),
)
def test_lsq_quantize_properties(data, step, bounds):
    x = _tensor(data)
    qmin, qmax = bounds
    fn = lambda t: Q.lsq_quantize(t, step, qmin, qmax)  # noqa: E731
    _check_common(fn, x, lambda y: y / step, qmin * step, qmax * step)


@SETTINGS
@given(values, st.integers(min_value=0, max_value=6))
def test_multi_level_spike_count_properties(data, max_count):
    x = _tensor(data)
    fn = lambda t: Q.multi_level_spike_count(t, max_count)  # noqa: E731
    _check_common(fn, x, lambda y: y, 0.0, float(max_count))


@SETTINGS
@given(values, st.sampled_from([(2, True, True), (4, False, True), (6, False, False), (8, True, True)]))
def test_state_quant_properties(data, config):
    quantizer = _state_quantizer(config)
    x = _tensor(data)
    y = quantizer(x)
    assert torch.isin(y, quantizer.levels).all()
    lowest, highest = quantizer.levels[0], quantizer.levels[-1]
    _check_common(quantizer, x, lambda t: torch.zeros_like(t), lowest, highest)


@SETTINGS
@given(values, st.integers(min_value=-1, max_value=3))
def test_round_decimals_properties(data, decimals):
    x = _tensor(data)
    fn = lambda t: Q.round_decimals(t, decimals)  # noqa: E731
    _check_common(fn, x, lambda y: y * 10.0**decimals, -50.0, 50.0)


@SETTINGS
@given(values, st.floats(min_value=-5, max_value=5), st.floats(min_value=0, max_value=5))
def test_clamp_properties(data, low, width):
    x = _tensor(data)
    high = low + width
    fn = lambda t: Q.clamp(t, low, high)  # noqa: E731
    _check_common(fn, x, lambda y: torch.zeros_like(y), low, high)


@SETTINGS
@given(values, st.sampled_from([0.25, 1.0]), st.integers(min_value=0, max_value=2**31 - 1))
def test_stochastic_round_properties(data, step, seed):
    x = _tensor(data)
    y = Q.stochastic_round(x, step, torch.Generator().manual_seed(seed))
    low = torch.floor(x / step) * step
    assert ((y == low) | (y == low + step)).all()
    assert torch.equal(Q.stochastic_round(y, step, torch.Generator().manual_seed(seed + 1)), y)


@SETTINGS
@given(values, st.sampled_from([0.5, 3.0, 20.0]))
def test_smooth_round_is_monotone_and_stays_within_half_a_step(data, alpha):
    x = torch.sort(_tensor(data)).values
    y = Q.smooth_round(x, alpha)
    assert (y[1:] >= y[:-1]).all()
    assert ((y - torch.round(x)).abs() <= 0.5 + 1e-12).all()


@SETTINGS
@given(values)
def test_clamp_by_linear_range_and_order(data):
    x = _tensor(data)
    y = Q.clamp_by_linear(x)
    assert (y >= 0).all() and (y < 1).all()
    order = torch.argsort(x)
    assert (y[order][1:] >= y[order][:-1]).all()
