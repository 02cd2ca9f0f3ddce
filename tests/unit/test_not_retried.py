"""A failure the network policy decided is not tried again under --max-retries: a try decides the same."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import sciencebench.network
from sciencebench.core import errors
from sciencebench.core.errors import PolicyError, Stage
from sciencebench.core.failures import recorded_failure

pytestmark = pytest.mark.unit


def test_every_exception_the_policy_environment_raises_is_not_retried() -> None:
    modules = [errors] + [
        importlib.import_module(f"{sciencebench.network.__name__}.{info.name}")
        for info in pkgutil.iter_modules(sciencebench.network.__path__)
    ]
    raised = {
        cls
        for module in modules
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, PolicyError) and cls is not PolicyError
    }
    assert {cls.__name__ for cls in raised} >= {"PolicyRefused", "PolicyViolation", "AgentImageMismatch"}
    # The worker finds every one Pier may record by name (`failure_class`) without importing the environment.
    assert all(cls.__module__ == errors.__name__ for cls in raised)
    for cls in raised:
        assert recorded_failure(cls.__name__) == (Stage.POLICY, True), cls
