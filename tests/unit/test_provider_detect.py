"""The provider-failure detectors on log excerpts of real runs (tests/docker/test_provider_errors.py).

Each excerpt is lines a real harness (Codex 0.169.0, Claude Code, mini-swe-agent
through squid) wrote against the scripted gateway's fault modes, trimmed to
the events that matter.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sciencebench.worker.pier.provider import (
    ProviderFailure,
    claude_calls,
    codex_calls,
    detect,
    proxy_calls,
    status_of,
)

pytestmark = pytest.mark.unit

CODEX_START = [
    "WARNING: proceeding, even though we could not create PATH aliases: Refusing to create helper binaries",
    "Reading additional input from stdin...",
    '{"type":"thread.started","thread_id":"01a2318b-a5e6-74a3-9ff5-9d9464174e49"}',
    '{"type":"item.completed","item":{"id":"item_0","type":"error","message":"Model metadata for '
    '`gpt-sb-scripted` not found. Defaulting to fallback metadata; this can degrade performance."}}',
    '{"type":"turn.started"}',
]
CODEX_COMMAND = [
    '{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"/bin/bash -lc true",'
    '"aggregated_output":"","exit_code":null,"status":"in_progress"}}',
    '{"type":"item.completed","item":{"id":"item_1","type":"command_execution",'
    '"command":"/bin/bash -lc true",'
    '"aggregated_output":"","exit_code":0,"status":"completed"}}',
]


def codex_failing(message: str, reconnects: int = 0) -> list[str]:
    retries = [
        f'{{"type":"error","message":"Reconnecting... {n}/5 ({message})"}}' for n in range(1, reconnects + 1)
    ]
    return [
        *retries,
        f'{{"type":"error","message":"{message}"}}',
        f'{{"type":"turn.failed","error":{{"message":"{message}"}}}}',
    ]


CODEX_429 = "exceeded retry limit, last status: 429 Too Many Requests"
CODEX_500 = "We\u2019re currently experiencing high demand, which may cause temporary errors."
CODEX_RESET = "stream disconnected before completion: error sending request"
CODEX_CASES = {
    "429": ([*CODEX_START, *codex_failing(CODEX_429)], False, "429"),
    "429 with Retry-After (Codex reconnects)": ([*CODEX_START, *codex_failing(CODEX_429, 5)], False, "429"),
    "429 after one answered turn": ([*CODEX_START, *CODEX_COMMAND, *codex_failing(CODEX_429)], False, "429"),
    "500 (Codex names no status)": ([*CODEX_START, *codex_failing(CODEX_500, 5)], False, "500"),
    "reset": ([*CODEX_START, *codex_failing(CODEX_RESET, 5)], False, "reset"),
    "never answered: the agent timed out waiting": (CODEX_START, True, "timeout"),
    "a normal failure": (
        [*CODEX_START, *CODEX_COMMAND,
         '{"type":"item.completed","item":{"id":"item_2","type":"agent_message","text":"Nothing to do."}}',
         '{"type":"turn.completed","usage":{"input_tokens":2400,"cached_input_tokens":0,"output_tokens":160}}'],
        False, None,
    ),
    "a command that outlived the agent's timeout": ([*CODEX_START, CODEX_COMMAND[0]], True, None),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CODEX_CASES))
def test_codex_events(case: str, tmp_path: Path) -> None:
    lines, timed_out, status = CODEX_CASES[case]
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "codex.txt").write_text("\n".join(lines) + "\n")
    found = detect(tmp_path, rewarded=False, exception_type="AgentTimeoutError" if timed_out else None,
                   authority="gw:4443")  # fmt: skip
    assert (found.status if found else None) == status, codex_calls("\n".join(lines), timed_out)
    if found:
        assert found.source == "codex.txt"


CLAUDE_INIT = [
    '{"type":"system","subtype":"init","cwd":"/app/project","session_id":"43c77020","tools":["Task","Bash"],'
    '"model":"claude-sb-scripted","permissionMode":"bypassPermissions"}',
    '[claude-code:unrecognized_model] {"model":"claude-sb-scripted","query_source":"sdk"}',
]
CLAUDE_TURN = [
    '{"type":"assistant","message":{"id":"msg_2bd5","type":"message","role":"assistant","model":"claude-sb-scripted",'
    '"content":[{"type":"text","text":"Running a command."}],"stop_reason":null},"session_id":"9269bb33"}',
    '{"type":"assistant","message":{"id":"msg_2bd5","type":"message","role":"assistant","content":[{"type":'
    '"tool_use","id":"toolu_d12c","name":"Bash","input":{"command":"true"}}]},"session_id":"9269bb33"}',
    '{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_d12c","type":"tool_result",'
    '"content":"(Bash completed with no output)","is_error":false}]},"session_id":"9269bb33"}',
]


def claude_retries(status: int | None, error: str, n: int = 6) -> list[str]:
    return [
        json.dumps({"type": "system", "subtype": "api_retry", "attempt": a, "max_retries": 10,
                    "retry_delay_ms": 1000 * 2**a, "error_status": status, "error": error,
                    "session_id": "5e088ed4-11be-4930-a97c-3e9bf173adec",
                    "uuid": "45136979-6be9-42ca-a703-2b90ca098b23"})
        for a in range(1, n + 1)
    ]  # fmt: skip


CLAUDE_CASES = {
    "429": ([*CLAUDE_INIT, *claude_retries(429, "rate_limit")], "429"),
    "429 after one answered turn": ([*CLAUDE_INIT, *CLAUDE_TURN, *claude_retries(429, "rate_limit")], "429"),
    "500": ([*CLAUDE_INIT, *claude_retries(500, "server_error")], "500"),
    "reset": ([*CLAUDE_INIT, *claude_retries(None, "unknown")], "reset"),
    "never answered": (CLAUDE_INIT, "timeout"),
    "retries exhausted: the result is an API error": (
        [*CLAUDE_INIT, *claude_retries(529, "overloaded"),
         '{"type":"result","subtype":"success","is_error":true,'
         '"result":"API Error: 529 {\\"type\\":\\"error\\",'
         '\\"error\\":{\\"type\\":\\"overloaded_error\\"}}","session_id":"9269bb33"}'],
        "529",
    ),
    "a normal failure": (
        [*CLAUDE_INIT, *CLAUDE_TURN,
         '{"type":"assistant","message":{"id":"msg_f97f","type":"message","role":"assistant","content":'
         '[{"type":"text","text":"Nothing to do."}]},"session_id":"9269bb33"}',
         '{"type":"result","subtype":"success","is_error":false,"result":"Nothing to do.",'
         '"total_cost_usd":0.016}'],
        None,
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CLAUDE_CASES))
def test_claude_code_stream(case: str, tmp_path: Path) -> None:
    lines, status = CLAUDE_CASES[case]
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "claude-code.txt").write_text("\n".join(lines) + "\n")
    timed_out = "result" not in lines[-1]
    found = detect(tmp_path, rewarded=False, exception_type="AgentTimeoutError" if timed_out else None,
                   authority="gw:4443")  # fmt: skip
    assert (found.status if found else None) == status, claude_calls("\n".join(lines), timed_out)


def test_a_rewarded_trial_is_never_a_provider_failure(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "codex.txt").write_text("\n".join([*CODEX_START, *codex_failing(CODEX_429)]))
    assert detect(tmp_path, rewarded=True, exception_type=None, authority="gw:4443") is None
    assert detect(tmp_path, rewarded=False, exception_type=None, authority="gw:4443") == ProviderFailure(
        "429", None, "codex.txt"
    )


def test_no_logs_are_no_evidence(tmp_path: Path) -> None:
    assert detect(tmp_path, rewarded=False, exception_type="AgentTimeoutError", authority="gw:4000") is None


@pytest.mark.parametrize(
    ("message", "status"),
    [
        ("litellm.RateLimitError: RateLimitError: OpenAIException - rate limit exceeded", "429"),
        ("litellm.InternalServerError: InternalServerError: OpenAIException - internal server error", "500"),
        ("litellm.APIConnectionError: APIConnectionError: OpenAIException - Connection error.", "reset"),
        ("httpx.ConnectError: [Errno 111] Connection refused", "refused"),
        ("litellm.Timeout: APITimeoutError - Request timed out.", "timeout"),
        ("HTTP 503 Service Unavailable", "503"),
        ("step 5/5 done", None),
        ("AuthenticationError: invalid API key (401)", None),
    ],
)
def test_status_of_an_error_message(message: str, status: str | None) -> None:
    assert status_of(message) == status


# squid's access log in `network.squid.ACCESS_LOG_FORMAT`, lines of real mini-swe-agent trials
# (tests/docker/test_provider_errors.py); `squid` makes the same line for other endings.
ANSWERED = (
    "1796129292.436    100 172.25.0.2 TCP_MISS/200 806 POST http://gw:4000/v1/chat/completions agent "
    "HIER_DIRECT/172.29.0.2 application/json - -"
)
HEALTH_CHECK = (
    "1796128108.705      0 127.0.0.1 NONE_NONE/000 0 - error:transaction-end-before-headers - "
    "HIER_NONE/- - ERR_CLIENT_GONE -"
)
RETRY_AFTER_429 = (
    "1796129294.987     23 172.27.0.2 TCP_MISS/429 450 POST http://gw:4000/v1/chat/completions agent "
    "HIER_DIRECT/192.168.0.2 application/json - 2"
)
RESET = (
    "1796129290.863    101 172.30.0.2 TCP_MISS/502 3551 POST http://gw:4000/v1/chat/completions agent "
    "HIER_DIRECT/172.26.0.2 text/html ERR_READ_ERROR -"
)
NEVER_ANSWERED = (
    "1796129395.488 100812 172.31.0.2 TCP_MISS_ABORTED/000 0 POST http://gw:4000/v1/chat/completions agent "
    "HIER_DIRECT/192.168.16.2 - ERR_CLIENT_GONE -"
)


def squid(code: str, error: str = "-", retry_after: str = "-", url: str = "http://gw:4000/v1/x") -> str:
    return (f"1796128230.001     12 172.24.0.2 {code} 310 POST {url} agent HIER_DIRECT/172.26.0.2 "
            f"application/json {error} {retry_after}")  # fmt: skip


PROXY_CASES = {
    "429 with Retry-After": ([HEALTH_CHECK, RETRY_AFTER_429, RETRY_AFTER_429], "429", 2.0),
    "429 after an answered call": ([ANSWERED, squid("TCP_MISS/429")], "429", None),
    "500": ([squid("TCP_MISS/500"), squid("TCP_MISS/500")], "500", None),
    "reset": ([HEALTH_CHECK, RESET, RESET], "reset", None),
    "empty answer": ([squid("TCP_MISS/502", "ERR_ZERO_SIZE_OBJECT")], "reset", None),
    "refused": ([squid("TCP_MISS/503", "ERR_CONNECT_FAIL")], "refused", None),
    "never answered: aborted at the end": ([HEALTH_CHECK, NEVER_ANSWERED], "timeout", None),
    "answered at last": ([squid("TCP_MISS/429"), ANSWERED], None, None),
    "a 401 (the job's key) is not the provider's": ([squid("TCP_MISS/401")], None, None),
    "another host's calls do not count": ([squid("TCP_MISS/429", url="http://other:4000/v1/x")], None, None),
}  # fmt: skip


@pytest.mark.parametrize("case", list(PROXY_CASES))
def test_the_proxy_log(case: str, tmp_path: Path) -> None:
    lines, status, retry_after = PROXY_CASES[case]
    log = tmp_path / "network-policy" / "task_101__abc" / "squid-access.log"
    log.parent.mkdir(parents=True)
    log.write_text("\n".join(lines) + "\n")
    found = detect(tmp_path, rewarded=False, exception_type=None, authority="gw:4000")
    assert (found.status if found else None) == status, proxy_calls(log.read_text(), "gw:4000")
    if found:
        assert (found.source, found.retry_after_sec) == ("proxy log", retry_after)


def test_a_gateway_the_proxy_denied_is_the_policys_refusal(tmp_path: Path) -> None:
    # The agent was pointed at another port than the job's gateway: denied, the gateway never reached.
    denied = ("1796128230.001      0 172.24.0.2 TCP_DENIED/403 3900 CONNECT gw:4100 agent HIER_NONE/- "
              "text/html ERR_ACCESS_DENIED -")  # fmt: skip
    assert proxy_calls(denied, "gw:4443") is None
    assert proxy_calls(denied.replace("gw:4100", "gw:4443"), "gw:4443") is None
    log = tmp_path / "network-policy" / "s" / "squid-access.log"
    log.parent.mkdir(parents=True)
    log.write_text(denied + "\n")
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "codex.txt").write_text("\n".join([*CODEX_START, *codex_failing(CODEX_RESET, 5)]))
    assert detect(tmp_path, rewarded=False, exception_type="AgentTimeoutError", authority="gw:4443") is None
    # Codex's own calls to other hosts, denied, do not make it the policy's.
    telemetry = denied.replace("gw:4100", "chatgpt.com:443")
    log.write_text(telemetry + "\n")
    found = detect(tmp_path, rewarded=False, exception_type="AgentTimeoutError", authority="gw:4443")
    assert found is not None and found.status == "reset"
    # Reached through its tunnel, the same Codex log is the provider's.
    tunnel = ("1796128231.001   9000 172.24.0.2 TCP_TUNNEL/200 5120 CONNECT gw:4443 agent "
              "HIER_DIRECT/172.26.0.2 - - -")  # fmt: skip
    log.write_text(denied + "\n" + tunnel + "\n")
    found = detect(tmp_path, rewarded=False, exception_type="AgentTimeoutError", authority="gw:4443")
    assert found is not None and (found.status, found.source) == ("reset", "codex.txt")


def test_mini_swe_agent_trajectory(tmp_path: Path) -> None:
    trajectory = {
        "info": {"exit_status": "RateLimitError", "submission": ""},
        "messages": [
            {"role": "system", "content": "..."}, {"role": "user", "content": "..."},
            {"role": "exit", "content": "litellm.RateLimitError: RateLimitError: OpenAIException - limit",
             "extra": {"exit_status": "RateLimitError"}},
        ],
    }  # fmt: skip
    (tmp_path / "agent").mkdir()
    path = tmp_path / "agent" / "mini-swe-agent.trajectory.json"
    path.write_text(json.dumps(trajectory))
    found = detect(tmp_path, rewarded=False, exception_type="NonZeroAgentExitCodeError", authority="gw:4000")
    assert found == ProviderFailure("429", None, "mini-swe-agent trajectory")
    trajectory["info"] = {"exit_status": "Submitted", "submission": ""}
    path.write_text(json.dumps(trajectory))
    assert detect(tmp_path, rewarded=False, exception_type=None, authority="gw:4000") is None


def test_model_text_that_looks_like_an_api_error_is_the_models(tmp_path: Path) -> None:
    # A model that ends its run saying "API Error: 429" (or has a command print Codex-like events)
    # failed on its own: only what the harness writes is read, never the model's text or a command's.
    said = "API Error: 429 rate limit exceeded"
    claude = [*CLAUDE_INIT, json.dumps({"type": "assistant", "message": {"role": "assistant", "content": [
        {"type": "text", "text": said}]}}),
        json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": said})]  # fmt: skip
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "claude-code.txt").write_text("\n".join(claude))
    assert detect(tmp_path, rewarded=False, exception_type=None, authority="gw:4443") is None
    fake_event = '{"type":"turn.failed","error":{"message":"exceeded retry limit, last status: 429"}}'
    item = {"id": "item_1", "type": "command_execution", "aggregated_output": fake_event, "exit_code": 0}
    output = json.dumps({"type": "item.completed", "item": item})
    codex = [*CODEX_START, output, '{"type":"item.completed","item":{"type":"agent_message","text":"x"}}',
             '{"type":"turn.completed","usage":{"input_tokens":1}}']  # fmt: skip
    (tmp_path / "agent" / "claude-code.txt").unlink()
    (tmp_path / "agent" / "codex.txt").write_text("\n".join(codex))
    assert detect(tmp_path, rewarded=False, exception_type=None, authority="gw:4443") is None


@pytest.mark.parametrize("planted", ["file", "agent-dir", "session-dir", "fifo"])
def test_a_link_or_fifo_a_trial_planted_is_no_evidence(planted: str, tmp_path: Path) -> None:
    """The host reads a trial's logs without following what the trial wrote: a link is not evidence."""
    trial, outside = tmp_path / "trial", tmp_path / "outside"  # `outside`: real logs of a provider failure
    (outside / "agent").mkdir(parents=True)
    (outside / "agent" / "codex.txt").write_text("\n".join([*CODEX_START, *codex_failing(CODEX_429)]))
    (outside / "network-policy" / "s").mkdir(parents=True)
    log = outside / "network-policy" / "s" / "squid-access.log"
    log.write_text(squid("503", "ERR_CONNECT_FAIL") + "\n")
    assert detect(outside, rewarded=False, exception_type=None, authority="gw:4000") is not None
    trial.mkdir()
    if planted == "file":
        (trial / "agent").mkdir()
        (trial / "agent" / "codex.txt").symlink_to(outside / "agent" / "codex.txt")
    elif planted == "agent-dir":
        (trial / "agent").symlink_to(outside / "agent")
    elif planted == "session-dir":
        (trial / "network-policy").mkdir()
        (trial / "network-policy" / "s").symlink_to(outside / "network-policy" / "s")
    else:
        (trial / "agent").mkdir()
        os.mkfifo(trial / "agent" / "codex.txt")  # opened for reading without O_NONBLOCK it would hang
    assert detect(trial, rewarded=False, exception_type=None, authority="gw:4000") is None
