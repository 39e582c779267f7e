"""Print constraints.txt: every package of this environment at its installed version.

``make constraints`` runs it in .venv after a deliberate upgrade and a green ``make test``;
the Makefile then installs through the file, so a fresh clone tests with the versions CI
tested. The project itself is left out (it is installed editable), and so are local version
labels (``torch 2.13.0+cpu`` is pinned as ``2.13.0``: which build pip picks is the README's
business). Each pin applies from the Python it was made with upwards, since NumPy 2.4 and its
peers have no wheels for older ones: there the ranges of pyproject.toml decide.
"""

import importlib.metadata
import platform
import re

OWN = "minigrad-decoder"


def canonical(name: str) -> str:
    """PEP 503's normalised name: ``Jinja2`` and ``jinja2``, ``typing_extensions`` and
    ``typing-extensions`` are one package.

    >>> canonical("typing_extensions"), canonical("Jinja2")
    ('typing-extensions', 'jinja2')
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> list[str]:
    python = ".".join(platform.python_version_tuple()[:2])
    found = {}
    for dist in importlib.metadata.distributions():
        name = canonical(dist.metadata["Name"])
        if name not in (OWN, "pip", "setuptools", "wheel"):
            found[name] = dist.version.split("+")[0]
    return [f'{name}=={found[name]} ; python_version >= "{python}"' for name in sorted(found)]


if __name__ == "__main__":
    print("# Written by `make constraints` (tests/support/constraints.py): the versions the")
    print("# suite was last green with; every install of the Makefile goes through this file.")
    print("\n".join(pins()))
