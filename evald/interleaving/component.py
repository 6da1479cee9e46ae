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
   partition's open credit share of its window (``shares.CreditShares``) with its user's
   bootstrap weights; the list counts ``credited`` when a pair was compared, else
   ``no_credit`` (nobody clicked).

The window sums are each partition's credit shares (shares.py: the comparisons' rule, final by
the partition's own watermark). With ``fold`` (the engine sees every partition: replay, the
demo) ``advance`` freezes every partition's final shares into the engine's own ``LiveCredit``
and folds the windows final in all of them, in window order. Without it (the daemon) the
commits publish the final shares (``freeze``, the engine's ``final_shares``) and the open ones
go in the checkpoint (``state``/``load``); the fold is the statistics topic reader's,
``attach``ed here so that the records and series read it (docs/statistics.md, "Interleaving").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from evald.config import InterleavingConfig
from evald.interleaving.credit import gains, outcomes, team_credits
from evald.interleaving.fold import PreferenceState, Settings
from evald.interleaving.live import LiveCredit
from evald.interleaving.report import lines
from evald.interleaving.shares import CreditFrozen, CreditShares
from evald.interleaving.teams import Teams
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
        window: int,
    ) -> None:
        """``window``: the attribution window (when a share is final); ``fold``: this engine
        sees every partition and folds its own shares."""
        self.config = config
        self.segments = segments
        self.replicates = replicates
        self.settings = Settings(
            config.alpha, config.tuning_n, config.min_n, config.srm_alpha, config.start
        )
        #: each partition's open credit shares (None: no team declared, nothing credited)
        self.shares: CreditShares | None = None
        if config.teams:
            self.shares = CreditShares(config.window, window, replicates)
        #: the folded test: the engine's own (``fold``) or the one ``attach`` gave (None: none)
        self.live: LiveCredit | None = None
        if fold:
            self.live = LiveCredit(self.settings, config.window, replicates)
        self._folds = fold
        self.outcomes: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self._teams = frozenset(config.teams)

    @property
    def seen(self) -> bool:
        """Whether an interleaved list has closed (replay's summary then reports them)."""
        return any(self.outcomes.values())

    @property
    def state(self) -> PreferenceState | None:
        """The folded test (None: no fold here nor attached)."""
        return None if self.live is None else self.live.state

    def attach(self, live: LiveCredit) -> None:
        """Read the test from a fold fed elsewhere (the daemon's statistics topic reader)."""
        self.live = live
        self._folds = False

    def records(self) -> list[dict[str, Any]]:
        """Every (segment, pair) of the fold as ``report.record`` gives it (empty without)."""
        return [] if self.live is None else self.live.records(self.segments.keys)

    def lines(self) -> list[str]:
        """The text summary's interleaving lines (none when no interleaved list closed)."""
        if not self.seen:
            return []
        return lines(self.records(), self.settings, self.config.credit, self.outcomes)

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
            if self.shares is None:
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
        if rows_of and self.shares is not None:
            self.shares.observe(
                partition,
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

    # ------------------------------------------------------------------ shares

    def advance(self, watermarks: Mapping[int, int | None], *, final: bool = False) -> None:
        """After a tick or the drain (``final``), with ``fold``: hand every partition's final
        shares (at its ``watermarks`` entry; all when ``final``) to the fold, then fold the
        windows final in every partition with a watermark. Nothing without ``fold``."""
        live, shares = self.live, self.shares
        if not self._folds or live is None or shares is None:
            return
        for p, watermark in watermarks.items():
            frozen = shares.freeze(p, watermark, final=final)
            if frozen is not None:
                live.add(frozen)
        live.fold([p for p, watermark in watermarks.items() if watermark is not None])

    def final_shares(self, partition: int, watermark: int | None) -> CreditFrozen | None:
        """The partition's shares final at ``watermark`` and its mark, handed out once (the
        daemon's commit publishes them); None when the mark did not move or no team is
        declared."""
        return None if self.shares is None else self.shares.freeze(partition, watermark)

    def shares_due(self, partition: int, watermark: int | None) -> bool:
        return self.shares is not None and self.shares.due(partition, watermark)

    def state_of(self, partition: int) -> dict[str, Any] | None:
        """The partition's open shares for its checkpoint (None: no team declared)."""
        return None if self.shares is None else self.shares.state(partition)

    def load(self, partition: int, doc: Any, watermark: int | None) -> None:
        """Take the open shares ``state_of`` stored (``doc``; None or foreign: start empty,
        the windows final at ``watermark`` counting as handed out)."""
        if self.shares is not None:
            self.shares.load(partition, doc, watermark)

    def drop(self, partition: int) -> None:
        """Forget a partition's open shares (another instance owns it now)."""
        if self.shares is not None:
            self.shares.drop(partition)
