"""The log folded into indexes: the projector, restores, the state changelog, audits' refolds."""

from evsched.runtime.projection.changelog import ChangelogWriter
from evsched.runtime.projection.projector import Projector
from evsched.runtime.projection.restore import Rebuilt, Restorer, rebuild_index
from evsched.runtime.projection.waiting import WaitingForWorker

__all__ = [
    "ChangelogWriter",
    "Projector",
    "Rebuilt",
    "Restorer",
    "WaitingForWorker",
    "rebuild_index",
]
