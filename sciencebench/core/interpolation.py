"""Compose interpolation (pure): the variables a compose text substitutes, and the forms refused.

Accepted: `$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR-default}`,
`${VAR:?error}`, `${VAR?error}`; `$$` is a literal `$`. Refused: nested
expressions and the alternative-value forms (`${VAR:+x}`, `${VAR+x}`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

# Bounds on what a compose file may make the checker walk (YAML aliases can multiply it).
_MAX_NODES = 50_000
_MAX_DEPTH = 64

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACED_OPERATORS = (":-", "-", ":?", "?")


def interpolation(text: str) -> tuple[set[str], list[str]]:
    """The variables compose would substitute in `text`, and what about it is refused.

    `$$` is a literal `$`. Accepted forms: `$VAR`, `${VAR}`, `${VAR:-default}`,
    `${VAR-default}`, `${VAR:?error}`, `${VAR?error}`, with no `$` or `{` in
    the default or error text. Refused: nested expressions (`${A:-${B}}`),
    the alternative-value forms (`${A:+x}`, `${A+x}`), anything malformed.
    """
    names: set[str] = set()
    problems: list[str] = []
    i = text.find("$")
    while i != -1:
        after = text[i + 1 : i + 2]
        if after == "$":
            i = text.find("$", i + 2)
            continue
        if after == "{":
            end = text.find("}", i + 2)
            if end == -1:
                problems.append("an unterminated '${'")
                break
            body = text[i + 2 : end]
            match = _NAME.match(body)
            rest = body[match.end() :] if match else body
            if match is None:
                problems.append(f"'${{{body[:40]}}}' does not name a variable")
            elif "$" in rest or "{" in rest:
                problems.append(f"a nested expression in '${{{match.group()}...}}'")
            elif rest.startswith((":+", "+")):
                form = ":+" if rest.startswith(":+") else "+"
                problems.append(f"the alternative-value form '${{{match.group()}{form}...}}'")
            elif rest and not rest.startswith(_BRACED_OPERATORS):
                problems.append(f"'${{{body[:40]}}}' is not a compose expression")
            else:
                names.add(match.group())
            i = text.find("$", end + 1)
            continue
        match = _NAME.match(text, i + 1)
        if match is None:
            problems.append("a lone '$' (write '$$' for a literal dollar sign)")
            i = text.find("$", i + 1)
        else:
            names.add(match.group())
            i = text.find("$", match.end())
    return names, problems


def strings(node: Any) -> Iterator[str]:
    """Every string value under `node` (mapping keys are not interpolated), within the bounds."""
    stack: list[tuple[Any, int]] = [(node, 0)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > _MAX_NODES or depth > _MAX_DEPTH:
            raise ValueError("the compose file is too large or nested too deeply")
        if isinstance(value, str):
            yield value
        elif isinstance(value, Mapping):
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
