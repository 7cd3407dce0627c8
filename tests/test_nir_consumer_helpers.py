"""The NIR consumer workarounds as public helpers (issue 35 §7): shift_flatten_dims and the
membrane-register check that makes to_nir warn where a consumer (Lava) holds less than a grid."""
import warnings

import pytest
import torch

from _nir_consumers import build_network

from snnquant.export import (ConsumerRegisterWarning, narrow_registers, shift_flatten_dims,
                             to_nir)
from snnquant.export.backends.nir_consumers import CONSUMER_REGISTERS


def test_shift_flatten_dims_keeps_the_batch():
    m = torch.nn.Sequential(torch.nn.Flatten(0), torch.nn.Flatten(1, -1), torch.nn.Flatten(-2))
    assert shift_flatten_dims(m) is m
    assert [(f.start_dim, f.end_dim) for f in m] == [(1, -1), (2, -1), (-2, -1)]
    one = shift_flatten_dims(torch.nn.Sequential(torch.nn.Flatten(0)))
    assert one(torch.zeros(5, 2, 3, 3)).shape == (5, 18)
    with pytest.raises(TypeError, match="module must be an nn.Module.*got str"):
        shift_flatten_dims("net")


def test_lava_register_is_narrower_than_the_headroom_grid():
    lava = CONSUMER_REGISTERS["lava"]
    assert (lava.low, lava.high) == (-131072, 131071)
    narrow, _ = build_network("mlp", "lif", 4, 0, v_bits=12)
    assert narrow_registers(narrow) == []
    wide, shape = build_network("mlp", "lif", 4, 0, v_bits=14, headroom_bits=6)
    lines = narrow_registers(wide)
    assert len(lines) == 2 and lines[0].startswith("lava: layer '1' has the 20-bit grid "
                                                   "[-524288, 524287], wider than "
                                                   "[-131072, 131071], what Lava")
    with pytest.warns(ConsumerRegisterWarning, match=r"lava: layer '1' has the 20-bit grid"):
        to_nir(wide, shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConsumerRegisterWarning)
        to_nir(wide, shape, consumers=())
        to_nir(narrow, shape)
    with pytest.raises(ValueError, match=r"consumers must name consumers of \['lava'\], got "
                                         r"\['loihi3'\]"):
        to_nir(wide, shape, consumers=["loihi3"])
