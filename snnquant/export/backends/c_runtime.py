r"""A portable C99 runtime of an integer network: :func:`to_c`.

The generated code computes exactly what :class:`~snnquant.export.IntegerSNN` computes, one time
step of one sample per call, with integer arithmetic only (no floating point, no ``malloc``, only
``<stdint.h>`` and ``<string.h>``). Every intermediate value has a bound that is worked out here,
from the description, when the code is written:

* the input of the network lies in :math:`[-x_{max}, x_{max}]` (``input_max``), spikes in
  :math:`\{0, 1\}`, a sum pool of values in :math:`[l, h]` in :math:`[a\,l, a\,h]`
  (:func:`~snnquant.export.ir.program.pool_range`), a join and its partial sums by
  :math:`\sum_i \max|x_i|\, 2^{\sigma_i}` (:func:`~snnquant.export.ir.program.join_bound`);
* a synaptic layer's accumulator and current are bounded by
  :math:`|X_c| \le \lVert w_c \rVert_1\, |x|_{max}\, m_c 2^{\sigma_c} + |b_c|`;
* a neuron's charge by the bounds of every register of its operation list
  (:meth:`~snnquant.export.ir.program.NeuronProgram.intervals`), the same list
  :class:`~snnquant.export.IntegerSNN` runs and this module prints as C.

The partial sums of an accumulator are bounded by the same :math:`\lVert w_c \rVert_1 |x|_{max}`
in any order and over any subset of the inputs, so the event-driven form (only the nonzero inputs,
see :func:`to_c`) and the dense form need the same types. From these bounds each layer picks the
narrowest C type that holds it (``int32_t`` accumulators where :math:`2^{31}` is never reached,
``int64_t`` otherwise; a neuron layer's registers in ``int16_t`` or ``int32_t`` where every
one stays below :math:`2^{14}` or :math:`2^{30}`,
:meth:`~snnquant.export.ir.program.NeuronProgram.c_type`, after its current is clamped to the
range beyond which the charge saturates for every membrane,
:meth:`~snnquant.export.ir.program.NeuronProgram.saturating_range`, where that makes the type
narrower), and a network whose bound reaches :math:`2^{62}` is refused: C signed overflow is
undefined behaviour, so the code never relies on it. Shifts of negative numbers are written as
multiplications by :math:`2^k` (left) and as ``~(~d >> k)`` (floor right shift), so the code does
not depend on implementation-defined behaviour either.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

from ..._io import atomic_write_files
from ..ir.network import ExportError, FlattenOp, IntegerNetwork, SynapseOp, check_input_shape
from .c.common import numel
from .c.generator import CGenerator

__all__ = ["to_c", "c_memory", "CMemory", "check_c_name", "C_HEADER_NAMES",
           "C_SIZE_NOTICE_BYTES", "LargeCSourceWarning"]

_C_KEYWORDS = {
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else",
    "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "register",
    "restrict", "return", "short", "signed", "sizeof", "static", "struct", "switch", "typedef",
    "union", "unsigned", "void", "volatile", "while", "_Bool", "_Complex", "_Imaginary",
}


@dataclass
class CMemory:
    """Memory of a generated C model.

    Attributes:
        rom_bytes: constant data (weights, biases, rescale factors), code not included.
        ram_bytes: ``sizeof(<name>_state)``: the membranes of one sample, the buffers between
            layers and the sums of the event-driven layers.
        state_bytes: the membranes alone.
        input_size: ``<NAME>_INPUT_SIZE``; ``output_size``: ``<NAME>_OUTPUT_SIZE``.
        scratch_bytes: the sums of the event-driven synaptic layers and the spikes of the
            neuron layers they feed (one layer's at a time; 0 with ``synapses='dense'``),
            included in ``ram_bytes``.
        list_bytes: what the index lists of spikes (``synapses='events'``: the spikes of a
            neuron layer that only synaptic layers read travel as the count and the indices of
            the neurons that fired) add to the buffers between layers over the one byte per
            neuron of ``synapses='dense'``; included in ``ram_bytes``, so that
            ``ram_bytes`` = dense ``ram_bytes`` + ``scratch_bytes`` + ``list_bytes``.
    """

    rom_bytes: int
    ram_bytes: int
    state_bytes: int
    input_size: int
    output_size: int
    scratch_bytes: int = 0
    list_bytes: int = 0


# ------------------------------------------------------------------------------------------------
# validation and shapes

#: The standard headers of C (C89 to C23) and POSIX (issue 8) that a bare ``#include <x.h>``
#: names. :func:`to_c` refuses them as ``name`` (compared case-insensitively, for
#: case-insensitive file systems): ``<name>.h`` in a folder given with ``-I`` would hide the
#: system header from every file compiled with that flag.
C_HEADER_NAMES = frozenset((
    # C
    "assert", "complex", "ctype", "errno", "fenv", "float", "inttypes", "iso646", "limits",
    "locale", "math", "setjmp", "signal", "stdalign", "stdarg", "stdatomic", "stdbit", "stdbool",
    "stdckdint", "stddef", "stdint", "stdio", "stdlib", "stdnoreturn", "string", "tgmath",
    "threads", "time", "uchar", "wchar", "wctype",
    # POSIX
    "aio", "cpio", "devctl", "dirent", "dlfcn", "endian", "fcntl", "fmtmsg", "fnmatch", "ftw",
    "glob", "grp", "iconv", "langinfo", "libgen", "libintl", "monetary", "mqueue", "ndbm",
    "netdb", "nl_types", "poll", "pthread", "pwd", "regex", "sched", "search", "semaphore",
    "spawn", "strings", "stropts", "syslog", "tar", "termios", "trace", "ulimit", "unistd",
    "utime", "utmpx", "wordexp",
))


def check_c_name(name) -> str:
    """``name`` as the C model's name: a C identifier of at most 31 characters that is not a C
    keyword, does not start with ``__`` and is not a standard C or POSIX header name
    (:data:`C_HEADER_NAMES`, case-insensitively: ``<name>.h`` would hide that header).

    Raises:
        ValueError: naming ``name``, its value and the rule it breaks.
    """
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"name must be a C identifier (letters, digits, '_', not starting with a "
                         f"digit), got {name!r}")
    if name in _C_KEYWORDS or name.startswith("__") or len(name) > 31:
        raise ValueError(f"name must not be a C keyword, start with '__' or exceed 31 characters, "
                         f"got {name!r}")
    if name.lower() in C_HEADER_NAMES:
        raise ValueError(f"name must not be a standard C or POSIX header name, got {name!r}: "
                         f"{name}.h would hide <{name.lower()}.h> from every file compiled with "
                         f"-I on its folder; choose another, e.g. {name}_snn")
    return name


def _infer_input_shape(desc: IntegerNetwork) -> Tuple[int, ...]:
    first = next((op for op in desc.ops if not isinstance(op, FlattenOp)), None)
    if isinstance(first, SynapseOp) and first.kind == "linear" and not any(
            isinstance(op, FlattenOp) for op in desc.ops[:desc.ops.index(first)]):
        return (int(first.weight.shape[1]),)
    kind = "an empty network" if first is None else f"{type(first).__name__} {first.name!r}"
    raise ValueError(f"input_shape is required: the network starts with {kind}, whose input size "
                     f"the description does not hold; pass the per-sample input shape, e.g. "
                     f"input_shape=(2, 34, 34)")


# ------------------------------------------------------------------------------------------------
# public API

#: Above this many bytes of C (header and source together, ``16 * 2**20``), :func:`to_c` says
#: how much it is about to write with a :class:`LargeCSourceWarning` (a weight takes 2 to 5
#: bytes of text: a 16.8 M-weight layer is about 55 MB).
C_SIZE_NOTICE_BYTES = 16 << 20


class LargeCSourceWarning(UserWarning):
    """:func:`to_c` is about to write more than :data:`C_SIZE_NOTICE_BYTES` bytes of C; the
    message says how many, and where."""


#: The forms of a synaptic layer's accumulation that :func:`to_c` writes.
SYNAPSE_FORMS = ("events", "dense")


def _prepare(desc, name, input_shape, synapses="events") -> CGenerator:
    if not isinstance(desc, IntegerNetwork):
        raise TypeError(f"desc must be an IntegerNetwork (from to_integer or load_integer), got "
                        f"{type(desc).__name__}")
    if desc.chip is not None:
        raise ExportError(f"desc is a {desc.chip} network (the chip's own layer operations); "
                          f"the C runtime runs snnquant's operations only: run it on "
                          f"IntegerSNN, and deploy it with snnquant.targets.to_{desc.chip}")
    name = check_c_name(name)
    if not isinstance(synapses, str) or synapses not in SYNAPSE_FORMS:
        raise ValueError(f"synapses must be one of {SYNAPSE_FORMS}, got {synapses!r}")
    if input_shape is None:
        input_shape = _infer_input_shape(desc)
    input_shape = check_input_shape(input_shape)
    return CGenerator(desc, name, input_shape, synapses).build()


def c_memory(desc: IntegerNetwork, input_shape: Optional[Sequence[int]] = None, *,
             synapses: str = "events") -> CMemory:
    r"""ROM and RAM of the C model :func:`to_c` writes for ``desc``, without writing it.

    Args:
        desc: the integer network.
        input_shape: per-sample input shape, as for :func:`to_c`.
        synapses: ``'events'`` or ``'dense'``, as for :func:`to_c`.

    Returns:
        A :class:`CMemory` (``rom_bytes`` = ``<NAME>_ROM_BYTES``, ``ram_bytes`` =
        ``<NAME>_RAM_BYTES``).
    """
    g = _prepare(desc, "snn", input_shape, synapses)
    return CMemory(rom_bytes=g.rom, ram_bytes=g.ram, state_bytes=g.state_bytes,
                   input_size=numel(g.input_shape), output_size=g.out_size,
                   scratch_bytes=g.scratch_bytes, list_bytes=g.list_bytes)


def _pair_texts(gen: "CGenerator") -> Tuple[bytes, bytes]:
    """The header and source as ASCII bytes, tied by a pair id: the first 64 bits of the SHA-256
    of both texts (written without the id)."""
    digest = hashlib.sha256((gen.header("0") + "\0" + gen.source("0")).encode("utf-8"))
    pair_id = digest.hexdigest()[:16]
    texts = []
    for text in (gen.header(pair_id), gen.source(pair_id)):
        try:
            texts.append(text.encode("ascii"))
        except UnicodeEncodeError as exc:  # a bug of this module: every name is escaped
            raise ExportError(f"the generated C is not ASCII ({exc}); nothing was written") from None
    return texts[0], texts[1]


def to_c(desc: IntegerNetwork, out_dir: Union[str, os.PathLike], name: str = "snn", *,
         input_shape: Optional[Sequence[int]] = None, synapses: str = "events"
         ) -> Tuple[Path, Path]:
    r"""Write a bit-exact, portable C99 model of an integer network: ``<name>.h`` and ``<name>.c``.

    The C model computes, one time step of one sample per call, exactly what
    :class:`~snnquant.export.IntegerSNN` computes (same accumulator values, ties-to-even
    rounding, saturation, leak shift or fixed-point multiplier, hard or soft reset, pooling,
    flatten order): every layer of :class:`~snnquant.export.NeuronOp` and
    :class:`~snnquant.export.SynapseOp`, including ``exact=False`` layers from
    ``to_integer(..., leak_bits=F)``, and graphs: branches, residual joins
    (:class:`~snnquant.export.JoinOp`: ``'add'`` with the operands aligned by shifts,
    ``'and'``/``'iand'`` of spikes), adaptive average pools and SpikingJelly's ``VotingLayer``. The code uses integers only, no ``malloc``, includes only
    ``<stdint.h>`` and ``<string.h>``, and compiles warning-free with
    ``gcc -std=c99 -Wall -Wextra -Werror -pedantic``. Weights are ``static const`` arrays: 1-, 2-
    and 4-bit weights packed eight, four and two to a byte (3-bit ones two to a byte) by
    :func:`~snnquant.export.pack_int` (:func:`~snnquant.export.backends.c.weights.packed_weight_bits`),
    wider ones in the narrowest integer type that holds them, so that ``NAME_ROM_BYTES`` follows
    the bits.

    API of ``<name>.h`` (``NAME`` is ``name`` in capitals):

    * ``NAME_INPUT_SIZE``, ``NAME_OUTPUT_SIZE``: elements of one time step of one sample, in C
      order of the per-sample shape (``input_shape``, e.g. ``[C, H, W]``, and the output shape
      :class:`~snnquant.export.IntegerSNN` returns); ``NAME_INPUT_MAX``: the largest input
      magnitude (``desc.input_max``; larger inputs are not checked by the C code);
    * ``NAME_ROM_BYTES``: bytes of constant data (weights, biases, rescale factors; not code);
      ``NAME_RAM_BYTES``: ``sizeof(name_state)``;
    * ``name_state``: one sample's membranes (and the buffers between layers; its layout is
      private to the generated code);
    * ``void name_reset(name_state *s)``: membranes to their initial values;
    * ``void name_step(name_state *s, const int32_t *input, int64_t *output)``: one step;
      ``output`` receives what :class:`~snnquant.export.IntegerSNN` returns: the spikes (0/1);
      for a network ending in a synaptic layer, the integer currents in units of :math:`2^{-F}`
      (``desc.output_frac_bits``); for a network ending in a sum pool of spikes (a
      ``VotingLayer`` over :math:`D` neurons, an average pool), the integer sums, which
      divided by :attr:`~snnquant.export.IntegerNetwork.output_divisor` (:math:`D` for a
      ``VotingLayer``) give the float model's output (``<name>.h`` says which).

    Graphs. Every operation reads the buffers of the operations named in its ``inputs`` (a
    flatten is its input's buffer, read in C order); a synaptic layer whose current only one
    neuron layer reads feeds it directly, without a buffer. A buffer lives from the operation
    that writes it to the last one that reads it; buffers whose lives do not overlap share
    memory (one union per slot in ``name_state``; a sequence needs two), and every slot is
    counted in ``NAME_RAM_BYTES``, which the source checks equals ``sizeof(name_state)``.

    Synapses. With ``synapses='events'`` (the default) a synaptic layer adds only what its
    nonzero inputs contribute: a weight column per nonzero input of a linear layer, a kernel
    stamp per nonzero input of a convolution (weights stored input-major; the columns a stamp
    reaches are clipped at the borders once per event), into sums kept in the state
    (``scratch``, counted in ``NAME_RAM_BYTES``); its time then grows with the synaptic
    operations (nonzero inputs times fan-out), not with the layer size. The spikes of a neuron
    layer (or of a max pool of spikes) that only synaptic layers read travel as an index list: the count of neurons that
    fired, then their indices (C order of the layer's output, in no particular order), written
    without a branch per neuron, so the next layer reads its events without scanning for them;
    other inputs (the network's, a sum pool's) are scanned a 64-bit word at a time, skipping
    words of zeros. Each layer leaves its sums at 0 for the next step (``name_reset`` zeroes the
    state), and a neuron layer fed by an event-driven layer keeps its membranes in the order of
    the sums (position, then channel), so its update is one branch-free loop over contiguous
    memory. The RAM this takes beyond ``synapses='dense'`` is
    :attr:`CMemory.scratch_bytes` (sums, and one byte per neuron of the layers they feed) plus
    :attr:`CMemory.list_bytes` (an index list of :math:`n + 1` entries where the dense form has
    :math:`n` bytes of spikes). Every synaptic input of an exported network is spikes or event
    counts, so this is the faster form for SNN activity; ``synapses='dense'`` writes the dense
    loops (every input times every weight), which need no scratch, have constant trip counts
    (for HLS tools) and win only for inputs that are mostly nonzero. Both compute the same
    integers.

    Layer names. The source model's module names (any text: ``'capa_oculta_ñ'``, spaces,
    quotes, ``'fc/*hidden*/'``) never become C identifiers: every generated symbol is
    ``<name>_<kind><position>`` (``snn_w0``, ``snn_n1``), unique by construction, and a module name
    appears only inside comments, escaped to ASCII with every ``/*``, ``*/`` and ``?`` defused.

    Writing. Both texts are generated (and checked to be ASCII) before anything is written (a
    :class:`LargeCSourceWarning` says their size when it exceeds :data:`C_SIZE_NOTICE_BYTES`;
    weights are formatted a block at a time, so the texts are what memory holds); then
    both files are written to temporaries in ``out_dir``, ``fsync``-ed, and renamed over the old
    pair (:func:`snnquant._io.atomic_write_files`), with the umask's permissions like every other
    output. An error while writing (a full disk) leaves the earlier pair as it was and names the
    path. Between the two renames a reader could see a new header beside an old source, so the
    pair also carries its own check: ``<NAME>_PAIR_ID`` in the header (the first 64 bits of a
    SHA-256 of both texts) must equal the value written into the source, which otherwise stops
    compiling with an ``#error`` naming both files.

    Args:
        desc: the integer network (:func:`~snnquant.export.to_integer` or
            :func:`~snnquant.export.load_integer`).
        out_dir: folder for the two files (created if missing).
        name: C identifier prefixing every public symbol and naming the files (checked before
            anything is written by :func:`check_c_name`; not a standard header's name).
        input_shape: per-sample input shape without time and batch. Needed when the network does
            not start with a linear layer (the description holds no image size); by default
            ``(in_features,)`` of the first linear layer.
        synapses: ``'events'`` (default) or ``'dense'``: the form of every synaptic layer's
            accumulation (see above).

    Returns:
        ``(header_path, source_path)``.

    Raises:
        TypeError: ``desc`` is not an :class:`~snnquant.export.IntegerNetwork`.
        ValueError: a bad ``name`` (see :func:`check_c_name`: not a C identifier, a keyword, or
            a standard C or POSIX header name such as ``stdint``), ``input_shape`` or
            ``synapses``.
        OSError: a file could not be written (the message names it; the earlier pair is kept).
        ExportError: a bound of an intermediate value reaches :math:`2^{62}` (the C code would
            overflow; a join's too), an ``'and'``/``'iand'`` join of values that are not spikes,
            or a layer form the C runtime does not implement.
    """
    gen = _prepare(desc, name, input_shape, synapses)
    texts = _pair_texts(gen)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir={str(out_dir)!r} exists and is not a folder")
    header, source = out / f"{gen.name}.h", out / f"{gen.name}.c"
    size = sum(map(len, texts))
    if size > C_SIZE_NOTICE_BYTES:
        warnings.warn(f"to_c is writing {size / 2 ** 20:.1f} MiB of C ({header.name} and "
                      f"{source.name}, {gen.rom} bytes of constant data) into {out}",
                      LargeCSourceWarning, stacklevel=2)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_files(zip((header, source), texts))
    return header, source
