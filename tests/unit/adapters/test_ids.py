"""new_id: version 4 UUID text from pooled random bytes; never repeated across draws, threads or a
forked child."""

from __future__ import annotations

import os
import threading
import uuid

from evsched.adapters.ids import new_id


def test_an_id_is_a_version_4_uuid_in_its_canonical_text() -> None:
    for _ in range(600):  # more than one draw of the pool
        minted = new_id()
        parsed = uuid.UUID(minted)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert str(parsed) == minted


def test_ids_do_not_repeat_across_threads() -> None:
    minted: list[list[str]] = [[] for _ in range(4)]

    def mint(into: list[str]) -> None:
        into.extend(new_id() for _ in range(5_000))

    threads = [threading.Thread(target=mint, args=(m,)) for m in minted]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for m in minted for i in m]
    assert len(set(every)) == len(every) == 20_000


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    new_id()  # the parent holds a partly used pool
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, " ".join(new_id() for _ in range(10)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split())
    os.waitpid(pid, 0)
    parent = {new_id() for _ in range(10)}
    assert len(child) == 10
    assert not child & parent
