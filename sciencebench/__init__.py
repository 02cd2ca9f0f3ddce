"""sciencebench: run the SWE-bench-science benchmark with Pier across many worker hosts."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sciencebench")
except PackageNotFoundError:  # a source checkout that was never installed
    __version__ = "0.0.0"
