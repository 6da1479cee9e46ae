"""`evald run`, `evald check-config`, `evald produce`: the Kafka consumer-group daemon."""
