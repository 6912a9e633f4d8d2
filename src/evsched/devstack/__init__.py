"""A local, single-node Kafka broker from Maven Central jars, for development and tests."""
