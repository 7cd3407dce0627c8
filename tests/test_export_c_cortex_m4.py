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
import shutil
import subprocess

import pytest

from snnquant.export import c_memory, to_c
from test_export_c import STRICT
from test_export_c_packed import ZOO_BITS, _graph_desc, _transformer_desc

#: the Cortex-M4 with its single-precision FPU, hard-float calling convention, Thumb-2
CORTEX_M4 = ["-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv4-sp-d16"]
CROSS_CC, CROSS_SIZE = "arm-none-eabi-gcc", "arm-none-eabi-size"


def cross_tools():
    """The paths of ``arm-none-eabi-gcc`` and ``arm-none-eabi-size``; skips the test, saying
    what is missing and how to install it, where either is absent."""
    cc, size = shutil.which(CROSS_CC), shutil.which(CROSS_SIZE)
    if cc is None or size is None:
        pytest.skip(f"no Cortex-M4 cross compiler ({CROSS_CC if cc is None else CROSS_SIZE} not "
                    f"on PATH; Debian: apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi)")
    return cc, size


def cortex_m4_sizes(source, obj) -> dict:
    """Compile the C file ``source`` for a Cortex-M4 (strict flags, ``-O2``) into ``obj``;
    return its ``{"text", "data", "bss"}`` bytes as ``arm-none-eabi-size`` reports them. A
    warning fails (``-Werror``) with the compiler's message."""
    cc, size = cross_tools()
    res = subprocess.run([cc, *CORTEX_M4, *STRICT, "-O2", "-c", str(source), "-o", str(obj)],
                         capture_output=True, text=True)
    assert res.returncode == 0 and not res.stderr, res.stderr
    out = subprocess.run([size, str(obj)], capture_output=True, text=True, check=True).stdout
    head, row = out.splitlines()[:2]
    assert head.split()[:3] == ["text", "data", "bss"], out
    text, data, bss = (int(v) for v in row.split()[:3])
    return dict(text=text, data=data, bss=bss)


@pytest.mark.cross
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("family,name,bits", ZOO_BITS)
def test_zoo_network_cross_compiles_for_cortex_m4(family, name, bits, tmp_path, record_property):
    """Each zoo network at each bit width, in both synapse forms: a Cortex-M4 object without a
    warning, whose flash (text) holds at least the model's constants (``c_memory``'s ROM) and
    which has no data or bss of its own."""
    cross_tools()
    desc, _, shape = (_graph_desc if family == "graph" else _transformer_desc)(name, bits)
    for synapses in ("events", "dense"):
        _, source = to_c(desc, tmp_path / synapses, "snn", input_shape=shape, synapses=synapses)
        sizes = cortex_m4_sizes(source, tmp_path / synapses / "snn.o")
        mem = c_memory(desc, shape, synapses=synapses)
        record_property(f"cortex_m4_{synapses}", dict(sizes, rom_bytes=mem.rom_bytes,
                                                      ram_bytes=mem.ram_bytes))
        assert sizes["text"] >= mem.rom_bytes, (synapses, sizes, mem.rom_bytes)
        assert sizes["data"] == 0 and sizes["bss"] == 0, (synapses, sizes)
