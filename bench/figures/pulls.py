"""Item 4: pull dedup: concurrent trials sharing 2 freshly pushed images on one host with 8 slots."""

from __future__ import annotations

from bench import sb
from bench.harness import Harness
from bench.images import absent_locally, push_bench_images
from bench.measure import max_overlap, pier_runs
from bench.params import Params
from bench.report import Findings, Outcome

JOB = "pulls"


def measure(h: Harness, p: Params) -> Outcome:
    """pulls_per_image_per_host: each fresh image must be pulled once by the docker items' worker."""
    found = Findings()
    with found.kept_on_crash():
        if h.workers and not h.has_docker_worker():
            h.stop_workers()
        agent_ref, verifier_ref = push_bench_images(h.base_image, h.registry, h.pushed_refs)
        absent = absent_locally([agent_ref, verifier_ref])
        state = h.pull_state
        h.docker_worker(p.pull_trials)
        ids = [f"{i:03d}" for i in range(1, p.pull_trials + 1)]
        sel = h.selection(
            "sel-pull",
            {i: {"sleep_sec": p.pull_sleep_sec} for i in ids},
            agent_image=agent_ref,
            verifier_image=verifier_ref,
        )
        run = h.submit(sel, JOB, n_concurrent=p.pull_trials)
        counts = sb.pull_counts(state)
        runs = pier_runs(h, JOB)
        overlap = max_overlap(runs)
        wanted = {ref.partition("@")[2] for ref in (agent_ref, verifier_ref)}
        per_image = [counts.get(d, 0) for d in sorted(wanted)]
        errored = run.answer["n_errored_trials"]
        found.raw["pulls"] = {
            "images": [agent_ref, verifier_ref],
            "absent_before": len(absent),
            "pull_counts": counts,
            "pull_log": str(sb.pull_log_path(state)),
            "trials": len(ids),
            "max_concurrent_pier": overlap,
            "errored": errored,
            "wall_s": run.wall_s,
        }
        worst = max(per_image) if per_image else 0
        ok = per_image == [1, 1] and len(absent) == 2 and errored == 0
        found.figure(
            "pulls_per_image_per_host",
            worst,
            "== 1",
            ok,
            f"pulls per image {per_image}; images absent before: {len(absent)}/2; {len(ids)} trials, "
            f"up to {overlap} Pier runs at once, {errored} errored",
        )
    return found.outcome()
