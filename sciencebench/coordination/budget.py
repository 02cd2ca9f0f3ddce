"""A job's budget: what its trials spent, cluster-wide, and whether another trial may start.

`submit --max-cost USD` and `--max-tokens N` cap a job. The store keeps one
ledger per job (`sciencebench:J:budget`; over Redis its Lua functions run
inside `commit_result` and `start`): the spend is added in the very step
that stores a record, and `Leases.start` refuses to start a trial once the
spend has reached a limit (`Budgets` says how). A trial Pier cannot price
still counts its tokens; with `--max-cost` and no price, only tokens can be
capped. Every job keeps the spend; only a job with limits is ever refused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol

from pydantic import BaseModel, Field

from sciencebench.core.models import TrialRecord

_NEVER = datetime.max.replace(tzinfo=UTC)
# Why a trial never started: its job's budget was reached (`TrialRecord.not_started`).
BUDGET = "budget"


class Spend(BaseModel):
    """What one record (or a set of them) spent: tokens (input + output) and dollars; None when unknown."""

    tokens: int | None = None
    cost_usd: float | None = None


class Budget(BaseModel):
    """A job's ledger as the store holds it: its limits, its spend, and when the limits were reached."""

    max_cost_usd: float | None = None
    max_tokens: int | None = None
    tokens: int = 0
    cost_usd: float = 0.0
    trials: int = 0  # committed records that reported a spend
    unpriced: int = 0  # of those, records with tokens but no cost
    first_priced: bool | None = None  # whether the first record with tokens had a cost
    # Trial key -> when the check let it start (the store's clock, s); kept for a job with limits only.
    started: dict[str, float] = Field(default_factory=dict)
    reached_at: float | None = None
    started_when_reached: int | None = None

    @property
    def limited(self) -> bool:
        """Whether the job has a limit at all."""
        return self.max_cost_usd is not None or self.max_tokens is not None

    @property
    def reached(self) -> bool:
        """Whether the spend has reached a limit: no further trial of the job starts."""
        return reached(self.max_cost_usd, self.max_tokens, self.cost_usd, self.tokens)

    @property
    def only_tokens(self) -> bool:
        """The job has --max-cost, but Pier could not price its first trial with tokens."""
        return self.max_cost_usd is not None and self.first_priced is False


def reached(max_cost_usd: float | None, max_tokens: int | None, cost_usd: float, tokens: int) -> bool:
    """Whether a spend has reached either limit (a limit of None never is)."""
    return (max_cost_usd is not None and cost_usd >= max_cost_usd) or (
        max_tokens is not None and tokens >= max_tokens
    )


def spend_of(record_json: str) -> Spend:
    """The spend a TrialRecord's JSON reports (tokens: input + output); nothing from what is not one."""
    try:
        record = json.loads(record_json)
    except ValueError:
        return Spend()
    if not isinstance(record, dict):
        return Spend()
    counts = [_amount(record.get(name)) for name in ("n_input_tokens", "n_output_tokens")]
    numbers = [int(c) for c in counts if c is not None]
    return Spend(tokens=sum(numbers) if numbers else None, cost_usd=_amount(record.get("cost_usd")))


def _amount(value: object) -> float | None:
    """A spend's number: a non-negative finite JSON number, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        return None
    return float(value)


def spend_args(spend: Spend) -> list[str]:
    """A spend as the scripts' two arguments: tokens and cost, '' when unknown."""
    tokens = "" if spend.tokens is None else str(spend.tokens)
    return [tokens, "" if spend.cost_usd is None else repr(spend.cost_usd)]


def total_spend(spends: list[Spend]) -> Spend:
    """The sum of spends (None where none reported it)."""
    tokens = [s.tokens for s in spends if s.tokens is not None]
    costs = [s.cost_usd for s in spends if s.cost_usd is not None]
    return Spend(tokens=sum(tokens) if tokens else None, cost_usd=sum(costs) if costs else None)


class Budgets(Protocol):
    """A job's budget: its limits, what its committed trials spent, which trials it let start.

        spend    each committed record's Pier totals (`TrialRecord.n_input_tokens`
                 + `n_output_tokens`, `cost_usd`) are added in the very step that
                 stores the record, so two hosts committing at once never lose one
        check    `Leases.start` refuses to start a trial (`Start.over_budget`) once
                 the spend has reached a limit, in the step that claims it; the
                 trials it lets start are noted with the store's clock
                 (`sciencebench:J:budget:started`, only for a job with limits)
        reached  the commit that first reaches a limit stamps `reached_at` (the
                 store's clock) and how many trials had started by then

    The first record with tokens says whether the job's trials had a cost
    (`first_priced`).
    """

    def set_budget(
        self, job: str, max_cost_usd: float | None, max_tokens: int | None, spent: Spend | None = None
    ) -> Budget:
        """Set the job's limits (None: none); `spent` seeds a ledger the store has lost (else it is kept).

        Whether the limits are reached is judged again at once: a limit the
        spend has reached already is reached now, a higher one lets trials
        start again (`retry --max-cost NEW`). Returns the ledger.
        """
        ...

    def budget(self, job: str) -> Budget:
        """The job's ledger (an empty one when the store has none)."""
        ...

    def start_within_budget(self, job: str, key: str) -> bool:
        """Let the trial start unless the job's budget is reached (then False); one atomic step.

        What `Leases.start` does in its own step; for a trial that got its
        slot later (the embedded mode waits for one).
        """
        ...


# --- over Redis: the scripts are `lua/set_budget.lua`, `lua/start_within_budget.lua` and the
# functions `lua/lib/budget_reached.lua`, `let_start.lua`, `add_spend.lua` (`coordination.scripts`).


def from_hash(ledger: dict[str, str], started: dict[str, str]) -> Budget:
    """A Budget from the ledger hash and the started hash as Redis returns them."""

    def number(name: str) -> float | None:
        value = ledger.get(name)
        return float(value) if value not in (None, "") else None

    max_tokens = number("max_tokens")
    when = number("started_when_reached")
    first = ledger.get("first_priced")
    return Budget(
        max_cost_usd=number("max_cost_usd"),
        max_tokens=None if max_tokens is None else int(max_tokens),
        tokens=int(number("tokens") or 0),
        cost_usd=number("cost_usd") or 0.0,
        trials=int(number("trials") or 0),
        unpriced=int(number("unpriced") or 0),
        first_priced=None if first is None else first == "1",
        started={key: float(at) for key, at in started.items()},
        reached_at=number("reached_at"),
        started_when_reached=None if when is None else int(when),
    )


# --- what people read: `status`, and the line under a job's summary ------------------------------


def usd(amount: float) -> str:
    """Dollars as the lines below show them: `$1.25`, `$0.0034`."""
    return f"${amount:.2f}" if amount >= 1 or amount == 0 else f"${amount:.4f}"


def status_line(ledger: Budget) -> str | None:
    """`status`'s line on a job with a budget: spend against each limit, and whether it is reached."""
    if not ledger.limited:
        return None
    parts = []
    if ledger.max_cost_usd is not None:
        parts.append(f"{usd(ledger.cost_usd)} of --max-cost {usd(ledger.max_cost_usd)}")
    if ledger.max_tokens is not None:
        parts.append(f"{ledger.tokens} of --max-tokens {ledger.max_tokens} tokens")
    line = "budget: " + ", ".join(parts)
    if ledger.reached:
        line += (
            f"; reached after {ledger.started_when_reached or 0} started trial(s): no further trial starts"
        )
    if ledger.only_tokens:
        line += "; only tokens can be capped (Pier could not price the first trial with tokens)"
    return line


def record_spend(record: TrialRecord) -> Spend:
    """What a record reports its Pier run spent (as `spend_of` reads its JSON)."""
    counts = [c for c in (record.n_input_tokens, record.n_output_tokens) if c is not None]
    return Spend(tokens=sum(counts) if counts else None, cost_usd=record.cost_usd)


def budget_lines(records: Sequence[TrialRecord], capped_cost: bool) -> tuple[list[str], int]:
    """The lines under a job's summary, and how many trials its budget did not start.

    "budget reached after N trials, M not started" when the budget left any
    trial unstarted (N: the trials that did start); with --max-cost
    (`capped_cost`), a line when the first trial with tokens had no cost.
    """
    skipped = sum(r.not_started == BUDGET for r in records)
    ran = [r for r in records if r.not_started is None]
    lines = []
    if skipped:
        spent = total_spend([record_spend(r) for r in ran])
        shown = [f"{spent.tokens} tokens" if spent.tokens is not None else "",
                 usd(spent.cost_usd) if spent.cost_usd is not None else ""]  # fmt: skip
        spend = f" (spent {', '.join(filter(None, shown))})" if any(shown) else ""
        lines.append(f"budget reached after {len(ran)} trials, {skipped} not started{spend}")
    with_tokens = [r for r in ran if r.n_input_tokens is not None or r.n_output_tokens is not None]
    first = min(with_tokens, key=lambda r: r.finished_at or _NEVER, default=None)
    if capped_cost and first is not None and first.cost_usd is None:
        lines.append(
            f"--max-cost: only tokens can be capped: Pier could not price {first.label}, "
            "the first trial with tokens (a model Pier has no price for)"
        )
    return lines, skipped
