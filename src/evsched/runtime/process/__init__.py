"""What each long-running process needs: its allocator, collector, broker wait and offloading."""

from evsched.runtime.process.allocator import tune_allocator
from evsched.runtime.process.gc_policy import tune_collector
from evsched.runtime.process.offload import Offload
from evsched.runtime.process.startup import until_broker

__all__ = ["Offload", "tune_allocator", "tune_collector", "until_broker"]
