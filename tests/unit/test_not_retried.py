"""A failure the network policy decided is not tried again under --max-retries: a try decides the same."""

from __future__ import annotations

import inspect

import pytest

from sciencebench.core.errors import PolicyError, Stage
from sciencebench.core.failures import recorded_failure
from sciencebench.network import environment, errors
from sciencebench.worker.stages import POLICY_ERRORS

pytestmark = pytest.mark.unit


def test_every_exception_the_policy_environment_raises_is_not_retried() -> None:
    raised = {
        cls
        for module in (environment, errors)
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, Exception) and cls.__module__ in (environment.__name__, errors.__name__)
    }
    assert {cls.__name__ for cls in raised} >= {"PolicyRefused", "PolicyViolation", "AgentImageMismatch"}
    assert raised - {PolicyError} <= set(POLICY_ERRORS)  # the worker imports every one Pier may record
    for cls in raised:
        assert recorded_failure(cls.__name__) == (Stage.POLICY, True), cls
