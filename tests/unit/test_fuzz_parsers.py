"""Fuzzing the input parsers: an InputError or a valid model, never anything else.

Every parser here reads text a user controls (task.toml, selection.json, env
files, --task-id, gateway URLs). Any other exception would escape the CLI as
a traceback instead of one `sciencebench: error:` line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sciencebench.core.envfile import parse_env_text
from sciencebench.core.errors import InputError, ProfileError, SelectionError, TaskSpecError
from sciencebench.core.gateways import parse_gateway
from sciencebench.core.images import check_image_ref
from sciencebench.login.selection import Selection, load_selection, parse_task_id_filter
from sciencebench.login.taskspec import TaskSpec, load_task
from tests.fixtures.selection import DEFAULT_AGENT_IMAGE, DEFAULT_VERIFIER_IMAGE, make_selection, make_task

pytestmark = pytest.mark.unit

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# --- task.toml ------------------------------------------------------------------------

_SECTIONS = ["", "[environment]", "[agent]", "[verifier]", "[verifier.environment]", "[task]", "[metadata]"]
_KEYS = [
    "docker_image",
    "allow_internet",
    "timeout_sec",
    "build_timeout_sec",
    "environment_mode",
    "cpus",
    "memory_mb",
    "storage_mb",
    "workdir",
    "network_mode",
    "environment",
    "verifier",
]
_VALUES = [
    json.dumps(DEFAULT_AGENT_IMAGE),
    json.dumps(DEFAULT_VERIFIER_IMAGE),
    '"pending"',
    '""',
    '"docker.io/x/y:v1"',
    '"docker.io/x/y@sha256:abc"',
    "true",
    "false",
    "0",
    "-1",
    "1",
    "2",
    "5400.0",
    "1e400",
    "nan",
    "inf",
    "-inf",
    '"shared"',
    '"separate"',
    '"remote"',
    "[]",
    "{}",
    '["a", 1]',
    "{ docker_image = 1 }",
    "1979-05-27T07:32:00Z",
    "9" * 30,
]
toml_lines = st.one_of(
    st.sampled_from(_SECTIONS),
    st.builds(lambda k, v: f"{k} = {v}", st.sampled_from(_KEYS), st.sampled_from(_VALUES)),
    st.text(max_size=40),
)
toml_documents = st.one_of(
    st.lists(toml_lines, max_size=14).map("\n".join),
    st.text(max_size=300),
)


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _check_task(spec: TaskSpec) -> None:
    assert check_image_ref(spec.agent_image) == spec.agent_image
    if spec.verifier_image is not None:
        assert check_image_ref(spec.verifier_image) == spec.verifier_image
        assert spec.verifier_mode == "separate"
    assert spec.allow_internet is False
    assert spec.agent_timeout_sec > 0
    assert spec.verifier_timeout_sec > 0
    assert spec.build_timeout_sec > 0
    assert spec.verifier_mode in ("shared", "separate")


@FUZZ
@given(text=toml_documents)
@example(text="a = " + "[" * 3000)
@example(text=f'[environment]\ndocker_image = "{DEFAULT_AGENT_IMAGE}"\nallow_internet = false\n')
@example(text=f'[environment]\ndocker_image = "{DEFAULT_AGENT_IMAGE}"\nallow_internet = false\ncpus = true\n')
@example(
    text=f'[environment]\ndocker_image = "{DEFAULT_AGENT_IMAGE}"\nallow_internet = false\n'
    "[agent]\ntimeout_sec = nan\n"
)
def test_task_toml_loader(fuzz_root: Path, text: str) -> None:
    task_dir = make_task(fuzz_root, "002", toml_text=text)
    try:
        spec = load_task(task_dir, "002")
    except TaskSpecError:
        return
    _check_task(spec)


@FUZZ
@given(data=st.binary(max_size=200))
def test_task_toml_loader_bytes(fuzz_root: Path, data: bytes) -> None:
    task_dir = make_task(fuzz_root, "003")
    (task_dir / "task.toml").write_bytes(data)
    try:
        spec = load_task(task_dir, "003")
    except TaskSpecError:
        return
    _check_task(spec)


# --- selection.json -----------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
listed_ids = st.lists(
    st.one_of(
        st.sampled_from(
            ["002", "005", "007", "2", "", ".", "..", "002/.", "002/", "../sel/task_002", "005\x00"]
        ),
        st.text(max_size=8),
    ),
    max_size=5,
)
selection_documents = st.one_of(
    st.text(max_size=120),
    json_values.map(json.dumps),
    st.builds(
        lambda ids, restricted: json.dumps({"allow_restricted_licenses": restricted, "task_ids": ids}),
        listed_ids,
        st.one_of(st.booleans(), json_values),
    ),
)


@pytest.fixture(scope="module")
def fuzz_selection(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_selection(tmp_path_factory.mktemp("fuzzsel") / "sel", ["002", "005"])


@FUZZ
@given(
    content=selection_documents, task_filter=st.one_of(st.none(), st.sampled_from(["002", "005", "002,005"]))
)
@example(content='{"task_ids": ["002/."]}', task_filter=None)
@example(content='{"task_ids": ["002/"]}', task_filter=None)
@example(content='{"task_ids": ["005", "002"]}', task_filter="002")
def test_selection_loader(fuzz_selection: Path, content: str, task_filter: str | None) -> None:
    (fuzz_selection / "selection.json").write_text(content, encoding="utf-8", errors="surrogatepass")
    try:
        selection = load_selection(fuzz_selection, task_filter)
    except InputError as exc:
        assert isinstance(exc, SelectionError | TaskSpecError)
        return
    assert isinstance(selection, Selection)
    assert selection.task_ids
    assert len(set(selection.task_ids)) == len(selection.task_ids)
    for task_id in selection.task_ids:
        # Every id names one task directory directly under the selection.
        assert re.fullmatch(r"[0-9]{3,}", task_id), task_id
        task = selection.tasks[task_id]
        assert task.directory == (fuzz_selection / f"task_{task_id}").resolve()
        assert task.directory.parent == fuzz_selection.resolve()
        _check_task(task)


# --- --task-id ---------------------------------------------------------------------------------


@FUZZ
@given(
    text=st.one_of(
        st.text(max_size=30),
        st.text(alphabet="0123456789-, ", max_size=30),
        st.text(alphabet="0123456789٠١٢-, ", max_size=12),
    )
)
@example(text="1-" + "9" * 5000)
@example(text="0-99999999999")
def test_task_id_filter(text: str) -> None:
    try:
        ids = parse_task_id_filter(text)
    except SelectionError:
        return
    assert ids
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[0-9]+", task_id) for task_id in ids)


# --- env files -----------------------------------------------------------------------------------

env_lines = st.one_of(
    st.builds(
        lambda export, key, sep, value: f"{export}{key}{sep}{value}",
        st.sampled_from(["", "export ", "export\t", "  "]),
        st.one_of(st.from_regex(_NAME, fullmatch=True), st.text(max_size=6)),
        st.sampled_from(["=", " = ", "", "=="]),
        st.one_of(
            st.text(max_size=20),
            st.text(max_size=12).map(lambda v: f'"{v}"'),
            st.text(max_size=12).map(lambda v: f"'{v}'"),
            st.text(max_size=12).map(lambda v: f"{v} # note"),
        ),
    ),
    st.sampled_from(["", "#", "# comment", "   ", "\t"]),
    st.text(max_size=30),
)
env_documents = st.one_of(
    st.lists(env_lines, max_size=10).flatmap(
        lambda lines: st.sampled_from(["\n", "\r\n", "\r"]).map(lambda eol: eol.join(lines))
    ),
    st.text(max_size=200),
)


@FUZZ
@given(text=env_documents)
@example(text="'A\n'=x")
@example(text='A="unterminated\n')
@example(text="A=1\n\n\nbad line\n")
def test_env_file_parser(text: str) -> None:
    try:
        values = parse_env_text(text, "fuzz.env")
    except ProfileError as exc:
        match = re.fullmatch(r"fuzz\.env: line (\d+): .+", str(exc))
        assert match, str(exc)
        assert 1 <= int(match.group(1)) <= len(re.split(r"\r\n|\n|\r", text))
        return
    for key, value in values.items():
        assert _NAME.fullmatch(key), key
        assert isinstance(value, str)


# --- gateway URLs ----------------------------------------------------------------------------------

url_parts = st.builds(
    lambda scheme, userinfo, host, port, path, query: f"{scheme}{userinfo}{host}{port}{path}{query}",
    st.sampled_from(["http://", "https://", "HTTP://", "ftp://", "", "//", "http:/"]),
    st.sampled_from(["", "u:p@", "u@", ":@", "a:b:c@"]),
    st.one_of(
        st.sampled_from(
            ["gw.example.edu", "127.0.0.1", "[::1]", "[fe80::1%eth0]", "localhost", "-x-", "a_b", ""]
        ),
        st.text(max_size=10),
    ),
    st.sampled_from(["", ":", ":0", ":1", ":4000", ":65535", ":65536", ":-1", ":x", ":080"]),
    st.one_of(st.sampled_from(["", "/", "/v1", "/v1/", "//v1", "/%0a", "/a b"]), st.text(max_size=10)),
    st.sampled_from(["", "?key=1", "#frag", "?a#b"]),
)


@FUZZ
@given(url=st.one_of(url_parts, st.text(max_size=40)))
@example(url="http://[::1]:4000/v1")
def test_gateway_parser(url: str) -> None:
    try:
        gateway = parse_gateway(url, "FUZZ_URL")
    except ProfileError as exc:
        assert str(exc).startswith("FUZZ_URL: ")
        return
    assert gateway.scheme in ("http", "https")
    assert 1 <= gateway.port <= 65535
    assert gateway.host and gateway.host == gateway.host.lower()
    assert "@" not in gateway.url and "?" not in gateway.url and "#" not in gateway.url
    # What sciencebench records and passes on parses back to the same gateway.
    assert parse_gateway(gateway.url, "FUZZ_URL") == gateway
