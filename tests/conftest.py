"""Settings for the whole suite."""

from hypothesis import settings

# Hypothesis fails an example that runs longer than its deadline (200 ms by default): a timed
# assertion, which one stall of a shared CI machine can trip. Speed is measured in benchmarks/.
settings.register_profile("evald", deadline=None)
settings.load_profile("evald")
