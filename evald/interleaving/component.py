"""The engine's interleaving component: credit each closed interleaved list, sum it per
partition and window, and fold complete windows into the preference test.

The engine calls :meth:`Interleaving.observe` with every scored batch that holds an interleaved
list (``Joined.teams``), and :meth:`Interleaving.advance` after each tick and at the drain. Per
list, in order:

1. a list closed late (it arrived after its attribution window had closed) is counted
   ``late`` and not credited: whether a list is late depends only on its partition's
   watermark, so the window sums stay a function of the partition's own events (the rule of
   the comparison shares, docs/statistics.md);
2. a list naming a team that ``interleaving.teams`` does not declare is counted
   ``unknown_team`` and not credited (team names are label values: declared, like arms, so
   the series are bounded and every partition credits the same teams);
3. otherwise each team's credit (``credit.team_credits``) goes into the list's result record
   (:func:`result_field`), and each pair of its teams gets its outcome, added to the
   partition's window sums (``windows.PartitionCredit``) with its user's bootstrap weights; the
   list counts ``credited`` when a pair was compared, else ``no_credit`` (nobody clicked).

With ``fold`` (the engine sees every partition: replay, the demo) ``advance`` folds every
window complete in all partitions, in window order (``fold.fold_window``). Without it (the
daemon) only the result records get the credit: no window sums are kept (docs/statistics.md,
"Interleaving", says what the daemon does not do yet).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from evald.config import InterleavingConfig
from evald.interleaving.credit import gains, outcomes, team_credits
from evald.interleaving.fold import PreferenceState, Settings, fold_window
from evald.interleaving.report import lines, records
from evald.interleaving.teams import Teams
from evald.interleaving.windows import PartitionCredit
from evald.join.store import Joined
from evald.segments import SegmentIndex

#: what happened to an interleaved list when it closed (``Interleaving.outcomes``)
OUTCOMES: tuple[str, ...] = ("credited", "no_credit", "late", "unknown_team")


def result_field(teams: Teams, credits: dict[str, float]) -> dict[str, Any]:
    """The result record's ``"interleaving"``: the method, each team's credit, and the teams
    in the order of their first item (who led the draft)."""
    first: list[str] = []
    for name in teams.names:
        if name is not None and name not in first:
            first.append(name)
    return {"method": teams.method, "credit": credits, "order": first}


class Interleaving:
    """Credit, window sums per partition and the preference fold (see the module docstring)."""

    def __init__(
        self,
        config: InterleavingConfig,
        segments: SegmentIndex,
        replicates: int,
        *,
        fold: bool,
    ) -> None:
        self.config = config
        self.segments = segments
        self.replicates = replicates
        self.settings = Settings(config.alpha, config.tuning_n, config.min_n, config.srm_alpha)
        #: partition -> its window sums (None: no fold, nothing kept)
        self.windows: dict[int, PartitionCredit] | None = {} if fold else None
        #: the folded test (None: no fold)
        self.state: PreferenceState | None = PreferenceState() if fold else None
        self.outcomes: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self._teams = frozenset(config.teams)

    @property
    def seen(self) -> bool:
        """Whether an interleaved list has closed (replay's summary then reports them)."""
        return any(self.outcomes.values())

    def records(self) -> list[dict[str, Any]]:
        """Every (segment, pair) of the fold as ``report.record`` gives it (empty without fold)."""
        return records(self.state, self.segments.keys, self.settings)

    def lines(self) -> list[str]:
        """The text summary's interleaving lines (none when no interleaved list closed)."""
        if not self.seen:
            return []
        return lines(self.records(), self.settings, self.config.credit, self.outcomes)

    def windows_of(self, partition: int) -> PartitionCredit:
        assert self.windows is not None
        sums = self.windows.get(partition)
        if sums is None:
            sums = self.windows[partition] = PartitionCredit(self.config.window, self.replicates)
        return sums

    def observe(
        self,
        partition: int,
        joined: Joined,
        users: NDArray[np.bool_],
        weights: NDArray[np.uint8] | None,
    ) -> list[dict[str, Any] | None]:
        """Credit the interleaved rows of one scored batch (``joined.teams`` is not None;
        ``joined.teams[row]`` None: not interleaved); ``users[row]``: the list had a user id;
        ``weights``: one bootstrap weight row per list (None: no replicates). Returns each
        row's result field (``result_field``; None: not credited)."""
        assert joined.teams is not None
        fields: list[dict[str, Any] | None] = [None] * len(joined.teams)
        entries: dict[str, list[Any]] = {k: [] for k in ("start", "cell", "lead", "d", "cmp")}
        rows_of: list[int] = []
        segments = self.segments.segments
        for row, teams in enumerate(joined.teams):
            if teams is None:
                continue
            refused = self._admit(teams, joined.reasons[row])
            if refused is not None:
                self.outcomes[refused] += 1
                continue
            length = int(joined.lengths[row])
            gain = gains(joined.grades[row, :length].tolist(), self.config.credit)
            credits = team_credits(teams, gain)
            fields[row] = result_field(teams, credits)
            found = outcomes(teams, credits)
            self.outcomes["credited" if any(o.compared for o in found) else "no_credit"] += 1
            if self.windows is None:
                continue
            start = int(joined.ts[row]) // self.config.window * self.config.window
            segment = segments[int(joined.segment_ids[row])]
            for o in found:
                entries["start"].append(start)
                entries["cell"].append((segment, o.team_a, o.team_b))
                entries["lead"].append(o.lead)
                entries["d"].append(o.d)
                entries["cmp"].append(o.compared)
                rows_of.append(row)
        if rows_of and self.windows is not None:
            self.windows_of(partition).observe(
                entries["start"],
                entries["cell"],
                entries["lead"],
                entries["d"],
                entries["cmp"],
                users[rows_of].tolist(),
                None if weights is None else weights[rows_of],
            )
        return fields

    def _admit(self, teams: Teams, reason: str) -> str | None:
        """Why a closed list is not credited (an ``OUTCOMES`` value), or None."""
        if reason == "late":
            return "late"
        if not self._teams.issuperset(teams.order):
            return "unknown_team"
        return None

    # ------------------------------------------------------------------ windows

    def advance(self, before: int | None, *, final: bool = False) -> None:
        """After a tick or the drain (``final``): fold every window that ends at or before
        ``before`` (the engine's complete time; every window when ``final``) in all
        partitions, in window order. Nothing without ``fold``."""
        if self.windows is None or self.state is None:
            return
        merged = PartitionCredit(self.config.window, self.replicates)
        for sums in self.windows.values():
            merged.merge(sums.take(before, final=final))
        for start, cells in sorted(merged.windows.items()):
            self.state = fold_window(self.state, start + self.config.window, cells, self.settings)

    def drop(self, partition: int) -> None:
        """Forget a partition's window sums (another instance owns it now)."""
        if self.windows is not None:
            self.windows.pop(partition, None)
