"""evald: online evaluation of search and recommendation quality."""

__version__ = "0.1.0"
