"""Interleaved impressions: one list merged from several rankers ("teams"), credited to the
ranker whose items get the clicks, and an always-valid test of which ranker users prefer
(docs/semantics.md §9; docs/statistics.md, "Interleaving").

One job per module: teams.py (an impression's team data and its checks), credit.py (the credit
of one closed list, pure), draft.py (the interleaving methods, for simulations and tests),
sums.py and windows.py (mergeable sums of a pair of teams, per event-time window), fold.py
(the preference test over complete windows, pure), component.py (what the engine calls),
report.py (what replay prints), exported.py (the series rows), simulation.py (the figures of
docs/statistics.md).
"""
