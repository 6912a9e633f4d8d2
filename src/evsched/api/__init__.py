"""The HTTP API (``evsched api``): FastAPI over a read replica, writing through the client."""

from evsched.api.app import create_app
from evsched.api.command import api_command

__all__ = ["api_command", "create_app"]
