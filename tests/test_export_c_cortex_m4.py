"""The C model cross-compiled for a Cortex-M4 (issue 46 §4): every network of the model zoo the C
tests build, at 1, 2, 4 and 8-bit weights, event-driven and dense, compiles with
``arm-none-eabi-gcc`` for a Cortex-M4 with hardware float under the host tests' strict flags
(``-std=c99 -Wall -Wextra -Werror -pedantic``) at ``-O2``, and ``arm-none-eabi-size`` reports
its sections: the constants are in flash (text), and the model keeps no mutable global (data and
bss 0: its state is the caller's ``<name>_state``).

Marked ``cross`` (not in the README's test command); ``.ci/run`` installs Debian's
``gcc-arm-none-eabi`` and ``libnewlib-arm-none-eabi`` where it can and runs
``python -m pytest -q -rs -m cross tests/test_export_c_cortex_m4.py``. Without the cross compiler
every case skips, saying so."""
import pytest

from conftest import load_script
from snnquant.export import c_memory, to_c
from test_export_c_packed import ZOO_BITS, _graph_desc, _transformer_desc


def cross_tools():
    """``(arm-none-eabi-gcc, arm-none-eabi-size)`` and the benchmark module whose flags and
    size reading the footprint table uses too; skips the test, saying what is missing and how
    to install it, where either tool is absent."""
    bench = load_script("benchmarks/bench_c_runtime.py")
    tools = bench.cortex_m4_tools()
    if tools is None:
        pytest.skip(f"no Cortex-M4 cross compiler ({bench.CROSS_CC} or {bench.CROSS_SIZE} not on "
                    f"PATH; Debian: apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi)")
    return tools, bench


def test_cortex_m4_flags_are_the_host_tests_strict_ones():
    """The cross compile uses the strict flags the host C tests compile with, at -O2."""
    from test_export_c import STRICT
    flags = load_script("benchmarks/bench_c_runtime.py").CORTEX_M4_CFLAGS
    assert set(STRICT) <= set(flags) and "-O2" in flags and "-mcpu=cortex-m4" in flags


@pytest.mark.cross
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("family,name,bits", ZOO_BITS)
def test_zoo_network_cross_compiles_for_cortex_m4(family, name, bits, tmp_path, record_property):
    """Each zoo network at each bit width, in both synapse forms: a Cortex-M4 object without a
    warning, whose flash (text) holds at least the model's constants (``c_memory``'s ROM) and
    which has no data or bss of its own."""
    tools, bench = cross_tools()
    desc, _, shape = (_graph_desc if family == "graph" else _transformer_desc)(name, bits)
    for synapses in ("events", "dense"):
        _, source = to_c(desc, tmp_path / synapses, "snn", input_shape=shape, synapses=synapses)
        sizes = bench.cortex_m4_sizes(source, tmp_path / synapses / "snn.o", tools)
        mem = c_memory(desc, shape, synapses=synapses)
        record_property(f"cortex_m4_{synapses}", dict(sizes, rom_bytes=mem.rom_bytes,
                                                      ram_bytes=mem.ram_bytes))
        assert sizes["text"] >= mem.rom_bytes, (synapses, sizes, mem.rom_bytes)
        assert sizes["data"] == 0 and sizes["bss"] == 0, (synapses, sizes)
