"""`evald top`: a live terminal view of any running evald, read from its ``/metrics``."""
