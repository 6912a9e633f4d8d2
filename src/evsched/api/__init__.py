"""The HTTP API (``evsched api``): FastAPI over a read replica, writing through the client."""

from evsched.api.app import create_app

__all__ = ["create_app"]
