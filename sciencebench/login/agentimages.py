"""Which baked agent image each trial runs, decided at submit from the recorded file alone.

A job whose harness Pier installs (codex, claude-code, mini-swe-agent, ...)
runs, for every task that has one, the task image with that agent baked in
(`sciencebench images bake`, recorded in `<selection>/.sciencebench/agent-images.json`).
A task without one needs a host that lets Pier install the agent online,
as the original runner's hosts do: `login.cluster` checks that some host
would (`worker --agent-install online`, the default), else the submit is
refused in one line naming both ways out. This module reads the record
and nothing else: the login node never talks to Docker.
"""

from __future__ import annotations

from dataclasses import dataclass

from sciencebench.core.agentimages import BakedImage, load_agent_images
from sciencebench.core.errors import ProfileError
from sciencebench.core.harnesses import adapters, find, installed_by_pier
from sciencebench.core.models import AgentPlan
from sciencebench.core.paths import SelectionPaths
from sciencebench.login.selection import Selection

_LISTED = 3  # task ids named in an error line before "..."


def _ids(task_ids: list[str]) -> str:
    shown = ", ".join(task_ids[:_LISTED])
    return shown + (", ..." if len(task_ids) > _LISTED else "")


def _installed_by_pier(plan: AgentPlan) -> bool:
    """Whether Pier's own installer runs for this plan's agent where no baked image replaces it."""
    return installed_by_pier(plan.harness) and (
        plan.agent_import_path is None or plan.agent_import_path in adapters()
    )


def _bake_hint(selection: Selection, plan: AgentPlan, version: str | None) -> str:
    flag = f" --agent-version {version}" if version else ""
    return (
        f"sciencebench images bake --path {selection.path} --agent {plan.harness}{flag} "
        "--registry HOST[:PORT]"
    )


@dataclass(frozen=True)
class AgentImagesPlan:
    """The plan pinned to the baked version, each task's baked image, and the tasks Pier must install on."""

    plan: AgentPlan
    images: dict[str, BakedImage]
    missing: list[str]  # task ids with no baked image whose agent Pier installs (an online install)
    hint: str  # the bake command that would give them one

    def missing_line(self) -> str:
        """What is missing, and the bake command: the first half of the refusal `login.cluster` makes."""
        version = self.plan.agent_kwargs.get("version")
        what = f"{self.plan.harness} {version}" if version not in (None, "", "latest") else self.plan.harness
        return f"no baked {what} image for task(s) {_ids(self.missing)} (`{self.hint}`)"


def resolve_agent_images(selection: Selection, plan: AgentPlan) -> AgentImagesPlan:
    """The baked image of every task that has one, the plan pinned to their version, and what is missing.

    The version asked for is the agent keyword `version` (CODEX_VERSION for
    codex); none or `latest` means the one version baked. The plan gains that
    `version` keyword, so Pier records it. For codex the wire API must be one
    the baked binary accepts (probed when it was baked). Tasks without a
    baked image are listed in `missing` (their agent is installed by Pier,
    online) for `login.cluster` to check a host would.

    Raises ProfileError (exit 2) naming the fix when several versions would
    fit, the record is unreadable, or the baked Codex refuses the wire API.
    """
    requested = plan.agent_kwargs.get("version")
    wanted = None if requested in (None, "", "latest") else requested
    hint = _bake_hint(selection, plan, wanted)
    harness = find(plan.harness)
    if harness is None or not harness.installed_by_pier:
        return AgentImagesPlan(plan, {}, [], hint)
    path = SelectionPaths(selection.path).agent_images
    try:
        record = load_agent_images(path)
    except ValueError as exc:
        raise ProfileError(str(exc)) from None
    chosen: dict[str, BakedImage] = {}
    missing: list[str] = []
    for task_id in selection.task_ids:
        found = record.find(selection.tasks[task_id].agent_image, plan.harness, wanted)
        if len({image.version for image in found}) > 1:
            several = ", ".join(sorted({image.version for image in found}))
            raise ProfileError(
                f"task {task_id}: {plan.harness} is baked in several versions ({several}); choose one with "
                + harness.version_hint
            )
        if found:
            chosen[task_id] = found[0]
        elif _installed_by_pier(plan):
            missing.append(task_id)
    versions = sorted({image.version for image in chosen.values()})
    if len(versions) > 1:
        raise ProfileError(
            f"the selection's tasks have {plan.harness} baked in different versions ({', '.join(versions)}); "
            f"re-run `{_bake_hint(selection, plan, versions[-1])}`"
        )
    if not chosen:
        return AgentImagesPlan(plan, {}, missing, hint)
    version = versions[0]
    if harness.bake is not None and harness.bake.wire_api_probe:
        _check_wire_api(plan, version, list(chosen.values()))
    kwargs = dict(plan.agent_kwargs)
    kwargs["version"] = version
    return AgentImagesPlan(plan.model_copy(update={"agent_kwargs": kwargs}), chosen, missing, hint)


def _check_wire_api(plan: AgentPlan, version: str, images: list[BakedImage]) -> None:
    wire_api = plan.agent_kwargs.get("wire_api") or (plan.provider.protocol if plan.provider else "responses")
    for image in images:
        if image.wire_apis is not None and wire_api not in image.wire_apis:
            accepted = " or ".join(image.wire_apis)
            raise ProfileError(
                f"CODEX_WIRE_API={wire_api}: the baked Codex {version} accepts only wire_api={accepted} "
                "(it refuses chat when it loads its configuration); use responses, with a Responses "
                "bridge such as LiteLLM in front of a chat-only upstream (docs/gateways.md)"
            )


def trial_image_refs(refs: list[str], baked: BakedImage | None) -> list[str]:
    """A trial's images: the baked image in place of its task's agent image.

    The worker's pull stage then pulls (or, with --skip-pull, checks) the
    image the trial really runs; a verifier image stays.
    """
    if baked is None:
        return list(refs)
    swapped = [baked.image if ref == baked.base_image else ref for ref in refs]
    if baked.image not in swapped:
        swapped.insert(0, baked.image)
    return list(dict.fromkeys(swapped))
