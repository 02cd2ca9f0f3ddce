"""A failure the network policy decided is not tried again under --max-retries: a try decides the same."""

from __future__ import annotations

import inspect

import pytest

from sciencebench.network import environment, errors
from sciencebench.worker.stages import NOT_RETRIED

pytestmark = pytest.mark.unit


def test_every_exception_the_policy_environment_raises_is_not_retried() -> None:
    raised = {
        name
        for module in (environment, errors)
        for name, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, Exception) and cls.__module__ == module.__name__
    }
    assert raised >= {"PolicyRefused", "PolicyViolation", "AgentImageMismatch"}
    assert sorted(raised - NOT_RETRIED) == []
