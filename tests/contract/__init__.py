"""Contract suites: one per port, run against the in-memory twin and the real adapter alike."""
