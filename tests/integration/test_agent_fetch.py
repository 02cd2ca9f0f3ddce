"""The online install's fetcher (`bake.fetch`) against a loopback npm registry: integrity or nothing.

A real HTTP server on 127.0.0.1 serves a packument and a tarball; the
fetcher keeps the tarball's binary only when the tarball matches the sha512
integrity the packument gives, and writes the artifact directory (with its
MANIFEST) only then.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sciencebench.bake.fetch import FetchError, fetch_npm

pytestmark = pytest.mark.integration

PACKAGE = "@anthropic-ai/claude-code-linux-x64"
BINARY = b"#!/bin/sh\necho 9.9.9\n"


def tarball(binary: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        info = tarfile.TarInfo("package/claude")
        info.size, info.mode = len(binary), 0o755
        tar.addfile(info, io.BytesIO(binary))
    return out.getvalue()


@pytest.fixture
def registry() -> Iterator[tuple[str, dict[str, bytes]]]:
    """A loopback registry serving `files` (path -> body), and its URL."""
    files: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = files.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", files
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def publish(files: dict[str, bytes], url: str, served: bytes, integrity_of: bytes) -> None:
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(integrity_of).digest()).decode()
    dist = {"tarball": f"{url}/-/claude.tgz", "integrity": integrity}
    files["/" + PACKAGE.replace("/", "%2f")] = json.dumps({"versions": {"9.9.9": {"dist": dist}}}).encode()
    files["/-/claude.tgz"] = served


def test_a_tarball_matching_its_integrity_is_kept_with_its_manifest(
    registry: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    url, files = registry
    good = tarball(BINARY)
    publish(files, url, good, good)
    directory = fetch_npm("claude-code", "9.9.9", tmp_path, url)
    assert directory == tmp_path / "claude-code" / "9.9.9"
    assert (directory / "claude").read_bytes() == BINARY
    assert (directory / "TARBALL").read_text() == f"tarball {hashlib.sha256(good).hexdigest()}\n"
    manifest = (directory / "MANIFEST").read_text().splitlines()
    assert manifest[0] == f"source npm:{PACKAGE}@9.9.9"
    assert manifest[2] == f"{hashlib.sha256(BINARY).hexdigest()}  claude"


def test_a_tarball_not_matching_its_integrity_is_refused_and_nothing_is_kept(
    registry: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    url, files = registry
    publish(files, url, tarball(b"#!/bin/sh\necho tampered\n"), tarball(BINARY))
    with pytest.raises(FetchError, match="does not match its sha512 integrity"):
        fetch_npm("claude-code", "9.9.9", tmp_path, url)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]  # no artifacts, no leftovers
