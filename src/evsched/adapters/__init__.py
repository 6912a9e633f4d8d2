"""Thin translators between the core and the outside world: Avro, Kafka, RocksDB, HTTP."""
