"""`harness_key_problem`: every group of names a job may not set, and what it still may.

One function guards env files, `--agent-env` and the env tables of a
task.toml; each case names the group's representative keys (the ones a
review or Pier's and LiteLLM's sources showed to load code, read files or
steer the Docker client) and checks the reason names the key, never a value.
"""

from __future__ import annotations

import pytest

from sciencebench.core.envfile import harness_key_problem

pytestmark = pytest.mark.unit

GROUPS = {
    "the dynamic loader and the C library": [
        "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH", "GLIBC_TUNABLES", "MALLOC_CHECK_",
        "MALLOC_ARENA_MAX", "HOSTALIASES", "RES_OPTIONS", "LOCALDOMAIN", "LOCPATH", "NLSPATH",
    ],
    "OpenSSL and TLS clients": [
        "OPENSSL_CONF", "OPENSSL_MODULES", "OPENSSL_ENGINES", "SSL_CERT_FILE", "SSL_CERT_DIR",
        "SSLKEYLOGFILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "AWS_CA_BUNDLE",
    ],
    "an interpreter, shell or tool": [
        "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PERL5LIB", "PERL5OPT", "RUBYOPT", "RUBYLIB",
        "NODE_OPTIONS", "NODE_EXTRA_CA_CERTS", "NPM_CONFIG_PREFIX", "npm_config_userconfig",
        "GIT_SSH_COMMAND", "GIT_CONFIG_GLOBAL", "GODEBUG", "GOFLAGS", "GOTRACEBACK", "BASH_ENV", "ENV",
        "BASH_FUNC_docker",
        "IFS", "PS4", "SHELLOPTS", "SHELL", "PIP_INDEX_URL", "UV_INDEX_URL", "VIRTUAL_ENV",
    ],
    "the harness finds its programs, home and scratch files": ["PATH", "HOME", "TMPDIR", "XDG_CONFIG_HOME"],
    "the Docker, compose and BuildKit clients": [
        "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "COMPOSE_FILE", "COMPOSE_PROJECT_NAME",
        "BUILDKIT_PROGRESS", "BUILDX_CONFIG", "BUILDX_BUILDER",
    ],
    "Pier's compose variables": [
        "MAIN_IMAGE_NAME", "CONTEXT_DIR", "HOST_VERIFIER_LOGS_PATH", "HOST_AGENT_LOGS_PATH",
        "HOST_ARTIFACTS_PATH", "ENV_VERIFIER_LOGS_PATH", "ENV_AGENT_LOGS_PATH", "ENV_ARTIFACTS_PATH",
        "PREBUILT_IMAGE_NAME", "PIER_CONTAINER_NAME", "PIER_VIEWER_FOLDER",
    ],
    "sciencebench's and LiteLLM's own settings": [
        "SCIENCEBENCH_PROXY_IMAGE", "SCIENCEBENCH_BROKER_URL", "LITELLM_LOCAL_MODEL_COST_MAP", "LITELLM_LOG",
    ],
    "Pier or LiteLLM would read": [
        "CODEX_AUTH_JSON_PATH", "CODEX_FORCE_AUTH_JSON", "GOOGLE_APPLICATION_CREDENTIALS",
        "AWS_SHARED_CREDENTIALS_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AZURE_FEDERATED_TOKEN_FILE",
        "GCS_PATH_SERVICE_ACCOUNT", "CHATGPT_AUTH_FILE", "GITHUB_COPILOT_TOKEN_DIR", "TIKTOKEN_CACHE_DIR",
        "HF_HOME",
        # tiktoken's other cache variable; botocore sends this file to a URL the job names;
        # huggingface_hub sends this file to HF_ENDPOINT; requests and httpx read this netrc.
        "DATA_GYM_CACHE_DIR", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "HF_TOKEN_PATH", "NETRC",
    ],
    "proxies": ["HTTP_PROXY", "https_proxy", "NO_PROXY", "ALL_PROXY"],
}  # fmt: skip


@pytest.mark.parametrize(("group", "key"), [(g, k) for g, keys in GROUPS.items() for k in keys])
def test_each_group_is_refused_with_its_reason(group: str, key: str) -> None:
    problem = harness_key_problem(key)
    assert problem is not None, key
    assert problem.startswith(f"{key}: ") and group in problem


@pytest.mark.parametrize(
    "key",
    ["OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
     "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN", "CODEX_BASE_URL", "CODEX_WIRE_API", "MSWEA_API_KEY",
     "GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GEMINI_BASE_URL", "AWS_REGION", "AWS_BEARER_TOKEN_BEDROCK",
     "CURSOR_API_KEY", "MAX_THINKING_TOKENS", "EXTRA_TOKEN", "GRADER_TOKEN", "PM"],
)  # fmt: skip
def test_provider_credentials_base_urls_and_documented_names_stay_allowed(key: str) -> None:
    assert harness_key_problem(key) is None


@pytest.mark.parametrize("key", ["BASH_FUNC_x%%", "A-B", "1X", "", "X Y", "X\nPATH"])
def test_a_name_that_is_no_variable_name_is_refused(key: str) -> None:
    # Possible as a task.toml key; `BASH_FUNC_x%%` is how bash exports a function.
    problem = harness_key_problem(key)
    assert problem is not None and "is not a variable name" in problem
    assert "\n" not in problem
