"""The package layout; the metadata, tools and entry points live in pyproject.toml.

The repository keeps the shipped tables and models in ``schedules/<machine>/`` at its top
level. A wheel has no repository beside it, so they are mapped into the package as
``ficco/_shipped/schedules/<machine>/`` (``ficco.shipped`` finds them in either place).
pyproject.toml cannot map a directory outside the package tree into the package, hence this
file. Only what commands read at run time is mapped: ``profiles/`` holds measurements and
notes (18 MB) that no command reads unless named.
"""

from pathlib import Path

from setuptools import find_namespace_packages, setup

SHIPPED = "ficco._shipped.schedules"
# one package per machine kind's directory, so each is a declared package, not stray data
SHIPPED_DIRS = {
    f"{SHIPPED}.{name}": f"schedules/{name}"
    for name in find_namespace_packages(where=str(Path(__file__).parent / "schedules"))
}

setup(
    packages=[*find_namespace_packages(include=["ficco", "ficco.*"]), *SHIPPED_DIRS],
    package_dir=SHIPPED_DIRS,
    package_data={"ficco.model": ["machines/*.json"], **dict.fromkeys(SHIPPED_DIRS, ["*.json"])},
)
