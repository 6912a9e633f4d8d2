"""Enqueue with your database write: a FastAPI + SQLAlchemy service whose order and receipt job
commit together, or not at all (docs/outbox.md).

    pip install 'evsched[outbox]'
    evsched dev --with-postgres        # prints EVSCHED_OUTBOX_DSN=postgresql://...
    EVSCHED_OUTBOX_DSN=postgresql://... uvicorn examples.outbox_fastapi:api --port 8000
    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"email": "ada@example.com", "amount_cents": 1200}'

The receipt job is ``example.send_receipt`` of ``examples.app``, which the dev stack's worker
runs. ``"fail_after_insert": true`` makes the handler fail after both inserts: the transaction
rolls back, and neither the order nor its job exists.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from examples.app import send_receipt
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from evsched.outbox import Outbox, init_table

DSN_ENV = "EVSCHED_OUTBOX_DSN"

ORDERS = """
CREATE TABLE IF NOT EXISTS orders (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  email text NOT NULL,
  amount_cents integer NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
)
"""


class OrderIn(BaseModel):
    email: str = Field(min_length=3, max_length=200)
    amount_cents: int = Field(gt=0)
    fail_after_insert: bool = False


class OrderOut(BaseModel):
    order_id: int
    job_id: str


def sqlalchemy_url(dsn: str) -> str:
    """``postgresql://...`` with SQLAlchemy's psycopg 3 driver named."""
    return dsn.replace("postgresql://", "postgresql+psycopg://", 1)


def create_api(dsn: str) -> FastAPI:
    engine: AsyncEngine = create_async_engine(sqlalchemy_url(dsn))
    outbox = Outbox()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with engine.begin() as conn:  # the app's own migration, and the outbox's
            await conn.execute(text(ORDERS))
            await init_table(conn)
        yield
        await engine.dispose()

    api = FastAPI(title="shop", lifespan=lifespan)

    @api.post("/orders", status_code=201)
    async def place_order(order: OrderIn) -> OrderOut:
        async with AsyncSession(engine) as session, session.begin():
            inserted = await session.execute(
                text("INSERT INTO orders (email, amount_cents) VALUES (:e, :a) RETURNING id"),
                {"e": order.email, "a": order.amount_cents},
            )
            order_id = inserted.scalar_one()
            # In the same transaction: the job exists iff the order does, exactly once.
            entry = await outbox.enqueue(
                session, send_receipt.call(str(order_id), order.email), key=f"receipt-{order_id}"
            )
            if order.fail_after_insert:
                raise HTTPException(500, "failed after the inserts: order and job rolled back")
        return OrderOut(order_id=order_id, job_id=entry.job_id)

    return api


api = create_api(os.environ.get(DSN_ENV, "postgresql://postgres@127.0.0.1:5432/postgres"))
