"""pyproject.toml's requirements against the installed distributions: every pinned range holds what the
tests run on, and every extra asked of a dependency is one it provides (else `pip install -e .` warns
"... does not provide the extra ...", see issue 17)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
import tomllib
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


def test_the_lab_ships_and_its_commands_are_the_entry_point_the_cli_falls_back_to():
    from specscale import cli

    config = tomllib.loads(PYPROJECT.read_text())
    assert {"specscale_lab", "specscale_lab.*"} <= set(config["tool"]["setuptools"]["packages"]["find"]["include"])
    target = config["project"]["entry-points"][cli.COMMAND_GROUP]["lab"]
    assert target == f"{cli.FALLBACK_COMMAND_MODULE}:add_commands"


def test_the_cli_keeps_every_command_through_either_seam(monkeypatch):
    from specscale import cli
    from specscale_lab.commands import add_commands

    def commands() -> set[str]:
        return set(cli.build_parser()._subparsers._group_actions[0].choices)

    system = {"profile-prm", "profile-decode", "kernels", "serve"}
    expected = system | {"generate", "solve", "bench", "eval", "simulate", "trace"}
    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    assert commands() == expected  # no entry points installed: the lab module by name
    point = metadata.EntryPoint("lab", f"{cli.FALLBACK_COMMAND_MODULE}:add_commands", cli.COMMAND_GROUP)
    monkeypatch.setattr(cli, "entry_points", lambda group: [point] if group == cli.COMMAND_GROUP else [])
    assert point.load() is add_commands and commands() == expected
    monkeypatch.setattr(cli, "FALLBACK_COMMAND_MODULE", "no_such_lab.commands")
    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    assert commands() == system  # the system alone
