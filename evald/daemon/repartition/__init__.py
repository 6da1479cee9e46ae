"""The repartition stage (``input.repartition: true``): a second stage before the main one that
copies the inputs, keyed any way, to internal topics keyed by request id, exactly once
(docs/design.md, "Topics keyed any way"). stage.py runs it (sessions, transactions, counters),
interleave.py keeps many source partitions in one timestamp order, rekey.py reads a record's
request id and picks its partition (Kafka's murmur2)."""
