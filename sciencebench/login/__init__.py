"""The login node: validate a selection, record the run, dispatch its trials, follow the job.

Nothing here starts Pier or talks to Docker: the login node needs no worker
extra (a test installs the package without it and runs `submit --dry-run`),
and it never imports `sciencebench.worker` (an import-linter contract).
"""
