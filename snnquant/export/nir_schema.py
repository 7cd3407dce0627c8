r"""What :func:`~snnquant.export.to_nir` and :func:`~snnquant.export.from_nir` agree on: the version
of snnquant's metadata schema and the ``nir`` package both need (imported only when used)."""

from __future__ import annotations

import re

__all__ = ["SCHEMA_VERSION", "NIR_MIN_VERSION", "import_nir"]

#: Version of the metadata schema that :func:`~snnquant.export.to_nir` writes and
#: :func:`~snnquant.export.from_nir` reads (key ``snnquant_schema`` of the graph and every node).
SCHEMA_VERSION = 1

#: Oldest ``nir`` release that holds ``v_reset`` on ``IF``/``LIF`` nodes.
NIR_MIN_VERSION = (1, 0, 6)


def _version_tuple(text: str):
    parts = []
    for piece in str(text).split(".")[:3]:
        m = re.match(r"\d+", piece)
        parts.append(int(m.group()) if m else 0)
    return tuple(parts + [0] * (3 - len(parts)))


def import_nir(what: str):
    """The ``nir`` module, or ``ImportError`` naming ``what`` needs it (absent or older than 1.0.6)."""
    need = ".".join(str(v) for v in NIR_MIN_VERSION)
    try:
        import nir
    except ImportError as exc:
        raise ImportError(f"{what} needs the nir package >= {need}: pip install 'nir>={need}' "
                          f"(or snnquant[export])") from exc
    version = getattr(nir, "__version__", None) or getattr(nir, "version", None)
    if version is None or _version_tuple(version) < NIR_MIN_VERSION:
        raise ImportError(f"{what} needs nir >= {need} (IF/LIF nodes with v_reset), found nir "
                          f"{version}: pip install --upgrade 'nir>={need}'. (sinabs and "
                          f"rockpool[nir] pin nir <= 1.0.4; install them in another environment)")
    return nir
