"""Packed weights in the C model (issue 46 §4): ``to_c`` stores 1-, 2- and 4-bit weights eight,
four and two to a byte (3-bit weights two to a byte), so that ROM follows the bits; 8-bit weights
stay one per byte. The C model stays bit-exact with ``IntegerSNN`` (strict flags, UBSan) for
every network of the model zoo the C tests build, at every bit width, in both synapse forms."""
import math
import re
import subprocess

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf

from _zoo import TRANSFORMERS
from conftest import csnn, load_script
from snnquant import QuantConfig, quantize_model
from snnquant.export import (IntegerSNN, SynapseOp, c_memory, fold_batchnorm, pack_int, to_c,
                             to_integer)
from snnquant.export.backends.c.weights import c_unpack_helper, packed_weight_bits
from test_export_c import STRICT, assert_same, build, compiler, sanitizer_flags
from test_export_c_graph import _narrow
from test_export_graph import ZOO as GRAPH_ZOO
from test_export_graph import _active

T, N = 4, 3
#: bits -> the quantize_model configuration that gives them (1: binary weights)
BITS = (1, 2, 3, 4, 8)


def _config(bits):
    return QuantConfig(weight_bits=bits, v_bits=8)


def test_c_unpack_helper_inverts_pack_int(tmp_path):
    """Every code of every position in a byte, compiled and run: the C reading of a packed array
    is :func:`unpack_int`'s."""
    g = torch.Generator().manual_seed(0)
    cases = {1: torch.randint(0, 2, (203,), generator=g) * 2 - 1,
             2: torch.randint(-2, 2, (203,), generator=g),
             4: torch.randint(-8, 8, (203,), generator=g)}
    helpers = "".join(c_unpack_helper("t", bits) for bits in cases)
    arrays = "".join(f"static const uint8_t p{b}[] = {{{', '.join(map(str, pack_int(v, b).tolist()))}}};\n"
                     for b, v in cases.items())
    loops = "".join(f"    for (k = 0; k < {v.numel()}; k++) {{ printf(\"%d\\n\", (int)t_unpack{b}(p{b}, k)); }}\n"
                    for b, v in cases.items())
    (tmp_path / "u.c").write_text(f"#include <stdint.h>\n#include <stdio.h>\n{helpers}{arrays}"
                                  f"int main(void)\n{{\n    int32_t k;\n{loops}    return 0;\n}}\n")
    res = subprocess.run([compiler(), *STRICT, *sanitizer_flags(), str(tmp_path / "u.c"), "-o",
                          str(tmp_path / "u")], capture_output=True, text=True)
    assert res.returncode == 0 and not res.stderr, res.stderr
    out = subprocess.run([str(tmp_path / "u")], capture_output=True, text=True, check=True)
    assert [int(v) for v in out.stdout.split()] == torch.cat(list(cases.values())).tolist()


@pytest.mark.parametrize("bits", (1, 2, 4))
def test_word_loop_reads_word_order(bits, tmp_path):
    """The event-driven runs of packed weights read a 32-bit word at a time: every code at
    every position of a word, in runs of one and of three words, compiled and run, comes out
    as the weight :func:`word_order` stored there (and the array is the packed size)."""
    from snnquant.export.backends.c.weights import Weights, weights_per_word, word_order
    g = torch.Generator().manual_seed(bits)
    lo, hi = (-1, 1) if bits == 1 else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    per_word = weights_per_word(bits)
    lines = []
    for run in (per_word, 3 * per_word):
        v = torch.randint(lo, hi + 1, (5 * run,), generator=g)
        if bits == 1:
            v = torch.where(v == 0, torch.ones_like(v), v)
        packed = pack_int(word_order(v, bits), bits)
        assert packed.numel() == v.numel() * bits // 8
        name = f"p{run}"
        lines.append(f"static const uint8_t {name}[] = {{{', '.join(map(str, packed.tolist()))}}};")
        w = Weights(name, "uint8_t", "t_unpack", bits, set(), words=True)
        body = "\n".join("        " + ln for ln in w.loop("wk", run, lambda wv: f'printf("%d\\n", (int){wv});'))
        lines.append(f"static void run{run}(void)\n{{\n    int32_t j, oc;\n    for (j = 0; j < 5; j++) {{\n"
                     f"        const int32_t wk = j * {run};\n{body}\n    }}\n}}")
        lines.append(f"/* expect {' '.join(map(str, v.tolist()))} */")
    expected = [int(t) for ln in lines if ln.startswith("/* expect") for t in ln[10:-3].split()]
    calls = "".join(f"    run{r}();\n" for r in (per_word, 3 * per_word))
    (tmp_path / "w.c").write_text("#include <stdint.h>\n#include <stdio.h>\n#include <string.h>\n"
                                  + "\n".join(lines) + f"\nint main(void)\n{{\n{calls}    return 0;\n}}\n")
    res = subprocess.run([compiler(), *STRICT, *sanitizer_flags(), str(tmp_path / "w.c"), "-o",
                          str(tmp_path / "w")], capture_output=True, text=True)
    assert res.returncode == 0 and not res.stderr, res.stderr
    out = subprocess.run([str(tmp_path / "w")], capture_output=True, text=True, check=True)
    assert [int(t) for t in out.stdout.split()] == expected


@pytest.mark.parametrize("bits,count", [(1, 10), (1, 57), (2, 10), (2, 7), (2, 30), (4, 5),
                                        (4, 15)])
def test_runs_off_a_byte_read_every_weight(bits, count, tmp_path):
    """Event-driven runs that need not start on a byte (a linear layer's column of 10 two-bit
    weights): every run of an array packed in C order, compiled (with UBSan) and run, comes out
    as :func:`unpack_int` reads it; runs of more than 57 bits through the unpacking function."""
    from snnquant.export.backends.c.weights import Weights
    g = torch.Generator().manual_seed(count)
    lo, hi = (-1, 1) if bits == 1 else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    v = torch.randint(lo, hi + 1, (9 * count,), generator=g)
    if bits == 1:
        v = torch.where(v == 0, torch.ones_like(v), v)
    packed = pack_int(v, bits)
    used = set()
    w = Weights("p", "uint8_t", f"t_unpack{bits}", bits, used)
    body = "\n".join("        " + ln for ln in w.loop("wk", count, lambda wv: f'printf("%d\\n", (int){wv});'))
    assert ("uint64_t run" in body) == (count * bits <= 57)
    helper = c_unpack_helper("t", bits) if used else ""
    # the array ends where the last run ends: a read past it shows under the sanitizer
    (tmp_path / "s.c").write_text(
        "#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n"
        f"{helper}static const uint8_t p_[] = {{{', '.join(map(str, packed.tolist()))}}};\n"
        "int main(void)\n{\n    int32_t j, oc;\n"
        f"    uint8_t *p = malloc(sizeof(p_));\n    memcpy(p, p_, sizeof(p_));\n"
        f"    for (j = 0; j < 9; j++) {{\n        const int32_t wk = j * {count};\n{body}\n    }}\n"
        "    free(p);\n    return 0;\n}\n")
    res = subprocess.run([compiler(), *STRICT, "-fsanitize=address", *sanitizer_flags(),
                          str(tmp_path / "s.c"), "-o", str(tmp_path / "s")],
                         capture_output=True, text=True)
    if res.returncode != 0 and "asan" in res.stderr.lower():
        res = subprocess.run([compiler(), *STRICT, *sanitizer_flags(), str(tmp_path / "s.c"),
                              "-o", str(tmp_path / "s")], capture_output=True, text=True)
    assert res.returncode == 0 and not res.stderr, res.stderr
    out = subprocess.run([str(tmp_path / "s")], capture_output=True, text=True, check=True)
    assert [int(t) for t in out.stdout.split()] == v.tolist()


def test_bits_per_weight_in_rom():
    """1, 2 and 4 bits pack as they are, 3 bits into 4, 8 bits not; codes pack_int cannot hold
    (a 0 among 1-bit weights: ternary; unsigned codes) are not packed into that width."""
    def op(weight, bits):
        return SynapseOp("l", "linear", weight, bits, torch.ones(2, dtype=torch.float64),
                         torch.ones(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64),
                         None, None, 0, 0)
    w = torch.tensor([[-1, 1], [1, -1]], dtype=torch.int8)
    assert packed_weight_bits(op(w, 1)) == 1
    assert packed_weight_bits(op(w, 2)) == 2
    assert packed_weight_bits(op(w * 3, 3)) == 4
    assert packed_weight_bits(op(w * 7, 4)) == 4
    assert packed_weight_bits(op(w * 100, 8)) is None
    assert packed_weight_bits(op(w * 0, 1)) == 2          # ternary codes: 2 bits
    assert packed_weight_bits(op(torch.tensor([[0, 3], [1, 2]], dtype=torch.int8), 2)) == 4


def _weight_arrays(source: str) -> dict:
    """``{op index: (C type, elements)}`` of the weight arrays in a generated source."""
    return {int(i): (t, int(n)) for t, i, n in
            re.findall(r"static const (\w+) snn_w(\d+)\[(\d+)\]", source)}


def _check_rom(desc, folder, shape):
    """Every weight array of both forms has ceil(n b / 8) bytes (b from packed_weight_bits) or
    one element per weight, and ROM_BYTES is c_memory's; returns the events form's ROM."""
    rom = {}
    for synapses in ("events", "dense"):
        source = (folder / synapses / "snn.c").read_text()
        arrays = _weight_arrays(source)
        for i, op in enumerate(desc.ops):
            if not isinstance(op, SynapseOp):
                continue
            bits = packed_weight_bits(op)
            n = op.weight.numel()
            if bits is None:
                assert arrays[i][1] == n and arrays[i][0] in ("int8_t", "uint8_t"), arrays[i]
            else:
                assert arrays[i] == ("uint8_t", math.ceil(n * bits / 8)), (i, arrays[i], bits)
                # read through the helper, a byte or a 32-bit word at a time, or gathered into
                # a 64-bit word (event-driven runs)
                assert (f"snn_unpack{bits}(snn_w{i}, " in source or f"= snn_w{i}[(w" in source
                        or f"memcpy(&word, snn_w{i} + (w" in source
                        or f"*src = snn_w{i} + (bit0 >> 3);" in source), (i, bits)
        rom[synapses] = c_memory(desc, shape, synapses=synapses).rom_bytes
        assert f"#define SNN_ROM_BYTES {rom[synapses]}\n" in (folder / synapses / "snn.h").read_text()
    assert rom["events"] == rom["dense"]
    return rom["events"]


def _c_equals_integer_snn(desc, shape, x, folder):
    for synapses in ("events", "dense"):
        exe = build(desc, folder / synapses, input_shape=shape, synapses=synapses)
        assert assert_same(desc, exe, x) == 1.0, synapses
    return _check_rom(desc, folder, shape)


@pytest.mark.parametrize("bits", BITS)
def test_csnn_at_every_bit_width_in_c(bits, tmp_path):
    """The CSNN (conv-BN-LIF blocks, a linear read-out of currents) at 1, 2, 3, 4 and 8-bit weights: C equals
    IntegerSNN in both forms, and its ROM follows the bits."""
    torch.manual_seed(0)
    # the read-out's currents are the output (its LIF left out): every weight shows in it
    q, _ = quantize_model(_active(nn.Sequential(*list(csnn(8))[:-1])), _config(bits))
    x = (torch.rand(T, N, 2, 16, 16, generator=torch.Generator().manual_seed(1)) > 0.6).float()
    sjf.reset_net(q)
    q.train()(x)
    model = fold_batchnorm(q.eval())
    desc = to_integer(model, example_input=x, input_max=1)
    synapses = [op for op in desc.ops if isinstance(op, SynapseOp)]
    assert all(op.weight_bits == bits for op in synapses)
    out, layers = IntegerSNN(desc)(x.long(), record=True)
    assert all(int(layers[k].sum()) > 0 for k in desc.neuron_names), bits   # none is silent
    assert desc.output_kind == "current" and out.unique().numel() > 2
    rom = _c_equals_integer_snn(desc, (2, 16, 16), x.long(), tmp_path)
    weights = sum(op.weight.numel() for op in synapses)
    slot = {1: 1, 2: 2, 3: 4, 4: 4, 8: 8}[bits]
    # ROM = the weights at their packed width + the other constants (biases, rescale factors)
    assert rom >= weights * slot // 8
    assert rom - sum(math.ceil(op.weight.numel() * slot / 8) for op in synapses) < weights // 8


def _graph_desc(name, bits):
    torch.manual_seed(0)
    build_, shape = GRAPH_ZOO[name]
    net = _active(build_() if name == "NMNISTNet" else _narrow(build_()))
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, _config(bits))
    x = (torch.rand(T, N, *shape) > 0.7).float()
    sjf.reset_net(q)
    q.train()(x)
    model = fold_batchnorm(q.eval())
    return to_integer(model, input_shape=shape), x, shape


def _transformer_desc(name, bits):
    zoo = load_script("benchmarks/zoo_deploy.py")
    torch.manual_seed(0)
    build_, shape, _ = zoo.networks()[TRANSFORMERS[name]]
    x = (torch.rand((zoo.T, N) + shape, generator=torch.Generator().manual_seed(1)) > 0.5).float()
    q, _ = quantize_model(zoo.keep_spiking(build_()), _config(bits), example_input=x)
    sjf.reset_net(q)
    q.train()(x)
    folded = fold_batchnorm(q.eval(), example_input=x)
    return to_integer(folded, example_input=x, input_max=1), x, shape


ZOO_CASES = ([("graph", n) for n in sorted(GRAPH_ZOO)]
             + [("transformer", n) for n in TRANSFORMERS])


# MS-ResNet and MaxResNet at 8 bits: to_integer refuses them (the float32 sum of the downsample's
# fake-quantized convolution exceeds 2^24, so it is not exact): no C model to compare
ZOO_BITS = [(family, name, bits) for family, name in ZOO_CASES for bits in (1, 2, 4, 8)
            if not (bits == 8 and name in ("ms_resnet", "max_resnet"))]


@pytest.mark.heavy
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("family,name,bits", ZOO_BITS)
def test_zoo_network_at_every_bit_width_in_c(family, name, bits, tmp_path):
    """Every network of the model zoo the C tests build (test_export_c_graph's, narrowed as
    there, and test_export_transformers'), at 1, 2, 4 and 8-bit weights: the C model equals
    IntegerSNN at every step and sample in both synapse forms, with every weight array packed to
    its bits."""
    desc, x, shape = (_graph_desc if family == "graph" else _transformer_desc)(name, bits)
    if family == "graph":
        _c_equals_integer_snn(desc, shape, x.long(), tmp_path)
        return
    # a transformer averaged over time: the C model's steps are IntegerSNN's last layer's
    from test_export_c import run_c
    _, layers = IntegerSNN(desc)(x.long(), record=True)
    ref = layers[desc.ops[-1].name].reshape(x.shape[0], x.shape[1], -1)
    for synapses in ("events", "dense"):
        exe = build(desc, tmp_path / synapses, input_shape=shape, synapses=synapses)
        assert torch.equal(run_c(exe, x.long()), ref), synapses
    _check_rom(desc, tmp_path, shape)
