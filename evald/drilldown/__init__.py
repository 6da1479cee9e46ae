"""The drill-down: which queries carry a segment's traffic and its change (docs/drilldown.md)."""
