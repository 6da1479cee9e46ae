"""A local Apache Kafka for the tests and for trying evald without Docker.

The broker comes from Maven Central (fetched once into a cache by :func:`ensure_libs`) and runs
as a plain JVM with its own PID: :class:`LocalKafka` formats a KRaft data directory, starts the
broker on loopback ports, waits until an admin client answers and stops it by PID.
"""

from deploy.local_kafka.broker import LocalKafka, LocalKafkaError
from deploy.local_kafka.fetch import KAFKA_VERSION, ensure_libs

__all__ = ["KAFKA_VERSION", "LocalKafka", "LocalKafkaError", "ensure_libs"]
