"""The scenario app (``scenario_app``) plus a workflow step an operator can fix (it dies until a
``fixed`` file exists in the folder it is given, so a test can requeue a failed branch) and a
group callback that takes results of any type."""

from __future__ import annotations

from pathlib import Path

from tests.integration.scenario_app import make_app as scenario_app

from evsched.client import App
from evsched.settings import Settings


def make_app(settings: Settings | None = None) -> App:
    app = scenario_app(settings)

    @app.task(name="s.plus_when_fixed", max_attempts=1, permanent_on=(FileNotFoundError,))
    async def plus_when_fixed(marks: str, add: int, previous: int = 0) -> int:
        """``previous`` (the parent's result) plus ``add``, once ``marks/fixed`` exists."""
        if not (Path(marks) / "fixed").exists():
            raise FileNotFoundError(f"{marks}/fixed does not exist yet")
        return previous + add

    @app.task(name="s.count_results")
    async def count_results(results: list[object]) -> int:
        """A group's callback that takes any results: how many there are."""
        return len(results)

    return app


app = make_app()
