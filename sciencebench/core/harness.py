"""The harness both sides agree on: the Pier release and the policy environment.

Workers refuse to run any other Pier release; the login node records these
names in the run record.
"""

from __future__ import annotations

PIER_VERSION = "0.3.0"
# Pier imports these on worker hosts; their import paths are part of the run record.
POLICY_ENVIRONMENT = "sciencebench.network.environment:IsolatedDockerEnvironment"
POLICY_NAME = "isolated-bridge"
# Each agent's facts (its adapter among them): `sciencebench.core.harnesses`.
