"""state_quant: same levels and outputs as snntorch.functional.quant.state_quant, O(n) memory,
correct handling of infinities and NaN, straight-through gradient."""

import itertools

import pytest
import torch

from snnquant import functional as Q

snn_quant = pytest.importorskip("snntorch.functional.quant")

CONFIGS = list(
    itertools.product(
        [1, 2, 3, 4, 6, 8],  # num_bits
        [True, False],  # uniform
        [True, False],  # thr_centered
        [(1, 0, 0.2), (5.0, 0.0, 0.2), (1.0, 0.3, 0.1), (0.7, 0.1, 0.5)],  # threshold, lower, upper
    )
)


def _snntorch_levels(quantizer):
    """The level tensor captured by snntorch's returned closure."""
    cells = [c.cell_contents for c in quantizer.__closure__]
    (levels,) = [c for c in cells if isinstance(c, torch.Tensor)]
    return levels


def _inputs(levels32, threshold, seed):
    gen = torch.Generator().manual_seed(seed)
    random = torch.randn(2000, generator=gen) * threshold * 2
    midpoints = (levels32[1:] + levels32[:-1]) / 2  # ties, exact in float32 for most pairs
    return torch.cat([random, midpoints, levels32, levels32 + 1e-3, levels32 - 1e-3])


@pytest.mark.parametrize("num_bits,uniform,thr_centered,limits", CONFIGS)
def test_same_levels_and_outputs_as_snntorch(num_bits, uniform, thr_centered, limits):
    threshold, lower, upper = limits
    reference = snn_quant.state_quant(num_bits, uniform, thr_centered, threshold, lower, upper)
    ours = Q.state_quant(num_bits, uniform, thr_centered, threshold, lower, upper)
    assert isinstance(ours, Q.StateQuantizer)

    their_levels = torch.sort(_snntorch_levels(reference)).values
    assert their_levels.dtype == torch.float32
    assert torch.equal(ours.levels_for(torch.float32), their_levels)
    assert ours.levels.dtype == torch.float64 and ours.levels.numel() == 2**num_bits
    assert torch.all(ours.levels[1:] >= ours.levels[:-1])
    # The float64 levels are the same values (snntorch's float32 ones up to float32 rounding).
    span = float(their_levels[-1] - their_levels[0])
    torch.testing.assert_close(ours.levels.float(), their_levels, rtol=0, atol=1e-6 * span)

    x = _inputs(their_levels, threshold, seed=num_bits)
    assert torch.equal(ours(x), reference(x))
    for dtype in (torch.float16, torch.bfloat16):
        y = ours(x.to(dtype))
        assert y.dtype == dtype
        assert torch.equal(y, reference(x.to(dtype)).to(dtype))


def test_float64_input_uses_float64_levels():
    quantizer = Q.state_quant(num_bits=8)
    x = torch.randn(500, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = quantizer(x)
    assert y.dtype == torch.float64
    levels = quantizer.levels
    nearest = levels[(levels[None, :] - x[:, None]).abs().argmin(dim=1)]
    assert torch.equal(y, nearest)
    assert torch.isin(y, levels).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_exact_ties_go_to_the_lower_level(dtype):
    quantizer = Q.state_quant(num_bits=6, threshold=1.0, lower_limit=0.5, upper_limit=0.3)
    levels = quantizer.levels_for(dtype)
    x = (levels[1:] + levels[:-1]) / 2
    tie = (levels[:-1] - x).abs() == (levels[1:] - x).abs()
    assert tie.sum() >= 10  # most midpoints are exact ties in this dtype
    y = quantizer(x.to(dtype))
    assert torch.equal(y[tie], levels[:-1][tie])
    assert torch.equal(y[~tie], torch.where(
        (levels[:-1] - x).abs() < (levels[1:] - x).abs(), levels[:-1], levels[1:])[~tie])


def test_infinities_and_nan():
    quantizer = Q.state_quant(num_bits=4)
    x = torch.tensor([float("inf"), float("-inf"), float("nan"), 1e30, -1e30])
    y = quantizer(x)
    top, bottom = quantizer.levels_for(torch.float32)[[-1, 0]]
    assert y[0] == top and y[1] == bottom and torch.isnan(y[2])
    assert y[3] == top and y[4] == bottom
    # snntorch maps +inf (and +1e30, whose distances all round alike) to the lowest level.
    reference = snn_quant.state_quant(num_bits=4)
    assert reference(x[:1]) == bottom


def test_clustered_levels_choose_the_true_nearest():
    # With upper_limit=0 snntorch's exponential levels pile up just below the threshold, closer
    # together than float32 distances can tell apart: snntorch then takes the first (lowest) of the
    # apparently equal ones; we take the truly nearest.
    quantizer = Q.state_quant(num_bits=10, uniform=False, threshold=2, lower_limit=0.5, upper_limit=0)
    x = torch.tensor([5.559, 1.9999999])
    levels = quantizer.levels_for(torch.float32)
    exact = levels.double()
    nearest = exact[(exact[None, :] - x.double()[:, None]).abs().argmin(dim=1)].float()
    assert torch.equal(quantizer(x), nearest)


def test_gradient_is_straight_through():
    quantizer = Q.state_quant(num_bits=3, uniform=False)
    x = torch.tensor([-5.0, -0.2, 0.9, 1.0, 7.0], requires_grad=True)
    upstream = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    quantizer(x).backward(upstream)
    assert torch.equal(x.grad, upstream)


def test_idempotent_and_on_levels():
    quantizer = Q.state_quant(num_bits=5, uniform=False, thr_centered=False)
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1)) * 2
    y = quantizer(x)
    assert torch.equal(quantizer(y), y)
    assert torch.isin(y, quantizer.levels_for(torch.float32)).all()


def _status_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def test_memory_is_linear_in_the_input():
    # snntorch broadcasts to [n, levels]: 256 MiB here (2**16 float32 values, 1024 levels). The
    # binary search needs a few n-sized buffers (under 2 MiB). Peak resident memory is read from
    # the kernel after resetting its high-water mark.
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        _status_kib("VmHWM")
    except OSError as error:
        pytest.skip(f"needs Linux's /proc/self/clear_refs to measure peak memory: {error}")
    quantizer = Q.state_quant(num_bits=10)
    x = torch.randn(1 << 16)
    quantizer(x)  # warm the level-table cache and the allocator
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    before = _status_kib("VmRSS")
    quantizer(x)
    peak_extra = (_status_kib("VmHWM") - before) * 1024
    assert peak_extra < 32 * 2**20


def test_repr_and_attributes():
    quantizer = Q.state_quant(num_bits=4, uniform=False, threshold=2.0)
    assert quantizer.num_bits == 4 and quantizer.uniform is False and quantizer.threshold == 2.0
    assert quantizer.multiplier == 0.5  # snntorch's default at 4 bits
    assert "num_bits=4" in repr(quantizer) and "multiplier=0.5" in repr(quantizer)
    assert Q.state_quant(num_bits=12, uniform=False, thr_centered=False).levels.numel() == 4096


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("num_bits", [1, 3, 8, 12])
def test_arithmetic_bracketing_equals_binary_search(num_bits, dtype):
    from snnquant.functional.state import nearest_level

    quantizer = Q.state_quant(num_bits=num_bits, threshold=1.3, lower_limit=0.1, upper_limit=0.4)
    table = quantizer._table(dtype, "cpu")
    assert table.grid is not None  # evenly spaced levels take the arithmetic path
    levels = table.values
    gen = torch.Generator().manual_seed(num_bits)
    spacing = float(levels[1] - levels[0])
    x = torch.cat(
        [
            torch.randn(3000, generator=gen, dtype=dtype) * 1.5,
            (levels[1:] + levels[:-1]) / 2,  # ties
            levels,
            torch.nextafter(levels, torch.full_like(levels, 10.0)),
            torch.nextafter(levels, torch.full_like(levels, -10.0)),
            levels + spacing * 0.4999,
            torch.tensor([float("inf"), float("-inf"), float("nan")], dtype=dtype),
        ]
    )
    fast = nearest_level(x, table)
    searched = nearest_level(x, table, use_grid=False)
    torch.testing.assert_close(fast, searched, rtol=0, atol=0, equal_nan=True)
    # Same as the exact nearest level (ties to the lower one), by brute force in chunks.
    exact = levels.double()
    finite = torch.isfinite(x)
    for values, chosen in zip(x[finite].double().split(512), fast[finite].double().split(512)):
        distance = (exact[None, :] - values[:, None]).abs()
        best = distance.min(dim=1, keepdim=True).values
        assert torch.equal(chosen, exact[(distance == best).int().argmax(dim=1)])


def test_non_uniform_levels_use_the_binary_search():
    quantizer = Q.state_quant(num_bits=6, uniform=False)
    assert quantizer._table(torch.float32, "cpu").grid is None
