"""benchmarks/chip_kernels.py runs end to end at a tiny size: both backends give the same outputs
on every chip's network, and the files are written."""
import json

from conftest import load_script

from _repo import needs

pytestmark = needs("benchmarks")


def test_quick_run_writes_equal_outputs(tmp_path):
    bench = load_script("benchmarks/chip_kernels.py", "bench_chip_kernels")
    assert bench.main(["--batch", "2", "--runs", "1", "--repeats", "1", "--warmup", "0",
                       "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "chip_kernels.json").read_text())
    assert set(result["rows"]) == {"xylo", "loihi", "speck"}
    assert all(row["outputs_equal"] for row in result["rows"].values())
    assert (tmp_path / "chip_kernels_table.rst").read_text().count("* - ") == 4
