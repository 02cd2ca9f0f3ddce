"""The egress plan of one trial environment: its mode and what its proxy allows (no Docker).

An environment whose agent declares a provider allowlist gets
`isolated-allowlist` (an internal bridge, the pinned squid proxy as the only
way out); one without (nop, oracle, verifiers) gets `network_mode: none`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from sciencebench.core.errors import PolicyRefused, ProfileError
from sciencebench.core.gateways import Gateway, parse_gateway, parse_pins
from sciencebench.core.images import check_image_ref
from sciencebench.core.settings import PROXY_IMAGE_ENV
from sciencebench.network.compose import Mode
from sciencebench.network.squid import normalize_domains, render_squid_conf


@dataclass(frozen=True)
class EgressPlan:
    """What one environment will run: its mode and, in egress mode, what the proxy allows."""

    mode: Mode
    domains: tuple[str, ...] = ()
    gateways: tuple[Gateway, ...] = ()
    proxy_image: str | None = None
    # gateway host -> the address the worker checked (`core.gateways.pin_gateways`); the proxy uses only it
    pins: tuple[tuple[str, str], ...] = ()

    @property
    def inference_domains(self) -> list[str]:
        """Every host the proxy lets through (allowlist entries and gateway hosts)."""
        return sorted(set(self.domains) | {g.host for g in self.gateways})

    @property
    def gateway_authorities(self) -> list[str]:
        """`host:port` of every configured gateway, sorted."""
        return sorted({g.authority for g in self.gateways})


def parse_inference_urls(value: object) -> list[Gateway]:
    """Gateways from the `inference_urls` environment keyword.

    Pier hands `--ek` values over JSON-decoded when they parse, so `value` is
    a list of URLs, a single URL, a JSON list still in a string, or None.
    Raises PolicyRefused for anything that is not an http(s) URL with a valid
    host and port (the URL itself is not echoed: it may embed a credential).
    """
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.lstrip().startswith("[") else [value]
        except json.JSONDecodeError:
            raise PolicyRefused("inference_urls: not a JSON list of URLs") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyRefused("inference_urls: expected a list of URL strings")
    gateways: list[Gateway] = []
    for position, url in enumerate(value, start=1):
        try:
            gateways.append(parse_gateway(url, f"inference_urls[{position}]"))
        except ProfileError as exc:
            raise PolicyRefused(str(exc)) from None
    return list(dict.fromkeys(gateways))


def plan_egress(
    *,
    allow_internet: bool,
    uses_compose: bool,
    allowlist_domains: Sequence[str],
    inference_urls: object,
    proxy_image: str | None,
    gateway_pins: object = None,
) -> EgressPlan:
    """Decide the mode of one environment, or refuse it.

    Egress exists only when the harness declares a provider allowlist. With a
    gateway configured (`inference_urls`, the job profile's gateways) the
    proxy allows those gateways and nothing else: the harness's own
    allowlist (Pier's provider defaults such as `api.openai.com` or
    `.amazonaws.com`) is replaced, not added to. Without one, the allowlist's
    exact hosts are allowed on 80/443. A digest-pinned proxy image is
    required. Raises PolicyRefused when the task allows internet, a gateway
    URL is invalid or names an IPv6 host, the allowlist used has a suffix or
    an invalid entry, the proxy image is missing or not pinned, or a task's own
    docker-compose.yaml would be combined with egress. `gateway_pins` (the
    worker's, `core.gateways.pin_gateways`) must name gateway hosts only.
    """
    if allow_internet:
        raise PolicyRefused("task sets allow_internet = true; the offline network policy refuses it")
    gateways = parse_inference_urls(inference_urls)
    pins = _pins(gateway_pins, gateways)
    if not allowlist_domains:
        return EgressPlan(mode="none")
    domains = [] if gateways else _exact_hosts(allowlist_domains)
    if uses_compose:
        raise PolicyRefused("inference egress is not supported for tasks with their own docker-compose.yaml")
    if not proxy_image:
        raise PolicyRefused(
            f"no inference proxy image configured: set {PROXY_IMAGE_ENV} "
            "(or --ek proxy_image=...) to a digest-pinned squid image"
        )
    try:
        check_image_ref(proxy_image)
    except ValueError as exc:
        raise PolicyRefused(f"proxy image: {exc}") from None
    render_squid_conf(domains, gateways, pins)  # refuses what the proxy cannot express (an IPv6 gateway), now
    return EgressPlan(
        mode="isolated-allowlist",
        domains=tuple(domains),
        gateways=tuple(gateways),
        proxy_image=proxy_image,
        pins=tuple(sorted(pins.items())),
    )


def _pins(value: object, gateways: Sequence[Gateway]) -> dict[str, str]:
    """The worker's pins, each for one of the gateways' hosts (or PolicyRefused)."""
    try:
        pins = parse_pins(value)
    except ValueError as exc:
        raise PolicyRefused(str(exc)) from None
    if strays := sorted(set(pins) - {gateway.host for gateway in gateways}):
        raise PolicyRefused(f"gateway pins: {strays[0]} is not a gateway's host")
    return pins


def _exact_hosts(allowlist_domains: Sequence[str]) -> list[str]:
    """The harness's allowlist as the proxy's hosts, used when no gateway is configured (or PolicyRefused)."""
    try:
        return normalize_domains(allowlist_domains)
    except PolicyRefused as exc:
        raise PolicyRefused(
            f"the harness's network allowlist cannot be used without a gateway: {exc}; "
            "configure the provider's gateway URL in the job's --env-file (docs/gateways.md)"
        ) from None
