"""The two ways the network policy stops a trial (both are PolicyError).

    PolicyError                 (sciencebench.core.errors)
    ├── PolicyRefused           refused before anything started: the task
    │                           allows internet, a gateway URL or the proxy
    │                           image is unusable, a compose task wants egress
    └── PolicyViolation         the started containers and networks do not
                                match the policy; the environment was stopped

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
