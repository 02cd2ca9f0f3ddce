#!/bin/bash
# The fake Pier of the tests, with its real start time on record.
#
# The fake's own log (FAKE_PIER_LOG) starts after Python's start-up and its
# imports. This wrapper appends "<pid> <epoch seconds>" to BENCH_PIER_START_LOG
# before anything else and then becomes the fake (exec keeps the pid), so the
# benchmark can count each Pier process from its true start. Bash builtins
# only: no process is forked here.
if [ -n "${BENCH_PIER_START_LOG:-}" ]; then
    printf '%s %s\n' "$$" "$EPOCHREALTIME" >> "$BENCH_PIER_START_LOG"
fi
exec "${0%/*}/../tests/fixtures/fake_pier.py" "$@"
