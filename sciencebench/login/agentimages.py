"""Which baked agent image each trial runs, decided at submit from the recorded file alone.

Offline workers cannot run Pier's agent installers, so a job whose harness
Pier would install (codex, claude-code, mini-swe-agent, ...) needs, for
every task, the task image with that agent baked in
(`sciencebench images bake`, recorded in `<selection>/.sciencebench/agent-images.json`).
A missing one is refused here with one line (exit 2) instead of failing an
install on every worker. This module reads that file and nothing else: the
login node never talks to Docker.

`SCIENCEBENCH_AGENT_INSTALL=pier` turns the requirement off, for clusters
whose workers may let Pier install agents at trial time; recorded images
are still used where they exist.
"""

from __future__ import annotations

import os

from sciencebench.core.agentimages import (
    AGENT_ADAPTERS,
    AGENT_INSTALL_ENV,
    PIER_INSTALLED_AGENTS,
    BakedImage,
    agent_images_path,
    load_agent_images,
)
from sciencebench.core.errors import ProfileError
from sciencebench.core.models import AgentPlan
from sciencebench.login.selection import Selection

_LISTED = 3  # task ids named in an error line before "..."


def _ids(task_ids: list[str]) -> str:
    shown = ", ".join(task_ids[:_LISTED])
    return shown + (", ..." if len(task_ids) > _LISTED else "")


def _required(plan: AgentPlan, dry_run: bool) -> bool:
    """Whether Pier's own installer would run for this plan (and may not)."""
    if dry_run or os.environ.get(AGENT_INSTALL_ENV, "baked") == "pier":
        return False
    return plan.harness in PIER_INSTALLED_AGENTS and (
        plan.agent_import_path is None or plan.agent_import_path in AGENT_ADAPTERS
    )


def _bake_hint(selection: Selection, plan: AgentPlan, version: str | None) -> str:
    flag = f" --agent-version {version}" if version else ""
    return (
        f"sciencebench images bake --path {selection.path} --agent {plan.harness}{flag} "
        "--registry HOST[:PORT]"
    )


def resolve_agent_images(
    selection: Selection, plan: AgentPlan, *, dry_run: bool = False
) -> tuple[AgentPlan, dict[str, BakedImage]]:
    """The baked image of every task (task id -> image) and the plan pinned to their version.

    The version asked for is the agent keyword `version` (CODEX_VERSION for
    codex); none or `latest` means the one version baked. The plan gains that
    `version` keyword, so Pier records it. For codex the wire API must be one
    the baked binary accepts (probed when it was baked).

    Raises ProfileError (exit 2) naming the fix when a required image is
    missing (not for a `dry_run`, which shows what would run, as it does
    without a credential), several versions would fit, the record is
    unreadable, or the baked Codex refuses the wire API.
    """
    if plan.harness not in PIER_INSTALLED_AGENTS:
        return plan, {}
    required = _required(plan, dry_run)
    path = agent_images_path(selection.path)
    try:
        record = load_agent_images(path)
    except ValueError as exc:
        raise ProfileError(str(exc)) from None
    requested = plan.agent_kwargs.get("version")
    wanted = None if requested in (None, "", "latest") else requested
    chosen: dict[str, BakedImage] = {}
    missing: list[str] = []
    for task_id in selection.task_ids:
        found = record.find(selection.tasks[task_id].agent_image, plan.harness, wanted)
        if len({image.version for image in found}) > 1:
            several = ", ".join(sorted({image.version for image in found}))
            raise ProfileError(
                f"task {task_id}: {plan.harness} is baked in several versions ({several}); choose one with "
                + ("CODEX_VERSION in --env-file" if plan.harness == "codex" else "--agent-kwarg version=")
            )
        if found:
            chosen[task_id] = found[0]
        elif required:
            missing.append(task_id)
    if missing:
        what = f"{plan.harness} {wanted}" if wanted else plan.harness
        raise ProfileError(
            f"no baked {what} image for task(s) {_ids(missing)} (offline workers cannot install agents); "
            f"run `{_bake_hint(selection, plan, wanted)}`"
        )
    versions = sorted({image.version for image in chosen.values()})
    if len(versions) > 1:
        raise ProfileError(
            f"the selection's tasks have {plan.harness} baked in different versions ({', '.join(versions)}); "
            f"re-run `{_bake_hint(selection, plan, versions[-1])}`"
        )
    if not chosen:
        return plan, {}
    version = versions[0]
    if plan.harness == "codex":
        _check_wire_api(plan, version, list(chosen.values()))
    kwargs = dict(plan.agent_kwargs)
    kwargs["version"] = version
    return plan.model_copy(update={"agent_kwargs": kwargs}), chosen


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
