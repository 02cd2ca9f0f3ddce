"""core/settings.py owns every SCIENCEBENCH_* variable: no other module of the package names or reads one."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

import pytest

from sciencebench.core import settings as settings_module
from sciencebench.core.settings import ENV_PREFIX, Settings, env_name, raw_setting
from tests.fixtures.source import package_nodes

pytestmark = pytest.mark.unit

SETTINGS = "sciencebench/core/settings.py"
VARIABLE = re.compile(r"SCIENCEBENCH_[A-Z][A-Z0-9_]*")
# The ways Python reads the environment: os.environ[...], os.environ.get/pop/setdefault(...), os.getenv(...).
READERS = {"get", "pop", "setdefault", "getenv"}


def modules() -> Iterator[tuple[str, tuple[ast.AST, ...]]]:
    """Every module of the package but core/settings.py, with the nodes of its syntax tree."""
    for where, nodes in package_nodes().items():
        if where != SETTINGS:
            yield where, nodes


def is_environ(node: ast.expr) -> bool:
    """`os.environ` or a bare `environ`."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def names_a_variable(node: ast.expr) -> bool:
    """A literal SCIENCEBENCH_ name, a settings constant holding one, or a name built from ENV_PREFIX."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value.startswith(ENV_PREFIX)
    if isinstance(node, ast.Name | ast.Attribute):
        name = node.id if isinstance(node, ast.Name) else node.attr
        value = getattr(settings_module, name, None)
        return isinstance(value, str) and value.startswith(ENV_PREFIX)
    if isinstance(node, ast.JoinedStr | ast.BinOp):
        return any(names_a_variable(child) for child in ast.walk(node) if child is not node)
    return False


def environment_reads(nodes: tuple[ast.AST, ...]) -> Iterator[ast.expr]:
    """The key of every environment read among `nodes`."""
    for node in nodes:
        if isinstance(node, ast.Subscript) and is_environ(node.value):
            yield node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            func = node.func
            if func.attr in READERS and (is_environ(func.value) or func.attr == "getenv"):
                yield node.args[0]


def test_no_other_module_spells_a_variables_name() -> None:
    """Names are `env_name(field)` of core/settings.py; messages and docstrings may mention them in text."""
    spelled = [
        f"{where}:{node.lineno}: {node.value}"
        for where, nodes in modules()
        for node in nodes
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and VARIABLE.fullmatch(node.value)
    ]
    assert spelled == []


def test_no_other_module_reads_a_variable_from_the_environment() -> None:
    reads = [
        f"{where}:{key.lineno}: {ast.unparse(key)}"
        for where, nodes in modules()
        for key in environment_reads(nodes)
        if names_a_variable(key)
    ]
    assert reads == []


def test_no_other_module_builds_a_name_from_the_prefix() -> None:
    built = [
        f"{where}:{node.lineno}"
        for where, nodes in modules()
        for node in nodes
        if isinstance(node, ast.Name | ast.alias)
        and getattr(node, "id", getattr(node, "name", "")) == "ENV_PREFIX"
    ]
    assert built == []


def test_every_variable_the_package_mentions_is_a_setting() -> None:
    """A message or help text naming SCIENCEBENCH_X names a field of Settings."""
    mentioned = {
        match
        for nodes in package_nodes().values()
        for node in nodes
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        for match in VARIABLE.findall(node.value)
    }
    unknown = sorted(
        name for name in mentioned if name.removeprefix(ENV_PREFIX).lower() not in Settings.model_fields
    )
    assert unknown == []


def test_the_checks_find_a_read() -> None:
    """The scan sees the ways a module would read a variable behind settings' back."""
    tree = ast.walk(
        ast.parse(
            "import os\n"
            "from sciencebench.core.settings import PROXY_IMAGE_ENV\n"
            "a = os.environ.get(PROXY_IMAGE_ENV)\n"
            "b = os.environ['SCIENCEBENCH_X']\n"
            "c = os.getenv(f'{ENV_PREFIX}Y')\n"
            "d = os.environ.get('PATH')\n"
        )
    )
    assert [ast.unparse(key) for key in environment_reads(tuple(tree)) if names_a_variable(key)] == [
        "PROXY_IMAGE_ENV", "'SCIENCEBENCH_X'", "f'{ENV_PREFIX}Y'",
    ]  # fmt: skip


def test_one_setting_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_name("agent_artifacts") == "SCIENCEBENCH_AGENT_ARTIFACTS"
    with pytest.raises(KeyError):
        env_name("no_such_setting")
    monkeypatch.setenv("SCIENCEBENCH_PROXY_IMAGE", "reg/proxy@sha256:" + "0" * 64)
    monkeypatch.setenv("SCIENCEBENCH_BROKER_URL", "not a url")  # another variable's bad value does not matter
    assert raw_setting("proxy_image") == "reg/proxy@sha256:" + "0" * 64
    monkeypatch.delenv("SCIENCEBENCH_PROXY_IMAGE")
    assert raw_setting("proxy_image") == ""
