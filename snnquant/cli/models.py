"""``snnquant summary`` and ``snnquant export``: read a saved model, describe it or export it.

A saved model is either a finished run folder of ``snnquant train`` (its ``run.json`` holds the
configuration that rebuilds the network, and the SHA-256 of every file, checked before use) or an
integer network file (``.safetensors``, :func:`snnquant.export.save_integer`).

* From a run folder the deployed network is the integer one the run exported
  (``model_int.safetensors``); a run without it (``--no-integer-check``) is exported from
  ``model.pt``: rebuilt, BN folded (without the fine-tuning the run's integer check does) and
  converted with :func:`snnquant.export.to_integer`.
* ``--to int`` writes ``<name>.safetensors``, ``--to c`` ``<name>.h``/``<name>.c``
  (:func:`snnquant.export.to_c`), ``--to nir`` ``<name>.nir`` (:func:`snnquant.export.to_nir`,
  integer units), all into ``--out``.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence, Tuple

FORMATS = ("int", "c", "nir")


class ModelFileError(Exception):
    """A saved model cannot be read or exported; the message is one line naming the file."""


def _parser(command: str, prog: str) -> argparse.ArgumentParser:
    from snnquant.cli._errors import OneLineParser

    if command == "summary":
        ap = OneLineParser(prog=prog, description=(
            "Bits, bytes and layers of a saved model: a run folder of 'snnquant train' (its "
            "run.json is checked first) or an integer network file (.safetensors)."))
    else:
        ap = OneLineParser(prog=prog, description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        ap.add_argument("--to", action="append", choices=FORMATS, required=True,
                        help="a format to write (repeat for several): int = the integer file "
                             "(.safetensors), c = the C model (.h/.c), nir = NIR (.nir)")
        ap.add_argument("--out", required=True, help="folder for the exported files")
        ap.add_argument("--name", default="snn",
                        help="base name of the files and prefix of the C API (default: snn)")
    ap.add_argument("model", help="a run folder of 'snnquant train' or an integer file (.safetensors)")
    ap.add_argument("--input-shape", default=None,
                    help="per-sample shape of one time step, e.g. 2,34,34 (default: the run's "
                         "dataset; for an integer file starting with a linear layer its width)")
    return ap


def _input_shape(text: Optional[str], config: Optional[dict]) -> Optional[Tuple[int, ...]]:
    if text is not None:
        try:
            shape = tuple(int(v) for v in text.split(","))
        except ValueError:
            shape = ()
        if not shape or min(shape) < 1:
            raise ModelFileError(f"--input-shape must be positive integers separated by commas, "
                                 f"got {text!r}")
        return shape
    if config is not None:
        from snnquant.cli.zoo import frame_shape
        return frame_shape(argparse.Namespace(**config))   # after the run's --crop
    return None


def load_run_model(folder: Path):
    """The float model of a finished run folder, rebuilt from its ``run.json`` configuration with
    ``model.pt`` loaded, and the configuration.

    Raises:
        ModelFileError: no finished run, a file changed after the run, or no ``model.pt``.
    """
    from snnquant._io import load_checkpoint
    from snnquant.cli._run_folder import verify_manifest
    from snnquant.cli.network import build_network, quantize

    try:
        config = verify_manifest(folder)["configuration"]
    except ValueError as exc:
        raise ModelFileError(str(exc)) from None
    if not (folder / "model.pt").is_file():
        return None, config
    args = argparse.Namespace(**config)
    example = None
    if config.get("model"):   # a network of SpikingJelly's model package: captured from a run
        import torch

        from snnquant.cli.zoo import frame_shape
        example = torch.zeros((args.T, 1) + frame_shape(args))
    model, _ = quantize(build_network(args), args, example)
    try:
        model.load_state_dict(load_checkpoint(folder / "model.pt", map_location="cpu"))
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelFileError(f"{folder / 'model.pt'}: {exc}") from None
    return model.eval(), config


def load_integer_model(path: Path, model=None):
    """The integer network of a saved model: the integer file itself, a run's
    ``model_int.safetensors``, or (without one) ``model`` folded and converted.

    Raises:
        ModelFileError: the file is damaged, or the model cannot be made integer (named why).
    """
    from snnquant.export import ExportError, fold_batchnorm, load_integer, to_integer

    target = path / "model_int.safetensors" if path.is_dir() else path
    if target.is_file():
        try:
            return load_integer(target)
        except (OSError, ValueError) as exc:
            raise ModelFileError(str(exc)) from None
    if model is None:
        raise ModelFileError(f"{path} holds neither model_int.safetensors nor model.pt")
    try:
        return to_integer(fold_batchnorm(model))
    except (ExportError, ValueError) as exc:
        raise ModelFileError(f"{path}: this model cannot be exported as integers: {exc}") from None


def _open(path_text: str):
    path = Path(path_text)
    if path.is_dir():
        model, config = load_run_model(path)
        return path, model, config
    if path.is_file():
        return path, None, None
    raise ModelFileError(f"no run folder or integer file at {path}")


def summary_command(ns) -> None:
    """Print the summary of ``ns.model`` (the ``summary`` subcommand)."""
    import snnquant
    from snnquant.export import c_memory

    path, model, config = _open(ns.model)
    shape = _input_shape(ns.input_shape, config)
    if config is not None:
        print(f"run folder {path}: dataset {config['dataset']}, weight bits "
              f"{config['weight_bits'] or 'full precision'}, membrane bits "
              f"{config['v_bits'] or 'full precision'}, {config['epochs']} epochs")
    if model is not None:
        print(snnquant.summary(model))
    if path.is_file() or (path / "model_int.safetensors").is_file():
        desc = load_integer_model(path)
        print(desc)
        if desc.chip is not None:
            print(f"C model: no C model for a chip network ({desc.chip}: its vendor file is its "
                  f"deployment)")
            return
        try:
            mem = c_memory(desc, shape)
        except ValueError as exc:
            raise ModelFileError(f"{path}: {exc} (--input-shape)") from None
        print(f"C model: ROM {mem.rom_bytes} bytes, RAM {mem.ram_bytes} bytes")


def _check_export(ns, desc, shape, out: Path) -> None:
    """Everything ``export`` can check before it writes: the name, the shapes of every format
    asked for, and that ``--out`` can be written."""
    from snnquant._io import check_writable
    from snnquant.export import c_memory
    from snnquant.export.backends.c_runtime import check_c_name
    from snnquant.export.backends.simulator import op_shapes

    try:
        check_c_name(ns.name)
    except ValueError as exc:
        raise ModelFileError(f"--{exc}") from None   # "--name must be ..., got '...'"
    if "nir" in ns.to and shape is None:
        raise ModelFileError("--to nir needs --input-shape (the per-sample shape of one time "
                             "step)")
    if desc.chip is not None:
        _check_targets(ns, desc, shape)
    try:
        if "c" in ns.to:
            c_memory(desc, shape)
        elif shape is not None:
            op_shapes(desc, shape)
    except ValueError as exc:
        given = f"--input-shape {ns.input_shape}" if ns.input_shape else \
            f"{ns.model} (give --input-shape)" if shape is None else \
            f"the run's input shape {','.join(map(str, shape))} (give --input-shape)"
        raise ModelFileError(f"{given}: {exc}") from None
    _check_targets(ns, desc, shape)
    if out.exists() and not out.is_dir():
        raise ModelFileError(f"--out {out} is a file, not a folder")
    try:
        check_writable(out)
    except OSError as exc:
        raise ModelFileError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None


def _check_targets(ns, desc, shape) -> None:
    """Every format of ``--to`` can be written for ``desc``: a chip network has neither C nor
    NIR, and the NIR graph is built (not written) here, so that no format is written when
    another one would fail."""
    from snnquant.export import to_nir

    wanted = set(ns.to) & {"c", "nir"}
    if desc.chip is not None and wanted:
        raise ModelFileError(f"{ns.model}: a {desc.chip} chip network has no "
                             f"{' or '.join(sorted(wanted)).upper()} export (export it with "
                             f"--to int, or to the chip's own file); nothing was written")
    if "nir" in wanted:
        try:
            to_nir(desc, shape)
        except (ValueError, TypeError, NotImplementedError) as exc:
            raise ModelFileError(f"{ns.model}: --to nir: {exc}; nothing was written") from None


def export_command(ns) -> None:
    """Write the formats ``ns.to`` of ``ns.model`` into ``ns.out`` (the ``export`` subcommand);
    every argument is checked before ``--out`` is created."""
    from snnquant.export import save_integer, to_c, to_nir

    path, model, config = _open(ns.model)
    shape = _input_shape(ns.input_shape, config)
    desc = load_integer_model(path, model)
    out = Path(ns.out)
    _check_export(ns, desc, shape, out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        for fmt in dict.fromkeys(ns.to):
            if fmt == "int":
                save_integer(desc, out / f"{ns.name}.safetensors")
                print(f"integer file: {out / (ns.name + '.safetensors')}")
            elif fmt == "c":
                header, source = to_c(desc, out, ns.name, input_shape=shape)
                print(f"C model: {header}, {source}")
            else:
                to_nir(desc, shape, path=out / f"{ns.name}.nir")
                print(f"NIR graph: {out / (ns.name + '.nir')}")
    except ValueError as exc:
        raise ModelFileError(f"{path}: {exc}") from None


def run(command: str, argv: Sequence[str], prog: str) -> int:
    """``snnquant summary|export ARGS``: the subcommand with errors as one line and an exit status
    (2: a bad argument or model file; 1: a missing optional dependency); return the status."""
    from snnquant.cli._errors import exit_status

    ns = _parser(command, prog).parse_args(list(argv))
    command_fn = summary_command if command == "summary" else export_command
    return exit_status(lambda: command_fn(ns), prog, (ModelFileError,))
