"""The layouts of core/paths.py: one object per tree, and no other module spells their names."""

from __future__ import annotations

import ast
import os
import uuid
from pathlib import Path

import pytest

from sciencebench.core.paths import JobPaths, ScratchPaths, SelectionPaths, open_job_dir
from sciencebench.core.settings import Settings
from tests.fixtures.source import package_nodes

pytestmark = pytest.mark.unit

# Names of the trees' files and directories: only core/paths.py spells them.
LAYOUT_NAMES = frozenset({
    ".sciencebench", "batch-run.json", "agent-images.json", ".agent-images.lock", "superseded", "scratch",
})  # fmt: skip


def test_a_selection_keeps_its_files_under_its_own_meta_directory(tmp_path: Path) -> None:
    paths = SelectionPaths(tmp_path / "sel")
    assert paths.task_dir("002") == tmp_path / "sel" / "task_002"
    assert paths.run_record == tmp_path / "sel" / "batch-run.json"
    assert paths.secrets_dir == tmp_path / "sel" / ".sciencebench" / "secrets"
    assert paths.agent_images == tmp_path / "sel" / ".sciencebench" / "agent-images.json"
    assert paths.agent_images_lock.parent == paths.agent_images.parent


def test_a_job_names_every_file_of_its_directory(tmp_path: Path) -> None:
    paths = JobPaths(tmp_path, "j")
    assert paths.config_json == tmp_path / "j" / "config.json"
    assert paths.superseded_dir == tmp_path / "j" / ".sciencebench" / "superseded"
    assert paths.trial_record("002", 3) == tmp_path / "j" / ".sciencebench" / "trials" / "002-3.json"
    assert paths.parts(paths.superseded_dir) == (".sciencebench", "superseded")


def test_open_job_dir_takes_one_of_the_jobs_directories(tmp_path: Path) -> None:
    paths = JobPaths(tmp_path, "j")
    fd = open_job_dir(paths, paths.superseded_dir, create=True)
    try:
        assert os.path.samestat(os.fstat(fd), paths.superseded_dir.stat())
    finally:
        os.close(fd)


def test_scratch_is_per_job_id_then_per_run_then_per_try(tmp_path: Path) -> None:
    job_id = uuid.uuid4()
    scratch = ScratchPaths(tmp_path)
    run = scratch.trial_dir(job_id, "002", 1, "host.7")
    assert run == tmp_path / str(job_id) / "002-1.host.7"
    assert run.parent == scratch.job_dir(job_id)
    assert ScratchPaths.try_dir(run, 2) == run / "try-2"
    settings = Settings.from_env({"SCIENCEBENCH_STATE_DIR": str(tmp_path)})
    assert settings.scratch_root == ScratchPaths.under(tmp_path).root == tmp_path / "scratch"


def test_only_core_paths_spells_the_layouts_names() -> None:
    spelled = [
        f"{module}:{getattr(node, 'lineno', '?')}: {node.value!r}"
        for module, nodes in package_nodes().items()
        if module != "sciencebench/core/paths.py"
        for node in nodes
        if isinstance(node, ast.Constant) and node.value in LAYOUT_NAMES
    ]
    assert spelled == []
