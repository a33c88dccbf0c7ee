"""tarpcat's measures: ``tarpcat -p 4`` against ``tarcat`` over the same 8 shards, local and over a
slow HTTP server (started here on 127.0.0.1: a fixed latency per request and a bandwidth cap per
connection, as object stores and CDNs have).

Rows: 8 local shards (target ≥ 1×: the threads must cost nothing), the same shards over the slow
server (target ≥ 3×: four connections at once).
"""

from __future__ import annotations

import http.server
import itertools
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from common import Context, Row, alternate, log, spread, warm, yes_no

SECTION = "pcat"
SHARDS = 8
LATENCY = 0.05  # seconds before each response
RATE = 20e6  # bytes per second per connection
PIECE = 64 << 10


def make_shards(ctx: Context, source: Path, count: int, name: str) -> list[Path]:
    """``source`` (``count`` samples) split into 8 shards of consecutive samples, cached under
    ctx.directory/pcat."""
    import tarproc

    directory = ctx.directory / "pcat"
    directory.mkdir(exist_ok=True)
    paths = [directory / f"{name}-{i}.tar" for i in range(SHARDS)]
    manifest = directory / f"{name}.json"
    want = {"source": source.name, "size": source.stat().st_size, "shards": SHARDS}
    try:
        if json.loads(manifest.read_text()) == want and all(p.exists() for p in paths):
            return paths
    except (OSError, ValueError):
        pass
    per = -(-count // SHARDS)
    samples = tarproc.read_samples(str(source))
    for path in paths:
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f, tarproc.TarWriter(f) as w:
            for sample in itertools.islice(samples, per):
                w.write_sample(sample)
        tmp.replace(path)
    manifest.write_text(json.dumps(want) + "\n")
    log(f"  made {SHARDS} shards of {per} samples of {source.name} in {directory}")
    return paths


class SlowHandler(http.server.SimpleHTTPRequestHandler):
    """Files of the server's directory, after LATENCY, at RATE bytes/s per connection."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        time.sleep(LATENCY)
        path = Path(self.directory) / self.path.lstrip("/")
        try:
            data = path.read_bytes()
        except OSError:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-tar")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        start = time.perf_counter()
        view = memoryview(data)
        try:
            for pos in range(0, len(data), PIECE):
                self.wfile.write(view[pos : pos + PIECE])
                ahead = (pos + PIECE) / RATE - (time.perf_counter() - start)
                if ahead > 0:
                    time.sleep(ahead)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_HEAD(self) -> None:  # noqa: N802
        time.sleep(LATENCY)
        super().do_HEAD()


def start_server(directory: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    def handler(*args: Any, **kw: Any) -> SlowHandler:
        return SlowHandler(*args, directory=str(directory), **kw)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def counted(cmd: list[str]) -> int:
    """Run a command writing a tar to /dev/null with --stats; return the samples it wrote."""
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[2]} failed: {proc.stderr.strip()}")
    match = re.search(r"wrote (\d+) samples", proc.stderr)
    if not match:
        raise RuntimeError(f"no --stats line from {cmd[2]}: {proc.stderr!r}")
    return int(match.group(1))


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    # local: big.tar (~1 GB) in 8 shards, so that start-up (~0.15 s) doesn't decide the ratio;
    # over the slow server: jpeg.tar (~100 MB) in 8 shards, which takes seconds already
    paths = make_shards(ctx, ctx.data.big, ctx.data.big_samples, "big")
    for path in paths:
        warm(path)
    total = sum(p.stat().st_size for p in paths)
    n = ctx.data.big_samples
    pcat = [sys.executable, "-m", "tarproc.cli.tarpcat", "-q", "--stats", "-p", "4"]
    cat = [sys.executable, "-m", "tarproc.cli.tarcat", "-q", "--stats"]
    rows: list[Row] = []
    notes: list[str] = []

    log(f"pcat: tarpcat -p 4 vs tarcat, {SHARDS} local shards ({total / 1e6:.0f} MB)")
    local = [str(p) for p in paths]
    ta, tb = alternate(ctx.reps, ctx.reps, lambda: counted(pcat + local), lambda: counted(cat + local), n, "local")
    a, b = total / 1e6 / statistics.median(ta), total / 1e6 / statistics.median(tb)
    rows.append(Row(f"`tarpcat -p 4` over {SHARDS} local shards ({total / 1e9:.2f} GB of JPEG samples)", a, "MB/s",
                    "`tarcat` of the same", b, "≥ 1×", yes_no(a >= b)))
    notes.append(f"pcat local: tarpcat {spread(ta)}; tarcat {spread(tb)}")

    paths = make_shards(ctx, ctx.data.jpeg, ctx.data.jpeg_samples, "jpeg")
    total = sum(p.stat().st_size for p in paths)
    n = ctx.data.jpeg_samples

    server, base = start_server(paths[0].parent)
    try:
        log(f"pcat: the same over a slow HTTP server ({LATENCY * 1000:.0f} ms per request, "
            f"{RATE / 1e6:.0f} MB/s per connection)")
        remote = [f"{base}/{p.name}" for p in paths]
        ta, tb = alternate(ctx.slow_reps, ctx.slow_reps, lambda: counted(pcat + remote), lambda: counted(cat + remote),
                           n, "http")
    finally:
        server.shutdown()
        server.server_close()
    a, b = total / 1e6 / statistics.median(ta), total / 1e6 / statistics.median(tb)
    rows.append(Row(f"`tarpcat -p 4` over {SHARDS} shards on a slow HTTP server ({RATE / 1e6:.0f} MB/s per connection, "
                    f"{LATENCY * 1000:.0f} ms per request)", a, "MB/s", "`tarcat` of the same", b, "≥ 3×",
                    yes_no(a >= 3 * b)))
    notes.append(f"pcat http: tarpcat {spread(ta)}; tarcat {spread(tb)}")
    return rows, notes
