"""Workflows: jobs that wait on parents, their graph, whole-workflow operations, invariant I8."""
