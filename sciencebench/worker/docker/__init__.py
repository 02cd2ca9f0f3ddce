"""The worker host's Docker Engine: its facts, pinned pulls, host locks, cleanup.

Only this folder and the network policy environment (`sciencebench.network`)
import the Docker SDK (a ruff banned-api rule checks it).
"""
