"""Package discovery: every code package under meshplan/ is found, never listed by hand (the metadata is in
pyproject.toml). The card and skill folders live at the repo root for readers and install as data packages."""

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

DATA_PACKAGES = {"meshplan.cards_data": "cards", "meshplan.skills": "skills"}


class FreshBuildPy(build_py):
    """Copies the package into an emptied build/lib/meshplan: setuptools only adds files there, so a module moved
    or deleted since an earlier build in this checkout would otherwise still ship in the wheel."""

    def run(self) -> None:
        shutil.rmtree(Path(self.build_lib) / "meshplan", ignore_errors=True)
        super().run()


setup(
    packages=[*find_packages(include=["meshplan", "meshplan.*"]), *DATA_PACKAGES],
    package_dir=DATA_PACKAGES,
    cmdclass={"build_py": FreshBuildPy},
)
