"""Dispatch a bare Celery chord of no-op tasks, as a process of its own.

`python -m bench.bare_dispatch --broker URL --n 10000 [--events]` imports
Celery, builds the no-op app of `bench.noop_app` and sends
`chord(group(noop x N))(noop_finalize)` with stock Celery, then exits. The
benchmark times this process from start to exit (and reads its peak RSS),
exactly as it times `sciencebench submit`. It prints one JSON line with the
time the chord call itself took.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    started = time.monotonic()
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--events", action="store_true", help="task-sent events on, as sciencebench")
    args = parser.parse_args()

    from celery import chord, group

    from bench.noop_app import NOOP, NOOP_FINALIZE, create_noop_app

    app = create_noop_app(args.broker, events=args.events)
    imported = time.monotonic()
    header = group(app.signature(NOOP) for _ in range(args.n))
    result = chord(header)(app.signature(NOOP_FINALIZE).set(immutable=True))
    done = time.monotonic()
    print(json.dumps({"import_s": imported - started, "dispatch_s": done - imported, "id": result.id}))


if __name__ == "__main__":
    main()
