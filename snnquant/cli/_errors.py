"""Errors of the command line that it reports in one line."""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional, Tuple, Type

# optional modules snnquant imports where used: module -> (pip package, extra that installs it)
OPTIONAL_MODULES = {
    "sklearn": ("scikit-learn", "datasets"),
    "torchvision": ("torchvision", "datasets"),
    "h5py": ("h5py", "datasets"),
    "matplotlib": ("matplotlib", "examples"),
    "tensorboard": ("tensorboard", "examples"),
    "safetensors": ("safetensors", "export"),
    "nir": ("nir", "export"),
    "nirtorch": ("nirtorch", "export"),
    "cupy": ("cupy-cuda12x or cupy-cuda13x", "cuda12] or [cuda13"),
}


def optional_module(error: ModuleNotFoundError) -> Optional[str]:
    """The optional module (a key of ``OPTIONAL_MODULES``) whose absence raised ``error``, or
    None when the missing module is not one of them."""
    top = (error.name or "").split(".")[0]
    return top if top in OPTIONAL_MODULES else None


class MissingDependency(ImportError):
    """An optional module a command needs is not installed; the message names the extra.

    Args:
        module: the module, as imported (``sklearn``).
        package: the pip package that provides it (``scikit-learn``).
        extra: the snnquant extra that installs it (``datasets``).
    """

    def __init__(self, module: str, package: str, extra: str):
        super().__init__(f"this run needs the module '{module}', which is not installed: "
                         f"pip install \"snnquant[{extra}]\" (or pip install {package})",
                         name=module)

    @classmethod
    def explain(cls, error: ImportError) -> str:
        """One line for ``error``: a ``ModuleNotFoundError`` of an optional module with the extra
        to install; any other ``ImportError`` (snnquant's own say what to install) as it is.

        Raises:
            ImportError: ``error`` itself, when it is about no optional module (a bug to see).
        """
        if isinstance(error, cls) or not isinstance(error, ModuleNotFoundError):
            return str(error)  # snnquant's own ImportErrors say what to install
        module = optional_module(error)
        if module is None:
            raise error
        return str(cls(module, *OPTIONAL_MODULES[module]))


def exit_status(action: Callable[[], None], prog: str,
                user_errors: Tuple[Type[BaseException], ...]) -> int:
    """Run ``action`` and return the command's exit status: 0; 2 with one line on stderr for one
    of ``user_errors`` (a bad argument, dataset root, run folder or model file); 1 with one line
    naming the extra to install for a missing optional dependency."""
    try:
        action()
    except user_errors as error:  # one line, no traceback
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except ImportError as error:
        print(f"{prog}: error: {MissingDependency.explain(error)}", file=sys.stderr)
        return 1
    return 0


class OneLineParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose refusals are one line on stderr (``prog: error:
    message``, exit status 2), without the usage block; ``--help`` still prints everything."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
