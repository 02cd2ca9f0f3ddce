"""One module per benchmark item; each measures with a `Harness` and returns `bench.report.Outcome`s."""
