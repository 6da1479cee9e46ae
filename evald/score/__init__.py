"""`evald score`: score ranked lists offline from JSON Lines or TREC run/qrels files.

The package keeps parsing (``jsonl``, ``trec``), scoring (``scoring``) and writing (``output``)
apart so each can be tested on its own; ``command`` wires them to the command line.
"""
