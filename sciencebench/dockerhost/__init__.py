"""What a worker host's Docker trials are known by, shared by the worker and the policy environment.

Container labels (`labels`), Pier's trial and compose-project names
(`naming`), and the host-local state directory with its flocks
(`hostlocks`). A leaf: it imports only `sciencebench.core` (an
import-linter contract checks it), so the network policy environment,
which runs inside Pier, and the worker use it without importing each other.
"""
