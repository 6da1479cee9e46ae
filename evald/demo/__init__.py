"""`evald demo`: a simulated search engine feeding the real engine, with a live terminal view.

``simulator`` is a pure, seeded traffic generator (also used by ``evald produce`` and the
benchmarks); ``live`` renders the per-segment summary; ``command`` wires them to the engine and
the ``/metrics`` server.
"""
