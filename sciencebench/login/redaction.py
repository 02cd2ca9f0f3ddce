"""Redaction: what of a Pier command line or a record may be printed or stored.

Every `--agent-env` value becomes `<redacted>`; a `KEY=value` whose key looks
sensitive becomes `KEY=<redacted>`; an inline provider config becomes a
placeholder; finally every known secret value still present is masked.
"""

from __future__ import annotations

import json
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
    """Replace every occurrence of each (non-trivial) secret value in text, as written or JSON-escaped.

    A secret with a quote, a backslash or a control character is written
    differently inside a JSON string, and differently again inside a JSON
    string held in a JSON string (an `--ek` value in a record): each of
    those forms is masked too.
    """
    forms = {form for s in secrets if len(s) >= 4 for form in _escaped_forms(s)}
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, REDACTED)
    return text


def _escaped_forms(secret: str) -> list[str]:
    """The secret as written, JSON-escaped once and twice (the same text when it needs no escaping)."""
    once = json.dumps(secret)[1:-1]
    return [secret, once, json.dumps(once)[1:-1]]
