"""Container labels: compose's own, and the two sciencebench puts on trial containers."""

from __future__ import annotations

COMPOSE_PROJECT_LABEL = "com.docker.compose.project"
COMPOSE_SERVICE_LABEL = "com.docker.compose.service"
# Every container the network-policy environment starts carries this label
# (its value is the container's role); a sweep only touches such projects.
MANAGED_LABEL = "org.sciencebench.network-role"
# Which worker state directory started a trial's containers (`hostlocks.owner_id`):
# a sweep only removes projects of its own host state, never another worker's live trial.
OWNER_LABEL = "org.sciencebench.owner"
