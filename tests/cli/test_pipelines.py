"""Real processes: the installed console scripts in shell pipelines, signals, a terminal on stdout."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import threading
import tty
from pathlib import Path

import pytest
from tarhelpers import wait_for

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses Linux pipes, ptys and /proc")

TIMEOUT = 30


def alive(pid: int) -> bool:
    """True while a process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def waits_on_a_pipe(pid: int) -> bool:
    """The process is asleep in a read of a pipe (its main thread, as the kernel says)."""
    try:
        return "pipe_read" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


def env():
    e = dict(os.environ)
    e.pop("SOURCE_DATE_EPOCH", None)
    e["LC_ALL"] = "C.UTF-8"
    return e


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """An 8 MB tar: 80 samples of 100 kB."""
    from tarproc import TarWriter

    d = tmp_path_factory.mktemp("big")
    path = d / "big.tar"
    with open(path, "wb") as f, TarWriter(f) as w:
        for i in range(80):
            w.write_sample({"__key__": f"k{i:04d}", "bin": bytes([i]) * 100_000, "cls": str(i).encode()})
    return path


@pytest.fixture
def procs():
    """Processes started by a test; killed (by their own id) if still running at the end."""
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=TIMEOUT)


# ----------------------------------------------------------------------------------------------
# broken pipe


def _tarcat_into_closed_reader(scripts, big, procs):
    p = subprocess.Popen([scripts.tarcat, str(big)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    procs.append(p)
    head = p.stdout.read(100)
    p.stdout.close()
    _, err = p.communicate(timeout=TIMEOUT)
    assert len(head) == 100 and head.startswith(b"k0000.bin")
    return p.returncode, err


def test_reader_going_away_is_quiet(scripts, big, procs):
    status, err = _tarcat_into_closed_reader(scripts, big, procs)
    assert err == b""  # no traceback, no "Broken pipe", no "Exception ignored"
    assert status != 0


def test_reader_going_away_exits_141(scripts, big, procs):
    status, err = _tarcat_into_closed_reader(scripts, big, procs)
    assert status == 141


def _head_pipeline(scripts, big):
    cmd = f"set -o pipefail; '{scripts.tarcat}' '{big}' | head -c 100 | wc -c"
    return subprocess.run(["bash", "-c", cmd], capture_output=True, env=env(), timeout=TIMEOUT)


def test_head_in_a_shell_pipeline(scripts, big):
    r = _head_pipeline(scripts, big)
    assert r.stdout.strip() == b"100"
    assert r.stderr == b""  # nothing from tarcat: no traceback, no "Broken pipe"


def test_head_in_a_shell_pipeline_status(scripts, big):
    assert _head_pipeline(scripts, big).returncode == 141


def test_tarsplit_stdout_manifest_reader_going_away(scripts, big, tmp_path):
    # the manifest goes to stdout, read by 'true', which has exited long before
    cmd = f"'{scripts.tarsplit}' -n 10 --manifest - -o '{tmp_path}/s' '{big}' | true"
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, env=env(), timeout=TIMEOUT)
    assert r.stderr == b""
    assert len([n for n in os.listdir(tmp_path) if n.startswith("s-")]) == 8


def test_early_stop_kills_the_pipe_source(scripts, big, tmp_path):
    pidfile = tmp_path / "pid"
    # 600 s: past the run's timeout, were the sleep waited for
    source = f"pipe:echo $$ > '{pidfile}'; cat '{big}'; exec sleep 600"
    r = subprocess.run([scripts.tarcat, "-c", "2", source], capture_output=True, env=env(), timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stderr == b""
    assert r.stdout.count(b"k0001.bin") == 1 and b"k0002" not in r.stdout
    assert wait_for(lambda: not alive(int(pidfile.read_text())), what="the pipe's command ending")


# ----------------------------------------------------------------------------------------------
# Ctrl-C and SIGTERM: exit 130 / 143, nothing partial left


def _partial_tar(big: Path) -> bytes:
    """All members of big.tar but without its end blocks, so a reader waits for more."""
    from tarproc.tar import tar_end_size

    data = big.read_bytes()
    body = len(data) - 2 * 512
    while data[body - 512 : body] == bytes(512):
        body -= 512
    assert tar_end_size(body) == len(data) - body
    return data[:body]


def _check_interrupted_split(out: Path, per_shard: int, min_shards: int = 1):
    names = sorted(os.listdir(out))
    assert [n for n in names if ".tmp-" in n] == []
    from tarproc import read_samples

    keys = []
    for n in names:
        shard_keys = [s["__key__"] for s in read_samples(str(out / n))]
        assert len(shard_keys) == per_shard, (n, shard_keys)  # finished shards only, each complete
        keys += shard_keys
    assert keys == [f"k{i:04d}" for i in range(len(keys))]
    assert len(names) >= min_shards


@pytest.mark.parametrize("sig, status, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_signal_to_tarsplit_reading_a_slow_pipe(scripts, big, tmp_path, procs, sig, status, word):
    partial = tmp_path / "partial.tar"
    partial.write_bytes(_partial_tar(big))
    pidfile = tmp_path / "pid"
    out = tmp_path / "out"
    out.mkdir()
    source = f"pipe:echo $$ > '{pidfile}'; cat '{partial}'; exec sleep 60"
    p = subprocess.Popen([scripts.tarsplit, "-n", "7", "-o", str(out / "s"), source],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    procs.append(p)
    # wait until a shard is finished and the next one is being written
    assert wait_for(lambda: any(".tmp-" in n for n in os.listdir(out)) and any(n.endswith(".tar") and ".tmp-" not in n
                                                                           for n in os.listdir(out)))
    wait_for(lambda: waits_on_a_pipe(p.pid), what="the command waiting on its input")  # the scenario
    p.send_signal(sig)
    _, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == status, err
    assert err.decode().strip() == f"tarsplit: {word}"
    _check_interrupted_split(out, 7)
    # the pipe's command was stopped too
    assert wait_for(lambda: not alive(int(pidfile.read_text())), what="the pipe's command ending")


def test_sigint_before_the_pipe_source_wrote_anything(scripts, tmp_path, procs):
    pidfile = tmp_path / "pid"
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.Popen([scripts.tarsplit, "-n", "2", "-o", str(out / "s"), f"pipe:echo $$ > '{pidfile}'; exec sleep 60"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env())
    procs.append(p)
    assert wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
    child = int(pidfile.read_text())
    try:
        wait_for(lambda: waits_on_a_pipe(p.pid), what="the command waiting on its input")  # the scenario
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=TIMEOUT) == 130
        assert os.listdir(out) == []
        assert wait_for(lambda: not alive(child), what="the pipe: command ending")
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_sigint_to_tarsplit_reading_stdin_that_never_ends(scripts, big, tmp_path, procs):
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.Popen([scripts.tarsplit, "-n", "5", "-o", str(out / "s")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    procs.append(p)
    data = _partial_tar(big)
    writer = threading.Thread(target=lambda: _write_quietly(p.stdin, data), daemon=True)
    writer.start()
    assert wait_for(lambda: any(".tmp-" in n for n in os.listdir(out)) and len(os.listdir(out)) >= 2)
    wait_for(lambda: waits_on_a_pipe(p.pid), what="the command waiting on its input")  # the scenario
    p.send_signal(signal.SIGINT)  # stdin stays open: tarsplit is blocked reading it
    err = p.stderr.read()
    p.wait(timeout=TIMEOUT)
    assert p.returncode == 130, err
    assert err.decode().strip() == "tarsplit: interrupted"
    _check_interrupted_split(out, 5)
    p.stdin.close()


def _write_quietly(stream, data):
    try:
        stream.write(data)
        stream.flush()
    except (BrokenPipeError, ValueError, OSError):
        pass


def test_sigint_to_tarcat_writing_a_file(scripts, big, tmp_path, procs):
    partial = tmp_path / "partial.tar"
    partial.write_bytes(_partial_tar(big))
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.Popen([scripts.tarcat, "-o", str(out / "all.tar"), f"pipe:cat '{partial}'; exec sleep 60"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    procs.append(p)
    assert wait_for(lambda: any(n.startswith(".all.tar.tmp-") for n in os.listdir(out)))
    wait_for(lambda: waits_on_a_pipe(p.pid), what="the command waiting on its input")  # the scenario
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == 130, err
    assert err.decode().strip() == "tarcat: interrupted"
    assert os.listdir(out) == []


# ----------------------------------------------------------------------------------------------
# a terminal on stdout


def _drain(master: int, chunks: list[bytes]) -> threading.Thread:
    """A thread reading a pty's master side into ``chunks`` until the slave side closes."""

    def drain():
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO once the slave side is closed everywhere
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    return reader


def _run_on_pty(argv, raw=False):
    master, slave = pty.openpty()
    if raw:
        tty.setraw(slave)  # no newline translation: the bytes arrive as written
    chunks: list[bytes] = []
    reader = _drain(master, chunks)
    try:
        p = subprocess.Popen(argv, stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env())
        os.close(slave)
        _, err = p.communicate(timeout=TIMEOUT)
        reader.join(timeout=TIMEOUT)
    finally:
        os.close(master)
    return p.returncode, b"".join(chunks), err


def test_refuses_to_write_to_a_terminal(scripts, big, tmp_path):
    status, written, err = _run_on_pty([scripts.tarcat, str(big)])
    assert status == 1
    assert err.decode().strip() == "tarcat: error: stdout: refusing to write a tar stream to a terminal; " \
                                   "redirect it or use --force"
    assert written == b""


def test_force_writes_to_a_terminal(scripts, tmp_path, cli):
    shard = cli.write_tar(tmp_path / "s.tar", [cli.make_sample("a", 1), cli.make_sample("b", 2)])
    status, written, err = _run_on_pty([scripts.tarcat, "--force", str(shard)], raw=True)
    assert status == 0, err
    assert written == shard.read_bytes()


def test_tarsplit_does_not_need_stdout(scripts, tmp_path, cli):
    shard = cli.write_tar(tmp_path / "s.tar", [cli.make_sample("a", 1), cli.make_sample("b", 2)])
    status, written, err = _run_on_pty([scripts.tarsplit, "-n", "1", "-o", str(tmp_path / "x"), str(shard)])
    assert status == 0, err
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("x-")) == ["x-000000.tar", "x-000001.tar"]


# ----------------------------------------------------------------------------------------------
# GNU tar round trips


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    files = {}
    for d in ["train/part.a", "train/part.b", "val"]:
        for i in range(3):
            for ext, body in [("jpg", os.urandom(1000 + i)), ("cls", str(i).encode()), ("meta.json", b"{}")]:
                rel = f"{d}/img{i:03d}.{ext}"
                files[rel] = body
    for rel, body in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(body)
    return src, files


def test_gnu_tar_to_tarcat_to_gnu_tar(scripts, tree, tmp_path):
    if scripts.tar is None:
        pytest.skip("GNU tar is not installed")
    src, files = tree
    cmd = f"set -o pipefail; tar -cf - --sort=name -C '{src}' . | '{scripts.tarcat}' | tar -tf -"
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, env=env(), timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stderr == b""
    assert r.stdout.decode().splitlines() == sorted(files)  # the "./" of tar -C dir . is not part of a key

    dest = tmp_path / "dest"
    dest.mkdir()
    cmd = (f"set -o pipefail; tar -cf - --sort=name -C '{src}' . | '{scripts.tarcat}' --rekey 'x/%03d' "
           f"| '{scripts.tarsplit}' -n 4 -o '{tmp_path}/sh' && '{scripts.tarcat}' '{tmp_path}/sh-{{000000..000002}}.tar' "
           f"| tar -xf - -C '{dest}'")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, env=env(), timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    got = {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    # 9 samples renumbered; fields kept in order
    samples: dict[str, dict[str, bytes]] = {}
    for rel, body in files.items():
        directory, base = rel.rsplit("/", 1)
        stem, field = base.split(".", 1)  # key rule: up to the first dot of the basename
        samples.setdefault(f"{directory}/{stem}", {})[field] = body
    want = {}
    for n, key in enumerate(sorted(samples)):  # the order of tar --sort=name
        for field, body in samples[key].items():
            want[f"x/{n:03d}.{field}"] = body
    assert got == want


def test_bin_shims_run_from_the_checkout(cli, tmp_path):
    shard = cli.write_tar(tmp_path / "s.tar", [cli.make_sample("a", 1)])
    for name in ["tarcat", "tarsplit"]:
        r = subprocess.run([str(cli.repo / "bin" / name), "--version"], capture_output=True, env=env(), timeout=TIMEOUT)
        assert r.returncode == 0 and r.stdout.decode().startswith(f"{name} (tarproc) ")
    r = subprocess.run([str(cli.repo / "bin" / "tarcat"), str(shard)], capture_output=True, env=env(), timeout=TIMEOUT)
    assert r.returncode == 0 and r.stdout == shard.read_bytes()


def test_run_module_rejects_unknown_command():
    r = subprocess.run([sys.executable, "-m", "tarproc.cli.run", "tarfoo"], capture_output=True, env=env(),
                       timeout=TIMEOUT)
    assert r.returncode == 2
    assert b"tarcat" in r.stderr


def test_progress_bar_has_a_total_where_the_shards_can_be_counted(scripts, big, tmp_path):
    """With stderr on a terminal, the bar learns the total from the local shard (walked or its
    index) in a thread, so it shows N/TOTAL and an ETA; a pipe's input has no total."""
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a bar needs a width
    chunks: list[bytes] = []
    reader = _drain(master, chunks)
    try:
        p = subprocess.Popen([scripts.tarcat, str(big), str(big), "--rekey", "r%04d", "-c", "150"],
                             stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=env())
        os.close(slave)
        # the pipe is full and tarcat waits on it: the total is found meanwhile
        wait_for(lambda: b"/150" in b"".join(chunks), what="the bar showing the total")
        out, _ = p.communicate(timeout=TIMEOUT)
        reader.join(timeout=TIMEOUT)
    finally:
        os.close(master)
    assert p.returncode == 0 and len(out) > 8_000_000
    bar = b"".join(chunks).decode(errors="replace")
    assert "150/150" in bar, bar[-300:]
