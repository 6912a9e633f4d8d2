"""The node: owns events partitions through a consumer group, opens, steps and hands them over."""

from evsched.runtime.node.main import serve_node
from evsched.runtime.node.node import Node, NodeConfig

__all__ = ["Node", "NodeConfig", "serve_node"]
