"""`harness_key_problem`: every group of names a job may not set, and what it still may.

One function guards env files, `--agent-env` and the env tables of a
task.toml; each case names the group's representative keys (the ones a
review or Pier's and LiteLLM's sources showed to load code, read files or
steer the Docker client) and checks the reason names the key, never a value.

`agent_key_problem` holds env-file and `--agent-env` keys to an allowlist
besides (`AGENT_KEYS`): the spec's profile variables and every name Pier's
installed agents read, derived here from Pier's own source.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pier
import pytest
from click.testing import CliRunner

from sciencebench import cli
from sciencebench.core.envfile import agent_key_problem, harness_key_problem
from tests.fixtures.selection import make_selection

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


# --- the allowlist of env-file and --agent-env keys ------------------------------------

NOT_READ = "not a key agents read"

# ../shared/seed/run-batch.md's provider profiles (Codex, LiteLLM, Claude Code, mini-swe-agent).
SPEC_PROFILE_KEYS = [
    "MODEL", "OPENAI_API_KEY", "CODEX_BASE_URL", "CODEX_WIRE_API", "CODEX_VERSION", "CODEX_REASONING_EFFORT",
    "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "ANTHROPIC_CUSTOM_HEADERS", "OPENAI_BASE_URL",
]  # fmt: skip


@pytest.mark.parametrize("key", SPEC_PROFILE_KEYS)
def test_the_specs_profile_keys_are_allowed(key: str) -> None:
    assert agent_key_problem(key) is None


@pytest.mark.parametrize(
    "key",
    # Read by Java tools, Kerberos, curl, wget, libproxy, the GnuPG agent or glibc's iconv on the
    # host; none is on the denylist, none is a name agents read.
    ["JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "KRB5_CONFIG", "KRB5CCNAME", "CURL_HOME",
     "WGETRC", "GNUPGHOME", "SSH_AUTH_SOCK", "EDITOR", "PAGER", "LESSOPEN", "TERMINFO", "openai_api_key",
     "X"],
)  # fmt: skip
def test_a_key_no_agent_reads_is_refused(key: str) -> None:
    assert harness_key_problem(key) is None  # past the denylist: the allowlist is what refuses it
    problem = agent_key_problem(key)
    assert problem is not None and problem.startswith(f"{key}: {NOT_READ}")


@pytest.mark.parametrize(
    ("key", "group"),
    [("CODEX_AUTH_JSON_PATH", "Pier or LiteLLM would read"), ("CODEX_FORCE_AUTH_JSON", "Pier or LiteLLM"),
     ("AWS_WEB_IDENTITY_TOKEN_FILE", "Pier or LiteLLM"), ("HF_TOKEN_PATH", "Pier or LiteLLM"),
     ("GOOGLE_APPLICATION_CREDENTIALS", "Pier or LiteLLM"), ("OPENAI_PROXY", "proxies"),
     ("HTTP_PROXY", "proxies"), ("NO_PROXY", "proxies"), ("PYTHON_API_KEY", "an interpreter")],
)  # fmt: skip
def test_the_denylist_still_refuses_within_the_allowlist(key: str, group: str) -> None:
    # Allowed by a prefix or suffix, refused first by the denylist with its own reason.
    problem = agent_key_problem(key)
    assert problem is not None and problem.startswith(f"{key}: ") and group in problem


_NAME = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$")
_READERS = {"_get_env", "_has_env", "getenv"}


def _constants(node: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(node)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and _NAME.match(n.value)
    }  # fmt: skip


def _names_read(tree: ast.AST) -> set[str]:
    """Variable names a Pier agent module reads from its environment.

    `_get_env("X")`, `os.environ["X"]` / `.get("X")`, `env_fallback="X"`;
    in a function that reads a name held in a variable (`for key in keys:
    self._get_env(key)`), every name in its lists, tuples and append/extend calls.
    """
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found |= {kw.value.value for kw in node.keywords
                      if kw.arg == "env_fallback" and isinstance(kw.value, ast.Constant)}  # fmt: skip
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            found |= _constants(node.slice)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        dynamic = False
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call) and n.args):
            func = call.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in _READERS or (
                name == "get" and ast.unparse(getattr(func, "value", func)) == "os.environ"
            ):
                arg = call.args[0]
                if isinstance(arg, ast.Constant):
                    found |= _constants(arg)
                else:
                    dynamic = True
        if dynamic:
            for inner in ast.walk(node):
                if isinstance(inner, ast.List | ast.Tuple):
                    found |= _constants(inner)
                elif isinstance(inner, ast.Call) and getattr(inner.func, "attr", "") in {"append", "extend"}:
                    found |= set().union(*(_constants(arg) for arg in inner.args))
    return found


def pier_agent_env_names() -> set[str]:
    """What Pier's installed agents read from Pier's environment, and the provider keys of its utils."""
    agents = Path(pier.__file__).parent / "agents"
    names = set().union(*(_names_read(ast.parse(p.read_text())) for p in (agents / "installed").glob("*.py")))
    return names | _constants(ast.parse((agents / "utils.py").read_text()))


def test_every_name_piers_agents_read_is_allowed_or_denied_for_its_reason() -> None:
    names = pier_agent_env_names()
    # The scan finds what a reading of Pier 0.3's agents finds (codex, claude-code, gemini-cli,
    # cursor-cli, opencode, mini-swe-agent and LiteLLM's provider keys).
    assert {
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_AUTH_TOKEN",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "MAX_THINKING_TOKENS",
        "AWS_BEARER_TOKEN_BEDROCK",
        "GOOGLE_CLOUD_PROJECT",
        "CURSOR_API_KEY",
        "MSWEA_API_KEY",
        "OPENROUTER_API_BASE",
        "AZURE_RESOURCE_NAME",
        "TOGETHERAI_API_KEY",
    } <= names
    refused = {name: problem for name in sorted(names) if (problem := agent_key_problem(name))}
    assert not [p for p in refused.values() if NOT_READ in p], refused
    # Pier reads these files of the worker host; the denylist keeps refusing them.
    assert set(refused) == {"CODEX_AUTH_JSON_PATH", "CODEX_FORCE_AUTH_JSON", "GOOGLE_APPLICATION_CREDENTIALS"}


@pytest.mark.parametrize("option", ["--env-file", "--agent-env"])
def test_submit_refuses_a_key_no_agent_reads_in_one_line(tmp_path: Path, option: str) -> None:
    selection = make_selection(tmp_path / "sel", ["001"])
    jobs = tmp_path / "jobs"
    env_file = tmp_path / "p.env"
    env_file.write_text("OPENAI_API_KEY=sk-canary-allow-1\nJAVA_TOOL_OPTIONS=-javaagent:/x.jar\n")
    given = ["--env-file", str(env_file)] if option == "--env-file" else ["--agent-env", "KRB5_CONFIG=/x"]
    result = CliRunner().invoke(
        cli.main, ["submit", "--path", str(selection), "--jobs-dir", str(jobs), "--job-name", "t", *given]
    )
    key = "JAVA_TOOL_OPTIONS" if option == "--env-file" else "KRB5_CONFIG"
    assert result.exit_code == 2
    assert result.stderr.startswith(f"sciencebench: error: {option}: refused: {key}: {NOT_READ}")
    assert result.stderr.count("\n") == 1 and "sk-canary-allow-1" not in result.stderr
    assert not jobs.exists()
