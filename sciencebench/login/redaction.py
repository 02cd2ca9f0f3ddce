"""Redaction: what of a Pier command line or a record may be printed or stored.

Every `--agent-env` value becomes `<redacted>`; a `KEY=value` whose key looks
sensitive becomes `KEY=<redacted>`; an inline provider config becomes a
placeholder; finally every known secret value still present is masked.
"""

from __future__ import annotations

import re

from sciencebench.login.profiles import is_sensitive_key

REDACTED = "<redacted>"
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)=(.*)$", re.DOTALL)
_AGENT_ENV_FLAGS = ("--ae", "--agent-env")
_CONFIG_KWARGS = ("config_toml", "config_toml_file")


def redact_argv(argv: list[str], secrets: list[str] | None = None) -> list[str]:
    """Return argv safe to print or record.

    Every `--agent-env` value becomes `<redacted>`; any `KEY=value` whose key
    looks sensitive (key, token, secret, password, authorization) becomes
    `KEY=<redacted>`; a provider config passed inline is replaced by a
    placeholder; finally any known secret value still present is masked.
    """
    out: list[str] = []
    previous = ""
    for arg in argv:
        redacted = arg
        match = _ASSIGNMENT.match(arg)
        if (previous in _AGENT_ENV_FLAGS and match) or (match and is_sensitive_key(match.group(1))):
            redacted = f"{match.group(1)}={REDACTED}"
        elif match and match.group(1) in _CONFIG_KWARGS:
            redacted = f"{match.group(1)}=<generated provider config>"
        out.append(redacted)
        previous = arg
    return [mask_secrets(arg, secrets or []) for arg in out]


def mask_secrets(text: str, secrets: list[str]) -> str:
    """Replace every occurrence of each (non-trivial) secret value in text."""
    for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text
