"""The tests' timeouts, scaled to the machine's load: a busy 2-core machine is slow, not broken."""
from __future__ import annotations

import functools
import os
import time

SCALE_ENV = "CINN_TEST_TIMEOUT_SCALE"
MAX_SCALE = 10.0  # a hang must still be found, if later
FOREVER_S = 3600.0  # a simulated hang: past any scaled timeout


@functools.cache
def timeout_scale() -> float:
    """$CINN_TEST_TIMEOUT_SCALE, else measured (conftest measures it once per run and sets it for the workers)."""
    text = os.environ.get(SCALE_ENV, "")
    if not text:
        return measured_scale()
    try:
        scale = float(text)
    except ValueError:
        scale = 0.0
    if not scale > 0:  # also nan
        raise ValueError(f"${SCALE_ENV}={text!r}: expected a positive factor such as 1 or 2.5")
    return scale


def measured_scale(cpu_s: float = 0.3) -> float:
    """How much slower than on an idle machine a process runs now: a busy loop's wall time over its CPU time
    (the cores' share it gets), or the load average per core if higher (a load that the short loop missed)."""
    wall, cpu = time.perf_counter(), time.process_time()
    while time.process_time() - cpu < cpu_s:
        pass
    share = (time.perf_counter() - wall) / (time.process_time() - cpu)
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return min(max(1.0, share, load), MAX_SCALE)


def scaled(seconds: float) -> float:
    """A timeout that suffices on an idle machine, stretched by the load."""
    return seconds * timeout_scale()
