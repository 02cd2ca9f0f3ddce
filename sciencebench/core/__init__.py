"""What the login node and the worker hosts share: models, errors, settings, the jobs layout.

Nothing here talks to Redis, Docker or Pier, and nothing here imports the
other folders of the package (an import-linter contract checks it).
"""
