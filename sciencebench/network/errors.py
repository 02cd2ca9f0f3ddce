"""The two ways the network policy stops a trial (both are PolicyError).

    PolicyError                 (sciencebench.core.errors)
    ├── PolicyRefused           refused before anything started: the task
    │                           allows internet, a gateway URL or the proxy
    │                           image is unusable, a compose task wants egress
    ├── PolicyViolation         the started containers and networks do not
    │                           match the policy; the environment was stopped
    └── TransferRefused         a copy to the host refused what a container
                                wrote (a link, a device, over the size bound)

    AgentImageMismatch          (a RuntimeError) the baked image named is for
                                another agent or version

Pier records the class name and message of either in the trial's
`result.json` (`exception_info`), so messages name every failed check.
"""

from __future__ import annotations

from collections.abc import Sequence

from sciencebench.core.errors import PolicyError


class PolicyRefused(PolicyError):
    """The trial cannot run under the offline network policy; nothing was started."""


class PolicyViolation(PolicyError):
    """Inspection found deviations from the policy; `violations` lists each failed check."""

    def __init__(self, violations: Sequence[str]) -> None:
        self.violations = list(violations)
        super().__init__(
            f"network policy inspection failed ({len(self.violations)} check(s)): "
            + "; ".join(self.violations)
        )

    def __reduce__(self) -> tuple[type[PolicyViolation], tuple[list[str]]]:
        # Exceptions pickle through their args; ours takes the list, not the message.
        return (type(self), (self.violations,))


class TransferRefused(PolicyError):
    """A copy between a container and the host refused what the container wrote (a link, a device, ...).

    `refusals` names each refused item (`network.transfer.Refusal`, or a string).
    """

    def __init__(self, refusals: Sequence[object]) -> None:
        self.refusals = list(refusals)
        shown = "; ".join(str(r) for r in self.refusals[:10])
        more = f"; and {len(self.refusals) - 10} more" if len(self.refusals) > 10 else ""
        super().__init__(f"host-side transfer refused {len(self.refusals)} item(s): {shown}{more}")

    def __reduce__(self) -> tuple[type[TransferRefused], tuple[list[object]]]:
        return (type(self), (self.refusals,))


class AgentImageMismatch(RuntimeError):
    """The `agent_image` keyword names an image baked for another agent or version."""
