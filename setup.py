"""Ship the top-level profiles/ folder (model families as data) as package data.

The YAML lives at the repository's top level, where people look for it; setuptools maps
it into the installed package as specrun/profiles, where specrun.hub.profiles finds it.
pyproject.toml holds everything else.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["specrun", "specrun.*"]) + ["specrun.profiles"],
    package_dir={"specrun.profiles": "profiles"},
    package_data={"specrun.profiles": ["*.yaml"]},
)
