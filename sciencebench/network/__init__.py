"""The offline network policy: compose patches, the proxy's allowlist, inspection.

Pure parts (`squid`, `compose`, `inspection.inspect_policy`) import nothing
from Pier; `environment` holds the Pier environment subclass and is imported
only where Pier is installed (worker hosts).
"""
