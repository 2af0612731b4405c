"""The JSON line handler in a forked process (gunicorn's workers): the child writes its own lines from a
writer thread of its own, and never the lines its parent had pending."""

from __future__ import annotations

import json
import os
import sys

import pytest

from webhook.server.logs import JsonLineHandler


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="needs fork")
def test_a_forked_child_writes_its_own_lines_with_its_own_writer() -> None:
    read_end, write_end = os.pipe()
    handler = JsonLineHandler(write_end)
    handler.write_entry({"msg": "parent-first"})
    handler.flush()
    handler.write_entry({"msg": "parent-pending"})  # not yet written when the child is forked
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            handler.write_entry({"msg": "child"})
            started = handler._owner == os.getpid()  # the child's own writer thread took over
            handler.flush()
            os._exit(0 if started else 3)
        finally:
            os._exit(4)
    _, status = os.waitpid(child, 0)
    handler.flush()
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        lines = [json.loads(line)["msg"] for line in pipe.read().splitlines()]
    assert os.waitstatus_to_exitcode(status) == 0
    assert sorted(lines) == ["child", "parent-first", "parent-pending"]
    assert handler._owner == os.getpid()  # and the parent's own writer is still its own
