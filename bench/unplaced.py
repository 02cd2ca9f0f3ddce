"""`sciencebench` with image-aware placement off: the campaign's baseline (`bench.campaign`).

    python -m bench.unplaced worker ...   /   python -m bench.unplaced submit ...

Fair share still picks each trial; every trial then goes to the shared queue,
where any host's free slot takes it, as before placement
(`coordination.shares.place` answers None). A worker's pool processes are
forked from this process, so they keep the switch.
"""

from __future__ import annotations

from typing import Any

from sciencebench.coordination import shares


def _shared_queue(*_args: Any, **_kwargs: Any) -> None:
    """No host chosen: the shared queue."""
    return None


def main() -> None:
    """The sciencebench CLI, placement off."""
    shares.place = _shared_queue  # type: ignore[assignment]
    from sciencebench.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
