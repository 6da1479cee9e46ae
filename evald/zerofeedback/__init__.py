"""Zero-feedback signals: what served lists say before any feedback (docs/drilldown.md)."""
