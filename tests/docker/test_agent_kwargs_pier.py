"""A credential-looking `--agent-kwarg` reaches real Pier, on no command line, and leaves no trace in the job.

`submit --local` runs the worker's trial code with real Pier 0.3.0 on the
real Engine (agent nop: Pier builds the agent from the job's keywords like
any other). While the trial runs, every process's command line on the host is
sampled, and Pier's own job and trial `config.json` in the private scratch
directory are read: Pier was given the values. Pier is found by its working
directory: forked warm from the zygote, its command line is a title cut to
the zygote's own; exec'd cold, it is whole. Both starts are tried. Afterwards no file of the job
or of the selection holds them, and the run record shows `KEY=<redacted>`.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.services import VENV_BIN

pytestmark = pytest.mark.docker

CANARY = "sk-canary-PIERKWARG-7c41e9"
THINKING = "16093"  # max_thinking_tokens: credential-looking by name, a number by value


class Watch:
    """Samples every command line on the host and Pier's config files in the job's scratch directory."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.submit_pid: int | None = None  # the user's own command line holds the values, as the original's
        self.hits: list[str] = []
        self.pier_cmdlines: list[str] = []
        self.pier_kwargs: list[dict[str, Any]] = []
        self.scratch_modes: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample_processes(self) -> None:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == self.submit_pid:
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if CANARY in cmdline or "max_thinking_tokens" in cmdline:
                self.hits.append(cmdline[:300])
            if " run " in cmdline and self._in_scratch(proc):
                self.pier_cmdlines.append(cmdline)

    def _in_scratch(self, proc: Path) -> bool:
        """Whether the process works in the scratch directory, as Pier does."""
        try:
            return Path(os.readlink(proc / "cwd")).is_relative_to(self.scratch)
        except OSError:
            return False

    def _sample_configs(self) -> None:
        for config in self.scratch.glob("*/*/try-*/job/**/config.json"):
            try:
                data = json.loads(config.read_text())
            except (OSError, ValueError):
                continue
            agents = data.get("agents") or [data.get("agent")]
            self.pier_kwargs += [agent["kwargs"] for agent in agents if isinstance(agent, dict)]
        for try_dir in self.scratch.glob("*/*/try-*"):
            try:
                self.scratch_modes.add(stat.S_IMODE(try_dir.stat().st_mode))
            except OSError:
                continue

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample_processes()
            self._sample_configs()
            self._stop.wait(0.05)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _files_holding(root: Path, needles: tuple[str, ...]) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            text = path.read_bytes().decode(errors="replace")
            found += [f"{path.relative_to(root)}: {needle}" for needle in needles if needle in text]
    return found


@pytest.mark.parametrize("warm", ["1", "0"], ids=["warm", "cold"])
def test_a_credential_looking_kwarg_reaches_pier_on_no_command_line(
    warm: str, demo_selection: Path, tmp_path: Path, state_dir: Path
) -> None:
    jobs = tmp_path / "jobs"
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        "SCIENCEBENCH_STATE_DIR": str(state_dir),
        "SCIENCEBENCH_WARM_PIER": warm,  # forked from the zygote (its title, cut short) or exec'd
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    argv = [
        str(VENV_BIN / "sciencebench"), "submit", "--local", "--path", str(demo_selection),
        "--task-id", "001", "--agent", "nop", "--agent-kwarg", f"api_key={CANARY}",
        "--agent-kwarg", f"max_thinking_tokens={THINKING}", "--agent-kwarg", "plain_setting=visible",
        "--jobs-dir", str(jobs), "--job-name", "kwargs",
    ]  # fmt: skip
    watch = Watch(state_dir / "scratch")  # the host-local scratch of every job: `*/` is a job id
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch.submit_pid = proc.pid  # before the first sample; Pier starts seconds later
    with watch:
        out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-2000:] + err[-2000:]

    # Pier ran from the private config file and was given the values ...
    assert watch.pier_cmdlines, "the Pier process was never seen"
    assert {
        "api_key": CANARY,
        "max_thinking_tokens": int(THINKING),
        "plain_setting": "visible",
    } in watch.pier_kwargs
    assert watch.scratch_modes == {0o700}
    # ... which no command line on the host ever showed.
    assert watch.hits == []
    pier_argv = shlex.split(watch.pier_cmdlines[0])
    assert not {"--ak", "--agent-kwarg", "--agent", "--model"} & set(pier_argv)
    if warm == "0":  # an exec'd Pier's command line is whole
        assert pier_argv[-2] == "--config" and Path(pier_argv[-1]).is_relative_to(state_dir / "scratch")

    # The job and the selection keep no trace of them; Pier's files show the keys redacted.
    job_dir = jobs / "kwargs"
    assert _files_holding(job_dir, (CANARY, THINKING)) == []
    assert _files_holding(demo_selection, (CANARY, THINKING)) == []
    record = json.loads((job_dir / ".sciencebench" / "trials" / "001-1.json").read_text())
    trial_dir = job_dir / record["trial_dir"]
    for name in ("config.json", "result.json"):
        data = json.loads((trial_dir / name).read_text())
        agent = data["agent"] if name == "config.json" else data["config"]["agent"]
        assert agent["kwargs"] == {
            "api_key": "<redacted>", "max_thinking_tokens": "<redacted>", "plain_setting": "visible",
        }  # fmt: skip
    command = json.loads((demo_selection / "batch-run.json").read_text())["pier_command"]
    assert "api_key=<redacted>" in command and "max_thinking_tokens=<redacted>" in command
