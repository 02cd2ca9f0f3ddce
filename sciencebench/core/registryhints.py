"""What a registry's answers say: a refused pull's cause, and the wait the registry asks for.

The Docker Engine turns a registry's refusal into an error message (its API
answers 500 with the registry's text, e.g. "toomanyrequests: You have
reached your pull rate limit"), so the cause is read from the message
(`refusal_status`). The wait comes from the registry's own headers, read on
a manifest HEAD (free on Docker Hub): `Retry-After` (seconds or an HTTP
date), else `ratelimit-remaining` / `ratelimit-limit` (`100;w=21600`: 100
manifest GETs per 21,600 s window), see `hint_sec`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

# Engine and registry phrases of a registry in trouble -> the status a record keeps. Order matters:
# a rate limit names itself; a 5xx is named by its code; then the transport's failures.
_REFUSALS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"toomanyrequests|too many requests|\b429\b|rate limit", re.I), "429"),
    (
        re.compile(r"\b(5\d\d) (?:internal server error|bad gateway|service unavailable|gateway time)", re.I),
        "",
    ),
    (re.compile(r"(?:status|status code|http status)[: ]+(5\d\d)\b", re.I), ""),
    (re.compile(r"connection reset|reset by peer|unexpected eof|\bEOF\b", re.I), "reset"),
    (re.compile(r"connection refused", re.I), "refused"),
    (re.compile(r"timeout|timed out|deadline exceeded", re.I), "timeout"),
)


def refusal_status(message: str) -> str | None:
    """The status of a pull the registry refused ("429", "503", "reset", "refused", "timeout"), else None.

    None for anything else (a manifest unknown, a denied pull, a full disk):
    those are the trial's or the host's, not the registry's pushing back.
    """
    for pattern, status in _REFUSALS:
        found = pattern.search(message)
        if found:
            return status or found.group(1)
    return None


def parse_retry_after(value: str, now: float) -> float | None:
    """Seconds a `Retry-After` value asks to wait (seconds, or an HTTP date against `now`), or None."""
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


def parse_ratelimit(value: str) -> tuple[int, float | None] | None:
    """A RateLimit header's count and window (`100;w=21600` -> (100, 21600.0)); None if unreadable."""
    head, *params = (part.strip() for part in value.split(";"))
    if not head.isdigit():
        return None
    window = None
    for param in params:
        name, _, number = param.partition("=")
        if name.strip().lower() == "w":
            try:
                window = float(number)
            except ValueError:
                return None
            if window <= 0:
                return None
    return int(head), window


def hint_sec(headers: Mapping[str, str], now: float) -> float | None:
    """The wait a registry's response headers ask for; None when they name none.

    `Retry-After` wins. Else, with no manifest GETs left (`ratelimit-remaining`
    0) in a window of `w` seconds for `limit` GETs, one GET frees up in about
    `w / limit` seconds on a sliding window (Docker Hub's); without a limit,
    the whole window. Remaining GETs, or no such headers: None.
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    if "retry-after" in lowered:
        wait = parse_retry_after(lowered["retry-after"], now)
        if wait is not None:
            return wait
    remaining = parse_ratelimit(lowered.get("ratelimit-remaining", ""))
    if remaining is None or remaining[0] > 0:
        return None
    limit = parse_ratelimit(lowered.get("ratelimit-limit", ""))
    window = remaining[1] or (limit[1] if limit else None)
    if window is None:
        return None
    if limit is not None and limit[0] > 0:
        return window / limit[0]
    return window
