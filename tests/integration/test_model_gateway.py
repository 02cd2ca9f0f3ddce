"""The scripted gateway against real clients (LiteLLM, as mini-swe-agent uses it) on loopback.

The docker tier drives it with the real agent binaries (Codex: Responses
over SSE; Claude Code: Messages over SSE; mini-swe-agent: Chat Completions).
Here the other shapes are checked with LiteLLM itself: Chat Completions
streamed, Responses without streaming, Messages without streaming, a wrong
key refused, and the log that keeps hashes, never the key.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm is imported

import hashlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import litellm
import pytest

from tests.fixtures.model_gateway import Server, serve
from tests.fixtures.services import free_port

pytestmark = [
    pytest.mark.integration,
    # LiteLLM's own code trips pydantic's warnings (ReadOnly fields, deprecated
    # attribute access while streaming); they are not this project's.
    pytest.mark.filterwarnings("ignore:.*ReadOnly.*:UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

KEY = "sk-gateway-unit-1c9e"
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    port = free_port()
    log = tmp_path / "requests.jsonl"
    config = {
        "key_sha256": hashlib.sha256(KEY.encode()).hexdigest(),
        "log": str(log),
        "listen": [{"port": port}],
        "scripts": [{"name": "fix", "match": "calc.sh", "commands": ["echo fixed"], "final": "Done."}],
        "usage": {"input_tokens": 11, "output_tokens": 7},
    }
    servers: list[Server] = serve(config, host="127.0.0.1")
    try:
        yield f"http://127.0.0.1:{port}/v1", log
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def entries(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_chat_completions_streamed_tool_call_then_answer(gateway: tuple[str, Path]) -> None:
    url, log = gateway
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix calc.sh"}]
    stream = litellm.completion(
        model="openai/gpt-x", api_base=url, api_key=KEY, messages=messages, tools=[BASH_TOOL],
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    built = litellm.stream_chunk_builder(chunks, messages=messages)
    assert built is not None
    call = built.choices[0].message.tool_calls[0]
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "echo fixed"}
    assert built.usage.prompt_tokens == 11 and built.usage.completion_tokens == 7
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "fixed"},
    ]
    final = litellm.completion(
        model="openai/gpt-x", api_base=url, api_key=KEY, messages=messages, tools=[BASH_TOOL]
    )
    assert final.choices[0].message.content == "Done."
    seen = entries(log)
    assert [(e["protocol"], e["stream"], e["turn"], e["answer"]) for e in seen] == [
        ("chat", True, 0, "tool"),
        ("chat", False, 1, "text"),
    ]
    assert {e["model"] for e in seen} == {"gpt-x"}
    assert {e["auth_sha256"] for e in seen} == {hashlib.sha256(KEY.encode()).hexdigest()}
    assert KEY not in log.read_text()


def test_responses_without_streaming(gateway: tuple[str, Path]) -> None:
    url, log = gateway
    tool = {"type": "function", "name": "bash", "parameters": BASH_TOOL["function"]["parameters"]}  # type: ignore[index]
    response = litellm.responses(
        model="openai/gpt-x", api_base=url, api_key=KEY, input="Fix calc.sh", tools=[tool]
    )
    (item,) = response.output
    assert item.type == "function_call" and json.loads(item.arguments) == {"command": "echo fixed"}
    assert response.usage.input_tokens == 11 and response.usage.output_tokens == 7
    assert entries(log)[0]["protocol"] == "responses" and entries(log)[0]["stream"] is False


def test_messages_without_streaming_and_side_requests(gateway: tuple[str, Path]) -> None:
    url, log = gateway
    base = url.removesuffix("/v1")
    body = {
        "model": "claude-x",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "Fix calc.sh"}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
    }
    answer = post(f"{base}/v1/messages", body, {"x-api-key": KEY})
    assert answer["stop_reason"] == "tool_use"
    assert answer["content"][-1]["input"]["command"] == "echo fixed"
    side = {"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}
    title = post(f"{base}/v1/messages", side, {"Authorization": f"Bearer {KEY}"})
    assert title["content"][0]["text"] == "ok"  # no tools offered: a short side answer
    assert [e["answer"] for e in entries(log)] == ["tool", "text"]


def test_a_wrong_key_is_refused_and_logged_by_hash_only(gateway: tuple[str, Path]) -> None:
    url, log = gateway
    with pytest.raises(litellm.AuthenticationError):
        litellm.completion(
            model="openai/gpt-x", api_base=url, api_key="sk-wrong",
            messages=[{"role": "user", "content": "x"}], num_retries=0,
        )  # fmt: skip
    (entry,) = entries(log)
    assert entry["status"] == 401 and entry["authorized"] is False
    assert entry["auth_sha256"] == hashlib.sha256(b"sk-wrong").hexdigest()
    assert "sk-wrong" not in log.read_text()


def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            result: dict[str, Any] = json.loads(response.read())
            return result
    except urllib.error.HTTPError as exc:
        raise AssertionError(exc.read()) from None
