"""What decoding a hostile header may cost: a little memory and time, then a MessageError.

A msgpack header can cost far more than its size: a byte makes an empty map (64 bytes of Python
object). Before the limits, a 16 MB header of empty maps cost over 1 GB to decode, and one at the
old 64 MB limit about 4 GB. Each case runs in a fresh process, which measures its own peak memory.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

MEASURE = r"""
import gc, json, os, resource, sys, time
import msgpack
from tarproc.transport.wire import MessageError, decode

cases = {
    # over the size limit: refused before parsing
    "16 MB of empty maps": lambda: msgpack.packb([[{}] * 1_000_000] * 16),
    "63 MB of empty maps in a map": lambda: msgpack.packb({str(i): [{}] * 1_000_000 for i in range(63)}),
    # inside the size limit: what each byte may cost at most
    "4 MB of ints -20 (a new int object each)": lambda: msgpack.packb([[-20] * 1_000_000] * 4),
    "4 MB of 2-character strings": lambda: msgpack.packb([["ab"] * 1_000_000, ["cd"] * 390_000]),
    "4 MB of empty maps": lambda: msgpack.packb([[{}] * 1_000_000] * 4),
    "4 MB of empty lists": lambda: msgpack.packb([[[]] * 1_000_000] * 4),
    "a map of 64 lists of 60000 empty maps": lambda: msgpack.packb({str(i): [{}] * 60_000 for i in range(64)}),
}
results = {}
for name, make in cases.items():
    head = make()
    gc.collect()
    read, write = os.pipe()
    if os.fork() == 0:  # a child measures its own peak, from where it starts
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        try:
            decode([head], "tcp://test")
            outcome = "decoded"
        except MessageError as e:
            outcome = e.reason
        seconds = time.perf_counter() - started
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
        os.write(write, json.dumps({"size": len(head), "MB": grown, "seconds": seconds, "outcome": outcome}).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        results[name] = json.loads(f.read())
    os.wait()
print(json.dumps(results))
"""

EXPECTED = {
    "16 MB of empty maps": "is over the limit of 4194304",
    "63 MB of empty maps in a map": "is over the limit of 4194304",
    "4 MB of ints -20 (a new int object each)": "header is not a map",
    "4 MB of 2-character strings": "header is not a map",
    "4 MB of empty maps": "over 262144 lists and maps",
    "4 MB of empty lists": "over 262144 lists and maps",
    "a map of 64 lists of 60000 empty maps": "over 262144 lists and maps",
}


@pytest.mark.skipif(sys.platform != "linux", reason="measures with fork and ru_maxrss in kB")
def test_a_hostile_header_costs_little() -> None:
    result = subprocess.run([sys.executable, "-c", MEASURE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout)
    for name, outcome in EXPECTED.items():
        # the worst case is about 36 bytes of Python objects for each byte of header: 150 MB at 4 MiB
        assert outcome in measured[name]["outcome"] and measured[name]["MB"] < 200, (name, measured[name])
        assert measured[name]["seconds"] < 2, (name, measured[name])
