"""What `evald replay` reads from files: lines within a memory bound, plain or gzip-compressed
(``lines``), records wrapped as OpenSearch / Elasticsearch exports write them (``exports``),
and the records of many files in event-time order in bounded memory (``sort``)."""
