"""A worker host: preflight, pinned pulls, one Pier process per trial, cleanup.

`main` starts a Celery worker (`app`) whose thin `tasks` call `trial.execute`;
a trial runs in `stages` against the host's engine (`runtime`, `docker/`)
and Pier (`pier/`). The Pier plugins it loads (`sciencebench.network`,
`sciencebench.agents`) live beside this folder because their import paths
are public; the worker never imports them (Pier does, by those paths), and
what both sides share is in `sciencebench.dockerhost` and `sciencebench.core`.
"""
