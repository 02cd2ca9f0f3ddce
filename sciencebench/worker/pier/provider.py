"""Did the trial's agent fail because its model provider would not answer? Read from what the trial left.

A provider failure is a trial whose agent could not get answers from its
gateway: an HTTP 429 or 5xx, a connection reset or refused, a request never
answered. It is told apart from a model's failure by the model calls the
trial's files show: all of them failed, or the run ended on a failed one.
A trial with a reward above 0 is never one. `detect` lists the files read
per harness (docs/agents.md too); the status is what
`TrialRecord.provider_status` holds ("429", "500", "reset", "refused", "timeout").
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sciencebench.core.errors import ProfileError
from sciencebench.core.gateways import parse_gateway
from sciencebench.core.models import JobSpec

PROXY_LOG = "network-policy/squid-access.log"  # one per proxy session: network-policy/<session>/...
CODEX_LOG = "agent/codex.txt"
CLAUDE_LOG = "agent/claude-code.txt"
MSWEA_TRAJECTORY = "agent/mini-swe-agent.trajectory.json"
# What is read of one log at most (a trial's logs are small; a huge one is read from its end).
MAX_LOG_BYTES = 8 * 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
AGENT_TIMEOUT = "AgentTimeoutError"

# squid's error ids for a gateway connection that failed (the reply is then squid's own 5xx).
_SQUID_ERRORS = {
    "ERR_CONNECT_FAIL": "refused",
    "ERR_READ_ERROR": "reset",
    "ERR_WRITE_ERROR": "reset",
    "ERR_ZERO_SIZE_OBJECT": "reset",
    "ERR_READ_TIMEOUT": "timeout",
    "ERR_LIFETIME_EXP": "timeout",
    "ERR_CONNECT_TIMEOUT": "timeout",
}
_STATUS = re.compile(r"(?<![0-9.])(429|5[0-9][0-9])(?![0-9.])")
_TEXTUAL = (
    (re.compile(r"too many requests|rate[ _-]?limit", re.I), "429"),
    (re.compile(r"overloaded", re.I), "529"),
    (re.compile(r"service unavailable", re.I), "503"),
    (re.compile(r"bad gateway", re.I), "502"),
    (re.compile(r"high demand|internal ?server ?error|server error|api_error", re.I), "500"),
    (re.compile(r"connection refused|econnrefused|connecterror|unable to connect", re.I), "refused"),
    (re.compile(r"timed? ?out|timeout|etimedout", re.I), "timeout"),
    (re.compile(r"reset|econnreset|stream disconnected|error sending request|socket hang ?up|"
                r"connection (?:error|closed|aborted)|apiconnectionerror|broken pipe|"
                r"remote ?protocol ?error|disconnected", re.I), "reset"),
)  # fmt: skip


@dataclass(frozen=True)
class Call:
    """One model call as a log shows it: None when answered, else the provider status it failed with."""

    status: str | None
    retry_after_sec: float | None = None


@dataclass(frozen=True)
class ProviderFailure:
    """The trial failed on its provider: the status, a Retry-After seen, and where it was read."""

    status: str
    retry_after_sec: float | None
    source: str


def gateway_authority(job: JobSpec) -> str | None:
    """`host:port` of the job's gateway: its provider's base URL, else its first gateway (None: none)."""
    agent = job.agent
    if agent.provider is not None and agent.provider.base_url:
        try:
            return parse_gateway(agent.provider.base_url, "base URL").authority
        except ProfileError:
            pass
    return agent.gateways[0].authority if agent.gateways else None


def status_of(message: str) -> str | None:
    """The provider status an error message names (an HTTP 429/5xx, reset, refused, timeout), or None."""
    found = _STATUS.search(message)
    if found is not None:
        return found.group(1)
    for pattern, status in _TEXTUAL:
        if pattern.search(message):
            return status
    return None


def detect(
    trial_dir: Path, *, rewarded: bool, exception_type: str | None, authority: str | None
) -> ProviderFailure | None:
    """The trial's provider failure, or None when it was not one.

    `authority` is the job's gateway (`host:port`): only its calls count in
    the proxy log. Unreadable or malformed logs are no evidence.

    Signals, per path:

        proxy log   the trial proxy's access log (`network-policy/<session>/squid-access.log`, kept by
                    the policy environment when the trial stops): each plain-HTTP call to the gateway
                    with its status, squid's own error for a reset, refused or timed-out connection,
                    and the gateway's Retry-After. A TLS gateway is one CONNECT tunnel: no status. A
                    call the proxy denied (the gateway off the allowlist) is the policy's refusal.
        codex.txt   Codex's `exec --json` events: `turn.failed`/`error` messages ("exceeded retry
                    limit, last status: 429 Too Many Requests", "stream disconnected before
                    completion", and for a 5xx "We're currently experiencing high demand"); answered
                    items and turns.
        claude-code.txt  Claude Code's stream-json: assistant messages (an API error is one whose
                    text is "API Error: ..."), and the final `result`.
        mini-swe-agent.trajectory.json  the trajectory's messages and its `info.exit_status` /
                    `info.submission` (LiteLLM's exception: `RateLimitError`, ...).

    The first path that shows model calls decides: the proxy log (exact
    statuses) where the gateway is plain HTTP, else the harness's own log.
    """
    if rewarded:
        return None
    proxy = proxy_calls(_read_proxy_logs(trial_dir), authority)
    if proxy is None:
        return None  # the proxy denied the gateway: the policy's refusal
    timed_out = exception_type == AGENT_TIMEOUT
    sources: list[tuple[str, list[Call]]] = [
        ("proxy log", proxy),
        ("codex.txt", codex_calls(_read(trial_dir, CODEX_LOG), timed_out)),
        ("claude-code.txt", claude_calls(_read(trial_dir, CLAUDE_LOG), timed_out)),
        ("mini-swe-agent trajectory", mswea_calls(_read(trial_dir, MSWEA_TRAJECTORY), timed_out)),
    ]
    for source, calls in sources:
        if calls:
            return verdict(calls, source)
    return None


def verdict(calls: list[Call], source: str) -> ProviderFailure | None:
    """A provider failure when every call failed or the last one did; None otherwise."""
    failed = [call for call in calls if call.status is not None]
    if not failed or calls[-1].status is None:
        return None
    retry_after = next((c.retry_after_sec for c in reversed(failed) if c.retry_after_sec is not None), None)
    status = calls[-1].status
    assert status is not None
    return ProviderFailure(status=status, retry_after_sec=retry_after, source=source)


# --- the proxy's access log ----------------------------------------------------------


def _read_proxy_logs(trial_dir: Path) -> str:
    """Every session's access log, in session order; a session entry that is a link is passed over."""
    parent, _, name = PROXY_LOG.rpartition("/")
    try:
        with _opened_dir(trial_dir, parent) as fd:
            sessions = sorted(os.listdir(fd))
    except OSError:
        return ""
    return "".join(_read(trial_dir, f"{parent}/{session}/{name}") for session in sessions)


def proxy_calls(text: str, authority: str | None) -> list[Call] | None:
    """The plain-HTTP calls to `authority` in squid's access log; None when the proxy denied it.

    None too when the proxy denied the gateway's host on another port and
    the gateway was never reached (the agent pointed off the allowlist);
    denials of other hosts (a harness's telemetry) do not matter.

    Fields (`network.squid.ACCESS_LOG_FORMAT`): time, elapsed, client,
    code/status, bytes, method, URL, user, hierarchy, type, squid's error id,
    Retry-After.
    """
    if not authority:
        return []
    calls: list[Call] = []
    denied = reached = False
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 7:
            continue
        code, _, status = fields[3].partition("/")
        method, url = fields[5], fields[6]
        target = url if method == "CONNECT" else url.split("://", 1)[-1].split("/", 1)[0]
        # Denied elsewhere on the gateway's host (another port): the agent was pointed off the allowlist.
        denied = denied or (
            code == "TCP_DENIED" and target.rpartition(":")[0] == authority.rpartition(":")[0]
        )
        if target != authority:
            continue
        if code == "TCP_DENIED":
            return None
        reached = True
        if method == "CONNECT":
            continue  # a TLS tunnel: its calls are inside
        error = fields[10] if len(fields) > 10 else "-"
        retry_after = _seconds(fields[11]) if len(fields) > 11 else None
        calls.append(_proxy_call(code, status, error, retry_after))
    # The agent never reached its gateway, the proxy denied its host elsewhere: the policy's refusal.
    return None if denied and not reached else calls


def _proxy_call(code: str, status: str, error: str, retry_after: float | None) -> Call:
    if error in _SQUID_ERRORS:
        return Call(_SQUID_ERRORS[error], retry_after)
    if status == "429" or (status.startswith("5") and len(status) == 3):
        return Call(status, retry_after)
    if status == "000" and code.endswith("_ABORTED"):
        return Call("timeout")  # the agent gave up waiting for an answer
    return Call(None)


def _seconds(value: str) -> float | None:
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0 <= seconds < 24 * 3600 else None


# --- the harnesses' own logs -------------------------------------------------------


def _json_lines(text: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def codex_calls(text: str, timed_out: bool) -> list[Call]:
    """Codex's calls from its JSON events: answered items and turns, failed turns and retries."""
    calls: list[Call] = []
    waiting = False  # a turn started, no answer since
    for event in _json_lines(text):
        kind = event.get("type")
        if kind == "turn.started":
            waiting = True
        elif kind in ("item.completed", "item.started"):
            item = _dict(event.get("item"))
            if item.get("type") != "error":  # Codex's own notices ("model metadata not found")
                calls.append(Call(None))
                waiting = kind == "item.completed"  # the next call is the model's; none while a command runs
        elif kind == "turn.completed":
            calls.append(Call(None))
            waiting = False
        elif kind in ("error", "turn.failed"):
            error = _dict(event.get("error"))
            message = str(event.get("message") or error.get("message") or "")
            status = status_of(message)
            if status is not None and not (calls and calls[-1].status == status and kind == "turn.failed"):
                calls.append(Call(status))
            waiting = False
    if timed_out and waiting:
        calls.append(Call("timeout"))
    return calls


def claude_calls(text: str, timed_out: bool) -> list[Call]:
    """Claude Code's calls from its stream-json: assistant messages, its retries, and the result."""
    calls: list[Call] = []
    waiting = False
    for event in _json_lines(text):
        kind = event.get("type")
        if kind == "assistant":
            # Claude Code marks its own API-error message (`error`); a model's text never counts,
            # whatever it says ("API Error: 429" written by a model is the model's answer).
            error = event.get("error")
            calls.append(
                Call(_CLAUDE_ERRORS.get(str(error), status_of(str(error)) or "500") if error else None)
            )
            waiting = False
        elif kind == "user":
            waiting = True  # a tool result went back: the next call is the model's
        elif kind == "system" and event.get("subtype") == "init":
            waiting = True
        elif kind == "system" and event.get("subtype") == "api_retry":
            status = _claude_retry_status(event)
            if status is not None:
                calls.append(Call(status))
                waiting = False  # still retrying that call when the run ended: its status stands
        elif kind == "result":
            result = str(event.get("result") or "")
            if event.get("is_error") and result.startswith("API Error"):
                status = status_of(result) or "500"
                if not calls or calls[-1].status != status:
                    calls.append(Call(status))
            waiting = False
    if timed_out and waiting:
        calls.append(Call("timeout"))
    return calls


_CLAUDE_ERRORS = {"rate_limit": "429", "server_error": "500", "overloaded": "529", "timeout": "timeout"}


def _claude_retry_status(event: dict[str, Any]) -> str | None:
    """The status of a failed call Claude Code retries (`api_retry`): its HTTP status, else its error kind.

    A call that got no HTTP answer at all (a reset or refused connection)
    comes as `error_status: null` with the error "unknown" or a connection error: "reset".
    """
    status = event.get("error_status")
    if isinstance(status, int) and not isinstance(status, bool):
        return str(status) if status == 429 or 500 <= status <= 599 else None
    error = str(event.get("error") or "")
    return _CLAUDE_ERRORS.get(error, "refused" if "refused" in error else "reset")


def mswea_calls(text: str, timed_out: bool) -> list[Call]:
    """mini-swe-agent's calls from its trajectory: assistant messages, then how the run exited."""
    try:
        trajectory = json.loads(text) if text else None
    except ValueError:
        return []
    if not isinstance(trajectory, dict):
        return []
    messages = _list(trajectory.get("messages"))
    calls = [Call(None) for m in messages if isinstance(m, dict) and m.get("role") == "assistant"]
    info = _dict(trajectory.get("info"))
    exit_status = str(info.get("exit_status") or "")
    last = _dict(messages[-1]) if messages else {}
    exit_message = str(last.get("content") or "") if last.get("role") == "exit" else ""
    if exit_status and exit_status not in ("Submitted", "LimitsExceeded"):
        # An uncaught exception: its class (LiteLLM's RateLimitError, ...), else its message.
        status = status_of(exit_status) or status_of(exit_message)
        if status is not None:
            calls.append(Call(status))
    elif timed_out and not exit_status and messages and messages[-1].get("role") != "assistant":
        calls.append(Call("timeout"))
    return calls


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


@contextlib.contextmanager
def _opened_dir(trial_dir: Path, relative: str) -> Iterator[int]:
    """An fd of `trial_dir/relative`, each component below the trial directory opened with O_NOFOLLOW."""
    fd = os.open(trial_dir, _DIR_FLAGS & ~os.O_NOFOLLOW)  # the trial directory itself is the worker's
    try:
        for part in relative.split("/") if relative else []:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _read(trial_dir: Path, relative: str) -> str:
    """A log's text (its last `MAX_LOG_BYTES`); empty when it is missing, unreadable or not a regular file.

    What a trial wrote is read as it is at the moment of reading: no
    component below the trial directory is followed if it is a link (an
    agent's output may plant one to make the host read another file), and
    a FIFO or device is not opened for reading (O_NONBLOCK, then fstat).
    """
    parent, _, name = relative.rpartition("/")
    try:
        with _opened_dir(trial_dir, parent) as dir_fd:
            fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return ""
            size = handle.seek(0, 2)
            handle.seek(max(0, size - MAX_LOG_BYTES))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
