"""Package discovery: every code package under meshplan/ is found, never listed by hand (the metadata is in
pyproject.toml). The card and skill folders live at the repo root for readers and install as data packages."""

from setuptools import find_packages, setup

DATA_PACKAGES = {"meshplan.cards_data": "cards", "meshplan.skills": "skills"}

setup(
    packages=[*find_packages(include=["meshplan", "meshplan.*"]), *DATA_PACKAGES],
    package_dir=DATA_PACKAGES,
)
