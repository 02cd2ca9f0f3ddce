"""The worker host's Docker Engine: its facts, pinned pulls, the image budget, cleanup.

Only this folder and the network policy environment (`sciencebench.network`)
import the Docker SDK (a ruff banned-api rule checks it). Labels, host locks and
Pier's naming, shared with the policy environment, are in `sciencebench.dockerhost`.
"""
