"""Version strings as engines and tools print them (pure)."""

from __future__ import annotations

import re

# major[.minor[.patch]], then the end or a suffix (`+dfsg4`, `-rc.1`).
_VERSION = re.compile(r"^v?(\d+)(?:\.(\d+)(?:\.(\d+))?)?(?=$|[.+~\-\s])")


def parse_version(text: str) -> tuple[int, int, int] | None:
    """`(major, minor, patch)` of `28.5.2`, `28.5.2+dfsg4`, `v2.40.3-3`, `28.0`, `27`; None otherwise."""
    match = _VERSION.match(text.strip())
    if not match:
        return None
    return int(match.group(1)), int(match.group(2) or 0), int(match.group(3) or 0)
