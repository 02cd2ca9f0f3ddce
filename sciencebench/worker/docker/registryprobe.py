"""Ask a registry how long to wait: one manifest HEAD, read for its Retry-After and RateLimit headers.

The Engine passes on a registry's refusal as text only, without its
headers. After a refused pull the worker sends the registry one HEAD of the
image's manifest (free on Docker Hub, which answers it with
`ratelimit-limit` / `ratelimit-remaining`), with a bearer token fetched the
way the Engine does when the registry asks for one (the host's own
credentials, `images.registry_auth`, or anonymous). Advice only: any
failure means no hint, and the back-off doubles instead.
"""

from __future__ import annotations

import ipaddress
import re
import time
from typing import Any
from urllib.parse import urlsplit

import requests

from sciencebench.core.registryhints import hint_sec

PROBE_TIMEOUT_SEC = 10.0
# The host the Docker Hub registry API answers on (the Engine's default registry).
DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io")


def registry_url(registry: str) -> str:
    """The registry's API base: plain HTTP for loopback (as the Engine allows it), HTTPS otherwise."""
    if registry in DOCKER_HUB:
        return "https://registry-1.docker.io"
    host = urlsplit(f"//{registry}").hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    return f"{'http' if loopback else 'https'}://{registry}"


def probe_hint_sec(registry: str, name: str, digest: str, auth: dict[str, Any] | None) -> float | None:
    """The wait the registry's answer to a HEAD of `name@digest` asks for (`registryhints.hint_sec`)."""
    url = f"{registry_url(registry)}/v2/{name}/manifests/{digest}"
    accept = ", ".join((
        "application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ))  # fmt: skip
    headers = {"Accept": accept}
    try:
        with requests.Session() as session:
            session.trust_env = False  # no proxy variables: the registry itself, as the Engine reaches it
            answer = session.head(url, headers=headers, timeout=PROBE_TIMEOUT_SEC, allow_redirects=False)
            challenge = answer.headers.get("WWW-Authenticate", "")
            if answer.status_code == 401 and challenge.lower().startswith("bearer"):
                token = _token(session, challenge, name, auth)
                if token:
                    headers["Authorization"] = f"Bearer {token}"
                    answer = session.head(
                        url, headers=headers, timeout=PROBE_TIMEOUT_SEC, allow_redirects=False
                    )
            return hint_sec(dict(answer.headers), time.time())
    except (requests.RequestException, ValueError):
        return None


def _token(session: requests.Session, challenge: str, name: str, auth: dict[str, Any] | None) -> str | None:
    """A bearer token to pull `name` from the challenge's realm (the host's credentials, else anonymous)."""
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", "")
    if not realm.startswith("https://") and not realm.startswith("http://"):
        return None
    params.setdefault("scope", f"repository:{name}:pull")
    user, password = (auth or {}).get("username"), (auth or {}).get("password")
    basic = (str(user), str(password)) if user and password else None
    answer = session.get(realm, params=params, auth=basic, timeout=PROBE_TIMEOUT_SEC)
    if answer.status_code != 200:
        return None
    body = answer.json()
    token = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
    return str(token) if token else None
