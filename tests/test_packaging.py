"""pyproject.toml's requirements against the installed distributions: every pinned range holds what the
tests run on, and every extra asked of a dependency is one it provides (else `pip install -e .` warns
"... does not provide the extra ...", see issue 17)."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def declared_requirements() -> list[Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    texts = project["dependencies"] + project["optional-dependencies"]["test"]
    return [Requirement(text) for text in texts]


@pytest.mark.parametrize("requirement", declared_requirements(), ids=str)
def test_the_installed_version_is_in_the_declared_range(requirement):
    installed = metadata.version(requirement.name)
    assert requirement.specifier.contains(installed, prereleases=True), f"{requirement.name} {installed}"


@pytest.mark.parametrize("requirement", [r for r in declared_requirements() if r.extras], ids=str)
def test_every_requested_extra_is_provided_under_that_exact_name(requirement):
    provided = metadata.metadata(requirement.name).get_all("Provides-Extra") or []
    assert requirement.extras <= set(provided), f"{requirement.name} provides {provided}"


def test_the_latex_parser_runtime_is_declared_directly():
    names = {canonicalize_name(r.name) for r in declared_requirements()}
    assert "antlr4-python3-runtime" in names
