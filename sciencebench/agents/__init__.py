"""Harness adapters sciencebench passes to Pier with `--agent-import-path`."""
