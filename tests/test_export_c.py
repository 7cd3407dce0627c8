"""The C runtime (``to_c``): compiled with the machine's C compiler under strict flags, and its
outputs compared with ``IntegerSNN`` step by step, on random and on trained networks."""
import errno
import functools
import os
import pathlib
import re
import shutil
import stat
import subprocess

import numpy as np
import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

from snnquant import QuantConfig, quantize_model
from snnquant.export import (ExportError, SynapseOp, IntegerSNN, c_memory, fold_batchnorm, to_c,
                             to_integer)

from _repo import needs

ROOT = pathlib.Path(__file__).resolve().parents[1]
STRICT = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"]


# ------------------------------------------------------------------------------------------------
# compiling and running

def compiler() -> str:
    """The machine's C compiler; its absence fails the test (deployment is not optional)."""
    for cc in ("cc", "gcc"):
        path = shutil.which(cc)
        if path:
            return path
    pytest.fail("no C compiler (cc or gcc) on PATH: the C runtime cannot be checked")


@functools.lru_cache(maxsize=None)
def sanitizer_flags() -> tuple:
    """``-fsanitize=undefined`` when the compiler can link it: signed overflow then aborts."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / "probe.c"
        src.write_text("int main(void) { return 0; }\n")
        flags = ("-fsanitize=undefined", "-fno-sanitize-recover=all")
        res = subprocess.run([compiler(), *flags, str(src), "-o", str(pathlib.Path(tmp) / "p")],
                             capture_output=True)
        return flags if res.returncode == 0 else ()


DRIVER = r"""
#include <stdio.h>
#include "{name}.h"

/* reads int32 T, N, then N samples x T steps x {NAME}_INPUT_SIZE int32;
 * writes N x T x {NAME}_OUTPUT_SIZE int64 */
int main(int argc, char **argv)
{{
    static {name}_state s;
    static int32_t in[{NAME}_INPUT_SIZE];
    static int64_t out[{NAME}_OUTPUT_SIZE];
    int32_t hdr[2];
    int32_t n, t;
    FILE *fi, *fo;
    if (argc != 3) {{
        return 2;
    }}
    fi = fopen(argv[1], "rb");
    fo = fopen(argv[2], "wb");
    if (fi == NULL || fo == NULL || fread(hdr, sizeof(int32_t), 2, fi) != 2) {{
        return 3;
    }}
    for (n = 0; n < hdr[1]; n++) {{
        {name}_reset(&s);
        for (t = 0; t < hdr[0]; t++) {{
            if (fread(in, sizeof(int32_t), {NAME}_INPUT_SIZE, fi) != {NAME}_INPUT_SIZE) {{
                return 4;
            }}
            {name}_step(&s, in, out);
            fwrite(out, sizeof(int64_t), {NAME}_OUTPUT_SIZE, fo);
        }}
    }}
    fclose(fo);
    fclose(fi);
    return 0;
}}
"""


def build(desc, folder: pathlib.Path, name="snn", input_shape=None, extra=(), synapses="events"):
    """Generate, compile (strict flags) and return the path of the driver program."""
    header, source = to_c(desc, folder, name, input_shape=input_shape, synapses=synapses)
    driver = folder / "driver.c"
    driver.write_text(DRIVER.format(name=name, NAME=name.upper()))
    exe = folder / "driver"
    cmd = [compiler(), *STRICT, "-O1", *sanitizer_flags(), *extra, str(source), str(driver), "-o",
           str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}{res.stderr}"
    assert not res.stderr, res.stderr      # not even a note
    return exe


def run_c(exe: pathlib.Path, x: torch.Tensor) -> torch.Tensor:
    """Run the compiled model on ``x`` ``[T, N, ...]``; returns ``int64`` ``[T, N, OUTPUT_SIZE]``."""
    T, N = x.shape[0], x.shape[1]
    folder = exe.parent
    data = x.to(torch.int32).transpose(0, 1).contiguous().numpy()   # [N, T, ...]
    (folder / "in.bin").write_bytes(np.array([T, N], dtype=np.int32).tobytes() + data.tobytes())
    res = subprocess.run([str(exe), str(folder / "in.bin"), str(folder / "out.bin")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = np.frombuffer((folder / "out.bin").read_bytes(), dtype=np.int64).reshape(N, T, -1)
    return torch.from_numpy(out.copy()).transpose(0, 1)


def assert_same(desc, exe, x):
    """C output equals IntegerSNN's, on every sample and step; returns the agreement (1.0)."""
    ref = IntegerSNN(desc)(x.to(torch.int64))
    ref = ref.reshape(ref.shape[0], ref.shape[1], -1).to(torch.int64)
    got = run_c(exe, x)
    assert got.shape == ref.shape
    same = (got == ref).all(dim=2).all(dim=0)          # per sample, all steps
    assert bool(same.all()), (f"{int((~same).sum())}/{same.numel()} samples differ; first "
                              f"difference at {torch.nonzero(got != ref)[0].tolist()}")
    return float(same.float().mean())


# ------------------------------------------------------------------------------------------------
# random networks through the public path

def make_neuron(cfg):
    v_reset = None if cfg["soft"] else cfg["v_reset"]
    kw = dict(v_threshold=cfg["v_threshold"], v_reset=v_reset, step_mode="m")
    if cfg["kind"] == "if":
        return neuron.IFNode(**kw)
    return neuron.LIFNode(tau=cfg["tau"], decay_input=cfg["decay_input"], **kw)


def random_net(cfg):
    """dense, conv1d/conv2d (stride, groups), pooling of spikes or currents, flatten, spike or
    current readout."""
    torch.manual_seed(cfg["seed"])
    nrn = functools.partial(make_neuron, cfg)
    bias = cfg["bias"]
    if cfg["arch"] == "mlp":
        mods = [layer.Linear(12, 10, bias=bias), nrn()]
        shape, feat = (12,), 10
    elif cfg["arch"] == "conv1d":
        mods = [layer.Conv1d(2, 4, 3, padding=1, stride=cfg["stride"], bias=bias), nrn()]
        length = 8 // cfg["stride"]
        if cfg["pool"] == "max":
            mods.append(layer.MaxPool1d(2))
            length //= 2
        elif cfg["pool"] == "avg":
            mods.append(layer.AvgPool1d(2))
            length //= 2
        mods.append(layer.Flatten())
        shape, feat = (2, 8), 4 * length
    else:
        groups = cfg["groups"]
        mods = [layer.Conv2d(2, 4, 3, padding=1, stride=cfg["stride"], groups=groups, bias=bias)]
        side = 6 // cfg["stride"]
        if cfg["pool"] == "max_current":
            mods += [layer.MaxPool2d(2, ceil_mode=side % 2 == 1), nrn()]
            side = -(-side // 2)
        else:
            mods.append(nrn())
            if cfg["pool"] == "max":
                mods.append(layer.MaxPool2d(3, stride=2, padding=1))
                side = (side - 1) // 2 + 1
            elif cfg["pool"] == "avg":
                mods.append(layer.AvgPool2d(2))
                side //= 2
        mods.append(layer.Flatten())
        shape, feat = (2, 6, 6), 4 * side * side
    mods.append(layer.Linear(feat, 5, bias=bias))
    if cfg["readout"] == "spikes":
        mods.append(nrn())
    net = nn.Sequential(*mods)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)):
                m.weight.mul_(cfg["gain"])
                if m.bias is not None:
                    m.bias.uniform_(-cfg["gain"], cfg["gain"])
    sjf.set_step_mode(net, "m")
    return net, shape


def export(net, cfg, shape, T=4, N=4, train_steps=0):
    q, _ = quantize_model(net, QuantConfig(weight_bits=cfg["weight_bits"], v_bits=cfg["v_bits"],
                                           per_channel=cfg["per_channel"],
                                           bias_bits=cfg["bias_bits"]))
    g = torch.Generator().manual_seed(cfg["seed"])
    x = torch.randint(0, 3, (T, N) + shape, generator=g).float()
    sjf.reset_net(q)
    if train_steps:
        opt = torch.optim.Adam(q.parameters(), lr=5e-3)
        for _ in range(train_steps):
            sjf.reset_net(q)
            loss = q(x).float().pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    else:
        with torch.no_grad():
            q(x)     # the forward pass initialises the quantizers' steps
    q.eval()
    sjf.reset_net(q)
    q = fold_batchnorm(q)
    return to_integer(q, leak_bits=cfg["leak_bits"]), q


config = st.fixed_dictionaries({
    "seed": st.integers(0, 10_000),
    "arch": st.sampled_from(["mlp", "conv", "conv1d"]),
    "kind": st.sampled_from(["if", "lif"]),
    "tau": st.sampled_from([2.0, 4.0, 3.0]),
    "soft": st.booleans(),
    "v_reset": st.sampled_from([0.0, -0.5]),
    "v_threshold": st.sampled_from([1.0, 0.5, 2.0]),
    "decay_input": st.booleans(),
    "bias": st.booleans(),
    "bias_bits": st.sampled_from([None, 8]),
    "pool": st.sampled_from([None, "max", "avg", "max_current"]),
    "stride": st.sampled_from([1, 2]),
    "groups": st.sampled_from([1, 2]),
    "readout": st.sampled_from(["spikes", "current"]),
    "weight_bits": st.integers(2, 8),
    "v_bits": st.integers(4, 16),
    "per_channel": st.booleans(),
    "gain": st.sampled_from([1.0, 3.0, 8.0]),
    "train_steps": st.sampled_from([0, 0, 2]),
    "negative": st.booleans(),
    "synapses": st.sampled_from(["events", "dense"]),
}).map(lambda c: {**c, "leak_bits": 12 if c["kind"] == "lif" and c["tau"] == 3.0 else None,
                  "pool": None if c["arch"] == "mlp" or (c["pool"] == "max_current" and
                                                         c["arch"] != "conv") else c["pool"]})


def sample_input(desc, shape, T, N, seed, negative):
    g = torch.Generator().manual_seed(seed + 1)
    top = min(desc.input_max, 3)
    lo = -top if negative else 0
    return torch.randint(lo, top + 1, (T, N) + shape, generator=g)


@given(cfg=config)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
def test_random_networks_match_integer_snn(cfg, tmp_path_factory):
    net, shape = random_net(cfg)
    try:
        desc, _ = export(net, cfg, shape, train_steps=cfg["train_steps"])
    except ExportError as err:   # a random network the integer export refuses (not C's concern)
        assume(False)  # a random network the integer export refuses: {err}
    if cfg["leak_bits"]:
        assert not desc.exact
    folder = tmp_path_factory.mktemp("c")
    exe = build(desc, folder, input_shape=shape, synapses=cfg["synapses"])
    x = sample_input(desc, shape, 8, 6, cfg["seed"], cfg["negative"])
    assert assert_same(desc, exe, x) == 1.0


# ------------------------------------------------------------------------------------------------
# the example's network, trained

def _example_module():
    import snnquant.cli.train  # the example's code (examples/train_nmnist.py is its thin entry)
    return snnquant.cli.train


def test_trained_example_network_matches_integer_snn(tmp_path):
    """The example's CSNN (conv-BN-LIF, max pooling, linear LIF read-out), trained a few steps,
    folded and exported: the C model equals IntegerSNN on every sample and step."""
    torch.manual_seed(0)
    net = _example_module().build_csnn(channels=4, tau=2.0)
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    g = torch.Generator().manual_seed(0)
    x = (torch.rand((6, 8, 2, 34, 34), generator=g) < 0.15).float() * torch.randint(
        1, 3, (6, 8, 2, 34, 34), generator=g)
    y = torch.arange(8) % 10
    opt = torch.optim.Adam(q.parameters(), lr=1e-2)
    for _ in range(4):
        sjf.reset_net(q)
        loss = nn.functional.mse_loss(q(x).float().mean(0), nn.functional.one_hot(y, 10).float())
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():     # BN statistics of the data (a few steps leave them at their init)
        for m in q.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.reset_running_stats()
                m.momentum = None
        sjf.reset_net(q)
        q(x)
    q.eval()
    sjf.reset_net(q)
    desc = to_integer(fold_batchnorm(q))
    exe = build(desc, tmp_path, name="csnn", input_shape=(2, 34, 34))
    header = (tmp_path / "csnn.h").read_text()
    assert "#define CSNN_INPUT_SIZE 2312" in header and "#define CSNN_OUTPUT_SIZE 10" in header
    x_test = ((torch.rand((8, 16, 2, 34, 34), generator=g) < 0.1).long()
              * torch.randint(1, 3, (8, 16, 2, 34, 34), generator=g))
    assert assert_same(desc, exe, x_test) == 1.0
    dense = build(desc, tmp_path / "dense", name="csnn", input_shape=(2, 34, 34),
                  synapses="dense")
    assert assert_same(desc, dense, x_test) == 1.0
    _, layers = IntegerSNN(desc)(x_test, record=True)
    rates = {k: float(s.float().mean()) for k, s in layers.items()}
    assert all(0 < r < 1 for r in rates.values()), rates   # every layer spikes


# ------------------------------------------------------------------------------------------------
# the generated code and the API

def _mlp_desc(**over):
    cfg = dict(seed=3, arch="mlp", kind="lif", tau=2.0, soft=False, v_reset=0.0, v_threshold=1.0,
               decay_input=True, bias=True, bias_bits=8, pool=None, stride=1, groups=1,
               readout="spikes", weight_bits=4, v_bits=8, per_channel=True, gain=3.0,
               leak_bits=None)
    cfg.update(over)
    net, shape = random_net(cfg)
    return export(net, cfg, shape)[0]


def test_generated_code_is_plain_integer_c99(tmp_path):
    desc = _mlp_desc(weight_bits=4, readout="current")
    header, source = to_c(desc, tmp_path / "new", "net0")
    assert (header, source) == (tmp_path / "new" / "net0.h", tmp_path / "new" / "net0.c")
    h, c = header.read_text(), source.read_text()
    code = h + c
    assert set(re.findall(r"#include\s*[<\"]([^>\"]+)", code)) == {"stdint.h", "string.h", "net0.h"}
    for word in ("float", "double", "malloc", "free", "calloc", "math.h", "stdio.h"):
        assert not re.search(rf"\b{re.escape(word)}\b", code), word
    # weights: static const arrays, 4-bit weights packed two to a byte (issue 46)
    assert re.search(r"static const uint8_t net0_w0\[60\]", c)
    assert re.search(r"static const uint8_t net0_w2\[25\]", c)
    # the event-driven default reads a column of 5 (off a byte) gathered into a 64-bit word, the
    # dense form each weight through the unpacking function
    assert "*src = net0_w2 + (bit0 >> 3);" in c and "net0_unpack4" not in c
    _, dense = to_c(desc, tmp_path / "dense", "net0", synapses="dense")
    assert "static int32_t net0_unpack4(const uint8_t *w, int32_t k)" in dense.read_text()
    for api in ("#define NET0_INPUT_SIZE 12", "#define NET0_OUTPUT_SIZE 5", "NET0_ROM_BYTES",
                "NET0_RAM_BYTES", "} net0_state;", "void net0_reset(net0_state *s);",
                "void net0_step(net0_state *s, const int32_t *input, int64_t *output);"):
        assert api in h, api
    mem = c_memory(desc)
    assert f"#define NET0_ROM_BYTES {mem.rom_bytes}\n" in h
    assert f"#define NET0_RAM_BYTES {mem.ram_bytes}\n" in h
    # ROM: (120 + 50) / 2 bytes of weights, 10 + 5 biases (8-bit bias quantizer) + per-channel
    # rescale
    assert mem.rom_bytes >= 60 + 25 + 10 + 5
    assert mem.state_bytes == 10    # one int8 membrane per neuron of the hidden layer
    assert (mem.input_size, mem.output_size) == (12, 5)


def test_event_driven_sums_are_counted_in_ram(tmp_path):
    desc = _mlp_desc(arch="conv", pool="max")
    events = c_memory(desc, (2, 6, 6))
    dense = c_memory(desc, (2, 6, 6), synapses="dense")
    assert dense.scratch_bytes == 0 and events.scratch_bytes > 0
    assert events.ram_bytes == dense.ram_bytes + events.scratch_bytes + events.list_bytes
    assert dense.list_bytes == 0 and events.list_bytes == 0    # the pool reads the spikes
    assert events.rom_bytes == dense.rom_bytes
    header, source = to_c(desc, tmp_path, input_shape=(2, 6, 6))
    assert f"#define SNN_RAM_BYTES {events.ram_bytes}\n" in header.read_text()
    assert "} scratch;" in header.read_text()
    with pytest.raises(ValueError, match=r"synapses must be one of \('events', 'dense'\), got "
                                         r"'sparse'"):
        to_c(desc, tmp_path / "x", input_shape=(2, 6, 6), synapses="sparse")
    assert not (tmp_path / "x").exists()


def test_c_rounding_helper_matches_round_half_even_shift(tmp_path):
    """The C reading of the 'rhe' opcode equals round_half_even_shift (ties to even) on ties,
    negatives and the ends of the range it is used on (|d| < 2^62, 1 <= k <= 61)."""
    from snnquant.export import round_half_even_shift
    from snnquant.export.ir.program import c_rhe_helper

    cases = []
    for k in (1, 2, 3, 7, 20, 40, 61):
        half = 1 << (k - 1)
        for base in (0, 1, 2, 3, 5, -1, -2, -3, -5, 1000, -1000, (1 << 61) >> k, -((1 << 61) >> k)):
            for extra in (-half - 1, -half, -half + 1, -1, 0, 1, half - 1, half, half + 1):
                d = (base << k) + extra
                if abs(d) < (1 << 62):
                    cases.append((d, k))
    cases += [((1 << 62) - 1, 61), (-(1 << 62) + 1, 61), ((1 << 62) - 1, 1), (-(1 << 62) + 1, 1)]
    table = ",\n".join(f"    {{INT64_C({d}), {k}}}" for d, k in cases)
    (tmp_path / "rhe.c").write_text(f"""#include <stdint.h>
#include <stdio.h>
{c_rhe_helper("t")}
static const struct {{ int64_t d; int k; }} cases[] = {{
{table}
}};
int main(void)
{{
    unsigned i;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {{
        printf("%lld\\n", (long long)t_rhe(cases[i].d, cases[i].k));
    }}
    return 0;
}}
""")
    exe = tmp_path / "rhe"
    res = subprocess.run([compiler(), *STRICT, *sanitizer_flags(), str(tmp_path / "rhe.c"), "-o",
                          str(exe)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    assert [int(v) for v in out] == [round_half_even_shift(d, k) for d, k in cases]


def test_ram_bytes_is_sizeof_state(tmp_path):
    """The C file refuses to compile when sizeof(state) != RAM_BYTES; check the check works."""
    desc = _mlp_desc()
    header, source = to_c(desc, tmp_path)
    ok = subprocess.run([compiler(), *STRICT, "-c", str(source), "-o", str(tmp_path / "a.o")],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    ram = c_memory(desc).ram_bytes
    header.write_text(header.read_text().replace(f"RAM_BYTES {ram}", f"RAM_BYTES {ram + 8}"))
    bad = subprocess.run([compiler(), *STRICT, "-c", str(source), "-o", str(tmp_path / "b.o")],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "ram_bytes_check" in bad.stderr


def test_current_readout_and_fixed_point_leak(tmp_path):
    desc = _mlp_desc(readout="current", tau=3.0, leak_bits=10, gain=8.0)
    assert desc.output_kind == "current" and not desc.exact
    assert desc.layer("1").leak_multiplier != 1 and desc.layer("1").leak_round_shift > 0
    exe = build(desc, tmp_path)
    x = sample_input(desc, (12,), 10, 8, 0, negative=True)
    assert assert_same(desc, exe, x) == 1.0
    assert int(IntegerSNN(desc)(x).abs().max()) > 1     # currents, not spikes


def test_arguments_are_checked(tmp_path):
    desc = _mlp_desc()
    with pytest.raises(TypeError, match="desc must be an IntegerNetwork"):
        to_c("net", tmp_path)
    for bad in ("1net", "my-net", "int", "", None):
        with pytest.raises(ValueError, match="name must"):
            to_c(desc, tmp_path, bad)
    with pytest.raises(ValueError, match=r"input_shape=\(13,\) does not fit operation 0 \('0'\)"):
        to_c(desc, tmp_path, input_shape=(13,))
    with pytest.raises(ValueError, match="input_shape must be"):
        to_c(desc, tmp_path, input_shape=(0,))
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="out_dir=.*not a folder"):
        to_c(desc, tmp_path / "file")
    conv = _mlp_desc(arch="conv", pool="max")
    with pytest.raises(ValueError, match=r"input_shape is required.*SynapseOp '0'"):
        to_c(conv, tmp_path)
    assert not list(tmp_path.glob("snn.*"))


@pytest.mark.parametrize("name", ["stdint", "string", "math", "String", "STDIO", "unistd",
                                  "pthread", "time"])
def test_a_name_that_would_hide_a_system_header_is_refused(tmp_path, name):
    """Issue 35 §4: ``to_c(..., name='stdint')`` wrote ``stdint.h``, which hides the system
    header under ``-I<dir>`` (``unknown type name 'uint8_t'``), also for case-insensitive file
    systems."""
    from snnquant.export.backends.c_runtime import C_HEADER_NAMES, check_c_name
    with pytest.raises(ValueError, match=rf"name must not be a standard C or POSIX header name, "
                                         rf"got '{name}'"):
        to_c(_mlp_desc(), tmp_path, name)
    assert not list(tmp_path.iterdir())
    assert name.lower() in C_HEADER_NAMES
    assert check_c_name("stdint_snn") == "stdint_snn" and check_c_name("snn") == "snn"


def test_a_large_c_model_says_its_size_before_it_is_written(tmp_path, monkeypatch):
    """Issue 35 §6: a 60.8 MB source was written without a word; above C_SIZE_NOTICE_BYTES
    to_c says how much it writes, and where, before writing."""
    import warnings

    from snnquant.export.backends import c_runtime
    desc = _mlp_desc()
    with warnings.catch_warnings():
        warnings.simplefilter("error", c_runtime.LargeCSourceWarning)
        to_c(desc, tmp_path / "small")          # below the threshold: silent
    assert c_runtime.C_SIZE_NOTICE_BYTES == 16 << 20
    monkeypatch.setattr(c_runtime, "C_SIZE_NOTICE_BYTES", 1000)
    out = tmp_path / "large"
    with pytest.warns(c_runtime.LargeCSourceWarning, match=r"to_c is writing \d+\.\d MiB of C "
                                                         r"\(snn\.h and snn\.c, \d+ bytes of "
                                                         r"constant data\) into .*large") as info:
        to_c(desc, out)
    assert (out / "snn.c").stat().st_size + (out / "snn.h").stat().st_size > 1000
    assert str(out) in str(info[0].message)
    with warnings.catch_warnings():   # said before anything is written
        warnings.simplefilter("error", c_runtime.LargeCSourceWarning)
        with pytest.raises(c_runtime.LargeCSourceWarning):
            to_c(desc, tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_overflowing_bounds_are_refused(tmp_path):
    desc = _mlp_desc()
    desc.layer("0").shift[:] = 61
    with pytest.raises(ExportError, match=r"operation 0 \('0'\) has shift=.*overflow"):
        to_c(desc, tmp_path)
    desc = _mlp_desc()
    desc.input_max = 1 << 31
    with pytest.raises(ExportError, match="input_max=2147483648 does not fit"):
        to_c(desc, tmp_path)
    desc = _mlp_desc()
    desc.layer("1").grid_shift = 60
    with pytest.raises(ExportError, match=r"operation 1 \('1'\) has grid_shift=60: it must be "
                                          r"grid_frac_bits \+ log2\(membrane_scale\)"):
        to_c(desc, tmp_path)


# ------------------------------------------------------------------------------------------------
# writing the pair: names, permissions, full disk, mismatched files

ODD_NAMES = ["capa_oculta_\u00f1", "hidden layer", "it's \"quoted\"", "fc/*hidden*/", "a??/",
             "back\\slash\nnewline"]


def test_layer_names_that_are_not_c_identifiers(tmp_path):
    """Module names become comments only: ASCII, no comment end or trigraph; the C compiles with
    -Werror and matches IntegerSNN (before: UnicodeEncodeError after snn.h was written, and
    'fc/*hidden*/' gave '"/*" within comment')."""
    desc = _mlp_desc()
    for op, name in zip(desc.ops, ODD_NAMES):
        op.name = name
    exe = build(desc, tmp_path)
    for path in (tmp_path / "snn.h", tmp_path / "snn.c"):
        path.read_bytes().decode("ascii")
    x = sample_input(desc, (12,), 6, 4, 0, negative=False)
    assert assert_same(desc, exe, x) == 1.0


def test_pair_gets_the_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        header, source = to_c(_mlp_desc(), tmp_path)
        other = tmp_path / "other"
        other.write_text("")
    finally:
        os.umask(old)
    expected = stat.S_IMODE(other.stat().st_mode)
    assert expected == 0o644
    assert [stat.S_IMODE(p.stat().st_mode) for p in (header, source)] == [expected, expected]


def test_full_disk_keeps_the_earlier_pair(tmp_path, monkeypatch):
    header, source = to_c(_mlp_desc(), tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real_write, calls = os.write, []

    def write(fd, data):
        calls.append(fd)
        if len(calls) >= 2:          # the header's temporary is written, the source's is not
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(OSError, match=r"cannot write '.*snn\.c': no space left") as info:
        to_c(_mlp_desc(weight_bits=3, seed=5), tmp_path)
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC and len(calls) == 2
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_header_of_another_call_does_not_compile(tmp_path):
    """A header beside a source of another to_c call (a reader between the two renames, or a
    copy of one file) stops the compiler with an error naming the pair."""
    to_c(_mlp_desc(), tmp_path / "a")
    to_c(_mlp_desc(weight_bits=3, seed=5), tmp_path / "b")
    ok = subprocess.run([compiler(), *STRICT, "-c", str(tmp_path / "a" / "snn.c"), "-o",
                         str(tmp_path / "a.o")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    shutil.copy(tmp_path / "b" / "snn.h", tmp_path / "a" / "snn.h")
    bad = subprocess.run([compiler(), *STRICT, "-c", str(tmp_path / "a" / "snn.c"), "-o",
                          str(tmp_path / "b.o")], capture_output=True, text=True)
    assert bad.returncode != 0 and "snn.h was not written together with snn.c" in bad.stderr


# ------------------------------------------------------------------------------------------------
# the deployment guide

def _blocks(text: str, lang: str):
    """The bodies of the ``.. code-block:: <lang>`` blocks of an rst text, dedented."""
    import textwrap
    out = []
    for m in re.finditer(rf"^\.\. code-block:: {lang}\n\n((?:    .*\n|\n)+)", text, re.M):
        out.append(textwrap.dedent(m.group(1)))
    return out


@needs("docs")
def test_deploy_guide_runs_and_its_main_matches_integer_snn(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "guide" / "deploy_mcu.rst").read_text()
    python = _blocks(text, "python")
    mains = [b for b in _blocks(text, "c") if "int main" in b]
    assert len(python) == 3 and len(mains) == 1
    monkeypatch.chdir(tmp_path)
    namespace = {}
    for i, code in enumerate(python):
        exec(compile(code, f"deploy_mcu.rst[python {i}]", "exec"), namespace)
    (tmp_path / "main.c").write_text(mains[0])
    exe = tmp_path / "snn_demo"
    cmd = [compiler(), *STRICT, "-O2", *sanitizer_flags(), f"-I{tmp_path / 'deploy'}",
           str(tmp_path / "main.c"), str(tmp_path / "deploy" / "snn.c"), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0 and not res.stderr, res.stderr
    with open(tmp_path / "events.txt") as f:
        run = subprocess.run([str(exe)], stdin=f, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    counts = [int(v) for v in run.stdout.split("\n")[0].split()]
    expected = namespace["spikes"][:, 0].sum(0).tolist()
    assert counts == expected
    assert sum(expected) > 0     # the example network does spike
    assert f"class {max(range(10), key=lambda k: (expected[k], -k))}" in run.stdout


def test_summary_reports_the_c_model_memory():
    from snnquant import summary

    cfg = dict(seed=5, arch="conv", kind="if", tau=2.0, soft=True, v_reset=0.0, v_threshold=1.0,
               decay_input=True, bias=False, bias_bits=None, pool="max", stride=1, groups=1,
               readout="spikes", weight_bits=4, v_bits=8, per_channel=False, gain=3.0,
               leak_bits=None)
    net, shape = random_net(cfg)
    desc, model = export(net, cfg, shape)
    x = torch.randint(0, 2, (3, 2) + shape).float()
    mem = c_memory(desc, shape)
    s = summary(model, x, integer=desc)
    assert (s.c_rom_bytes, s.c_ram_bytes) == (mem.rom_bytes, mem.ram_bytes)
    assert f"C model (to_c): ROM {mem.rom_bytes} B, RAM {mem.ram_bytes} B" in str(s)
    assert summary(model, x).c_rom_bytes is None
    # weights: 4*2*9 + 5*36 4-bit, two to a byte (per-tensor steps: no rescale arrays);
    # membranes: 144 + 5 int8
    assert mem.rom_bytes == (4 * 2 * 9 + 5 * 36) // 2
    assert mem.state_bytes == 144 + 5


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
@pytest.mark.parametrize("synapses", ["events", "dense"])
@pytest.mark.parametrize("padding,kernel,dilation,stride", [("same", 2, 1, 1), ("same", 4, 1, 1),
                                                            (2, 3, 2, 1), (1, 3, 1, 2),
                                                            (2, 4, 2, 3)])
def test_convolution_padding_forms(tmp_path, padding, kernel, dilation, stride, synapses):
    torch.manual_seed(0)
    net = nn.Sequential(layer.Conv2d(2, 3, kernel, padding=padding, dilation=dilation,
                                     stride=stride),
                        neuron.IFNode(v_reset=None), layer.Flatten())
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=6, v_bits=10))
    x = torch.randint(-2, 3, (3, 5, 2, 7, 6))
    with torch.no_grad():
        q(x.float())
    q.eval()
    desc = to_integer(q)
    desc.ops[0].name = "odd */ name ??/"      # a layer name cannot break the C comment
    exe = build(desc, tmp_path, input_shape=(2, 7, 6), synapses=synapses)
    assert assert_same(desc, exe, x) == 1.0
    assert int(IntegerSNN(desc)(x).sum()) > 0


@pytest.mark.parametrize("weights", ["binary", "ternary"])
def test_binary_and_ternary_weights_match_integer_snn(weights, tmp_path):
    # issue 15: binary (+-1) and ternary (-1/0/+1) weights export to the C runtime exactly
    cfg = dict(seed=7, arch="conv", kind="lif", tau=2.0, soft=False, v_reset=0.0, v_threshold=1.0,
               decay_input=True, bias=True, bias_bits=8, pool="max", stride=1, groups=1,
               readout="spikes", weight_bits=4, v_bits=8, per_channel=True, gain=3.0,
               leak_bits=None)
    net, shape = random_net(cfg)
    config = (QuantConfig(weight_bits=1, v_bits=8, bias_bits=8) if weights == "binary" else
              QuantConfig(weight_quantizer="ternary", weight_bits=2, v_bits=8, bias_bits=8))
    q, _ = quantize_model(net, config)
    g = torch.Generator().manual_seed(cfg["seed"])
    x = torch.randint(0, 3, (4, 4) + shape, generator=g).float()
    with torch.no_grad():
        q(x)
    q.eval()
    sjf.reset_net(q)
    desc = to_integer(fold_batchnorm(q))
    synapses = [op for op in desc.ops if isinstance(op, SynapseOp)]
    assert len(synapses) == 2
    levels = set().union(*(set(op.weight.unique().tolist()) for op in synapses))
    assert levels == ({-1, 1} if weights == "binary" else {-1, 0, 1}), levels
    for synapses in ("events", "dense"):
        exe = build(desc, tmp_path / synapses, input_shape=shape, synapses=synapses)
        assert assert_same(desc, exe, sample_input(desc, shape, 6, 8, cfg["seed"], False)) == 1.0
