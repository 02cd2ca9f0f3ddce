"""The verifier in the agent's container starts clean: no process of the agent's, an empty log dir.

Pier runs a same-container verifier right after the agent, in the same
container, and reads /logs/verifier afterwards: a reward file the agent
planted there, or a process it left rewriting one, would be the result.
When Pier uploads the tests (the verifier's first step), every process not
present at start is ended (stopped, then killed) and /logs/verifier is made
anew, empty, mode 0755, owned by root or the verifier's own user. A separate
verifier needs none of it: it is a new container that gets only the artifacts.
"""

from __future__ import annotations

import asyncio
import posixpath
import shlex
from pathlib import Path
from typing import Any

from docker.errors import DockerException
from requests import RequestException

from sciencebench.core.errors import PolicyViolation
from sciencebench.network.policycompose import PolicyComposeEnvironment

# Rounds of finding and killing the agent's processes before giving up (a fork
# bomb outrunning the kills): the verifier then does not run.
END_ROUNDS = 1000
VERIFIER_DIR_MODE = "755"

# `pid:starttime` of every process but this shell: the start time (stat's
# field 22) tells a process from a later one that reuses its pid.
_LIST_PROCESSES = r"""
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  [ "$p" = "$$" ] && continue
  { read -r s < "$d/stat"; } 2>/dev/null || continue
  set -- ${s##*) }
  printf '%s:%s\n' "$p" "${20}"
done
"""

# Stop and kill every live process but PID 1, this shell and the kept ones,
# round after round until none is left.
_END_PROCESSES = r"""
scan() {
  pids=
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    { [ "$p" = "$$" ] || [ "$p" = 1 ]; } && continue
    { read -r s < "$d/stat"; } 2>/dev/null || continue
    set -- ${s##*) }
    case "$1" in Z|X|x) continue ;; esac
    case "$keep" in *" $p:${20} "*) continue ;; esac
    pids="$pids $p"
  done
}
n=0
while :; do
  scan
  [ -z "$pids" ] && break
  n=$((n + 1))
  if [ "$n" -gt "$rounds" ]; then echo "processes still running:$pids" >&2; exit 3; fi
  kill -STOP $pids 2>/dev/null
  kill -KILL $pids 2>/dev/null
done
"""


def end_and_reset_script(keep: list[str], verifier_dir: str, owner: str) -> str:
    """The root shell script of the hand-over: end every process not in `keep`, then remake `verifier_dir`.

    `keep` holds `pid:starttime` entries (`_LIST_PROCESSES`'s output at start);
    `owner` is what `chown` gets (a user name, a uid or `uid:gid`).
    """
    directory, who = shlex.quote(verifier_dir), shlex.quote(owner)
    return (
        f"keep={shlex.quote(' ' + ' '.join(keep) + ' ')}\nrounds={END_ROUNDS}\n"
        + _END_PROCESSES
        + f"rm -rf {directory} && mkdir -p {directory} && chown {who} {directory}"
        f" && chmod {VERIFIER_DIR_MODE} {directory}\n"
    )


class VerifierHandoffEnvironment(PolicyComposeEnvironment):
    """Ends the agent's processes and empties /logs/verifier before a same-container verifier runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._start_processes: list[str] | None = None
        super().__init__(*args, **kwargs)

    def _note_start_processes(self) -> None:
        """Remember what runs before the agent's setup (PID 1 and its `sleep`, a task's services)."""
        output = self._root_exec(_LIST_PROCESSES, "the processes at start could not be listed")
        self._start_processes = [line for line in output.split() if line]

    def _root_exec(self, script: str, what: str) -> str:
        """Run `script` with `sh` as root in `main` through the Engine; its stdout, or PolicyViolation."""
        try:
            container = self._client().containers.get(self._main_container())
            result = container.exec_run(["sh", "-c", script], user="0", demux=True)
        except (DockerException, RequestException, RuntimeError) as exc:
            raise PolicyViolation([f"{what}: {exc}"]) from exc
        output: Any = result.output  # (stdout, stderr) with demux
        stdout, stderr = output or (None, None)
        if result.exit_code != 0:
            detail = (stderr or b"").decode(errors="replace").strip()[:500]
            raise PolicyViolation([f"{what} (exit {result.exit_code}): {detail}"])
        return (stdout or b"").decode(errors="replace")

    def _verifier_owner(self) -> str:
        """Who gets the new /logs/verifier: the verifier's user (Pier's default user), else the image's."""
        user: object = self.default_user
        if user is None:
            container = self._client().containers.get(self._main_container())
            user = (container.attrs.get("Config") or {}).get("User")
        return str(user).strip() if user not in (None, "") else "0"

    def _hand_over_to_verifier(self) -> None:
        if self._start_processes is None:
            raise PolicyViolation(["the processes at start were never listed: no clean verifier"])
        try:
            owner = self._verifier_owner()
        except (DockerException, RequestException, RuntimeError) as exc:
            raise PolicyViolation([f"the verifier's user could not be found: {exc}"]) from exc
        script = end_and_reset_script(self._start_processes, str(self.env_paths.verifier_dir), owner)
        self._root_exec(script, "the agent's processes could not be ended or /logs/verifier remade")

    def _is_tests_upload(self, target_dir: str) -> bool:
        return not self._is_windows_container and posixpath.normpath(target_dir) == str(
            self.env_paths.tests_dir
        )

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copy a host directory in; the tests' upload (Pier's verifier starting here) first hands over.

        Raises PolicyViolation when the agent's processes cannot all be ended
        or /logs/verifier cannot be remade: the verifier then does not run.
        """
        if self._is_tests_upload(str(target_dir)):
            await asyncio.to_thread(self._hand_over_to_verifier)
        await super().upload_dir(source_dir, target_dir)
