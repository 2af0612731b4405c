"""Instructions per call of pieces of a Python program, counted by valgrind's callgrind.

CPU time moves with whatever else the machine runs (two cores shared by several jobs make a 10 % change
invisible); the number of instructions a call executes does not. `instruction_counts` runs a script
again under callgrind, with instrumentation off until the script's setup is done; the script, finding
itself under callgrind (`active()`), measures each piece with `count` and the parent reads the dumps.
Needs valgrind and a C compiler (for the few lines that issue callgrind's client requests).

    if callgrind.active():
        callgrind.start()
        callgrind.count("json", lambda i: json.loads(bodies[i]), len(bodies))
    else:
        per_call = callgrind.instruction_counts([__file__, "--my-options"])
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV = "CALLGRIND_CLIENT_LIBRARY"
_CLIENT = r"""
#include <valgrind/callgrind.h>
void start(void) { CALLGRIND_START_INSTRUMENTATION; }
void zero(void) { CALLGRIND_ZERO_STATS; }
void toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
void dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
"""
_library: Any = None


def active() -> bool:
    return bool(os.environ.get(ENV))


def _client() -> Any:
    global _library
    if _library is None:
        _library = ctypes.CDLL(os.environ[ENV])
        _library.dump.argtypes = [ctypes.c_char_p]
    return _library


def start() -> None:
    """Instrument from here on (the setup before ran at valgrind's uninstrumented speed)."""
    _client().start()


def count(name: str, call: Callable[[int], Any], items: int, rounds: int = 2) -> None:
    """Count `call(i)` for every i in range(items), `rounds` times, after one warm-up round."""
    client = _client()
    for i in range(items):
        call(i)
    client.zero()
    client.toggle()
    for _ in range(rounds):
        for i in range(items):
            call(i)
    client.toggle()
    client.dump(f"{name}\t{items * rounds}".encode())


def instruction_counts(argv: list[str], timeout: float = 3600) -> dict[str, float]:
    """Run `python argv...` under callgrind; instructions per call of each piece it counted, by name."""
    if shutil.which("valgrind") is None:
        raise SystemExit("instruction counts need valgrind (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as work:
        source, library = Path(work, "client.c"), Path(work, "client.so")
        source.write_text(_CLIENT)
        built = subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(library), str(source)],
                               capture_output=True, text=True)
        if built.returncode:
            raise SystemExit(f"cannot build the callgrind client (needs cc and valgrind's headers):\n{built.stderr}")
        out = Path(work, "callgrind.out")
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
             f"--callgrind-out-file={out}", sys.executable, *argv],
            env={**os.environ, ENV: str(library)}, capture_output=True, text=True, timeout=timeout)
        if run.returncode:
            raise SystemExit(f"the run under callgrind failed:\n{run.stderr[-3000:]}")
        counts: dict[str, float] = {}  # in the order counted (the dumps are numbered out.1, out.2, ...)
        dumps = sorted(Path(work).glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:] or 0))
        for dump in dumps:
            text = dump.read_text(errors="replace")
            trigger = re.search(r"^desc: Trigger: Client Request: (.*)\t(\d+)$", text, re.M)
            total = re.search(r"^(?:totals|summary): (\d+)", text, re.M)
            if trigger and total:
                counts[trigger.group(1)] = int(total.group(1)) / int(trigger.group(2))
        return counts
