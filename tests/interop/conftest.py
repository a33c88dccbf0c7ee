"""Fixtures for the interoperability tests: GNU tar, Python's tarfile, webdataset, and real
servers on 127.0.0.1 (an HTTP server and an S3-compatible moto server), started here and stopped
in teardown. Nothing else is contacted.

Test modules can't import each other (``--import-mode=importlib``): helpers are handed out through
the ``ix`` fixture.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tarhelpers import free_port, run, samples, tar_bytes, tarfile_members, write_tar

from tarproc.cli.tarcat import main as tarcat_main
from tarproc.cli.tarsplit import main as tarsplit_main

VENV_BIN = Path(sys.executable).parent
# what torchrun runs (it imports torch at the top), not a test module
collect_ignore = ["torchrun_job.py"]


@pytest.fixture(autouse=True)
def _isolated_state(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    old_term = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, old_term)


# -------------------------------------------------------------------------------------------
# helpers


def samples_of_bytes(data: bytes, tmp: Path) -> list[tuple[str, dict[str, bytes]]]:
    path = tmp / f"bytes-{len(os.listdir(tmp))}.tar"
    path.write_bytes(data)
    return samples(path)


def wds_samples(url: str) -> list[tuple[str, dict[str, bytes]]]:
    """What webdataset 1.0.2 reads: ``WebDataset(url, shardshuffle=False)``."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import webdataset

        ds = webdataset.WebDataset(url, shardshuffle=False)
        return [(s["__key__"], {k: bytes(v) for k, v in s.items() if not k.startswith("__")}) for s in ds]


def key_rule(name: str) -> tuple[str, str] | None:
    """The WebDataset key rule, written independently of tarproc: key = directory + basename up to
    its first dot, without the leading "./" of 'tar -C dir .'; field = the rest, lower-cased; no
    key without a dot or for a leading dot."""
    directory, slash, base = name.rpartition("/")
    if "." not in base or base.startswith("."):
        return None
    stem, _, field = base.partition(".")
    key = directory + slash + stem
    while key.startswith("./"):
        key = key[2:]
    return key, field.lower()


def group(members: Iterable[tuple[str, bytes]]) -> list[tuple[str, dict[str, bytes]]]:
    """Group ``(name, data)`` in order into samples by ``key_rule`` (adjacent keys only)."""
    out: list[tuple[str, dict[str, bytes]]] = []
    for name, data in members:
        split = key_rule(name)
        if split is None:
            continue
        key, field = split
        if out and out[-1][0] == key:
            out[-1][1][field] = data
        else:
            out.append((key, {field: data}))
    return out


def gnu_tar(*args: Any, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    tar = shutil.which("tar")
    if tar is None:
        pytest.skip("GNU tar is not installed")
    env = dict(os.environ, LC_ALL="C.UTF-8")
    proc = subprocess.run([tar, *map(str, args)], capture_output=True, env=env, timeout=60, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"tar {args} failed: {proc.stderr.decode(errors='replace')}")
    return proc


def make_sample(key: str, i: int, size: int = 300) -> dict[str, Any]:
    body = (f"{key}:".encode() + bytes(range(256)) * (size // 256 + 1))[:size]
    return {"__key__": key, "jpg": body, "cls": str(i).encode(), "json": b'{"i": %d}' % i}


@pytest.fixture(scope="session")
def ix() -> SimpleNamespace:
    return SimpleNamespace(
        run=run,
        tar_bytes=tar_bytes,
        write_tar=write_tar,
        samples=samples,
        samples_of_bytes=samples_of_bytes,
        wds_samples=wds_samples,
        tarfile_members=tarfile_members,
        key_rule=key_rule,
        group=group,
        gnu_tar=gnu_tar,
        make_sample=make_sample,
        free_port=free_port,
        tarcat=tarcat_main,
        tarsplit=tarsplit_main,
        scripts=SimpleNamespace(tarcat=str(VENV_BIN / "tarcat"), tarsplit=str(VENV_BIN / "tarsplit")),
    )


@pytest.fixture
def shards(tmp_path: Path) -> SimpleNamespace:
    """Three shards of four samples each in tmp_path/shards."""
    d = tmp_path / "shards"
    d.mkdir()
    expected = []
    paths = []
    for s in range(3):
        batch = [make_sample(f"s{s}/{4 * s + i:04d}", 4 * s + i, size=500 + 301 * (4 * s + i)) for i in range(4)]
        paths.append(str(write_tar(d / f"shard-{s}.tar", batch)))
        expected += [(x["__key__"], {k: v for k, v in x.items() if k != "__key__"}) for x in batch]
    return SimpleNamespace(dir=d, paths=paths, expected=expected)


# -------------------------------------------------------------------------------------------
# an HTTP server on 127.0.0.1: the http_server fixture of tests/conftest.py


# -------------------------------------------------------------------------------------------
# an S3-compatible server (moto) on 127.0.0.1

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # never look for credentials elsewhere
}


@pytest.fixture(scope="module")
def moto_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    try:
        import boto3  # noqa: F401
        import s3fs  # noqa: F401
        from moto.server import ThreadedMotoServer
    except ImportError as e:
        pytest.skip(f"moto server / boto3 / s3fs not importable: {e}")
    try:
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
    except Exception as e:  # pragma: no cover - depends on the machine
        pytest.skip(f"moto server could not start on 127.0.0.1: {type(e).__name__}: {e}")
    endpoint = f"http://{host}:{port}"
    config = tmp_path_factory.mktemp("aws")
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}  # talk to 127.0.0.1 directly
    env.pop("SOURCE_DATE_EPOCH", None)
    env.update(S3_ENV)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["AWS_CONFIG_FILE"] = str(config / "config")
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(config / "credentials")
    env["FSSPEC_S3_ENDPOINT_URL"] = endpoint  # fsspec config from the environment -> s3fs endpoint_url
    try:
        with pytest.MonkeyPatch.context() as mp:  # the in-process boto3 client, too
            for name in ("NO_PROXY", "no_proxy"):
                mp.setenv(name, "127.0.0.1,localhost")
            yield SimpleNamespace(endpoint=endpoint, env=env)
    finally:
        server.stop()


@pytest.fixture
def s3(moto_server, request):  # type: ignore[no-untyped-def]
    """A fresh bucket on the moto server, and a boto3 client for it."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=moto_server.endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    bucket = "b-" + "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:50].strip("-")
    client.create_bucket(Bucket=bucket)

    def keys(prefix: str = "") -> list[str]:
        listing = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for o in listing.get("Contents", []))

    def get(key: str) -> bytes:
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()

    return SimpleNamespace(client=client, bucket=bucket, keys=keys, get=get, env=moto_server.env,
                           endpoint=moto_server.endpoint)


# -------------------------------------------------------------------------------------------
# a single-node Slurm cluster on 127.0.0.1: munged, slurmctld and slurmd (Debian's slurm-wlm)

SLURM_PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
SLURM_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
SLURM_NODE = "tarjobnode"


def _slurm_unavailable() -> str | None:
    """Why a Slurm cluster can't be started here, or None."""
    missing = [p for p in SLURM_PROGRAMS if shutil.which(p, path=SLURM_PATH) is None]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} not found): as root, make test installs "
                "slurmctld, slurmd, slurm-client and munge with apt-get")
    if os.geteuid() != 0:
        return "the Slurm daemons of the test cluster run as root (and munged as the munge user): not root"
    try:
        import pwd

        pwd.getpwnam("munge")
    except KeyError:
        return "no 'munge' user (the munge package creates it)"
    return None


def _die_with_pytest() -> Any:
    """What a daemon's child runs before exec: the daemon ends with the test run, even one killed
    hard (no teardown). (prctl is looked up here: nothing is imported between fork and exec.)"""
    import ctypes

    try:
        prctl = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:  # pragma: no cover - runs in the child
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return arm


class SlurmCluster:
    """munged (as the munge user), slurmctld and slurmd (as root) in the foreground, with their
    key, socket, configuration, state and logs under ``root`` and ``munge_dir``; clients find the
    configuration through ``SLURM_CONF`` in ``env``. Every address is 127.0.0.1."""

    def __init__(self, root: Path, munge_dir: Path) -> None:
        self.root = root
        self.munge_dir = munge_dir
        self.conf = root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf),
                        PATH=os.pathsep.join([str(VENV_BIN), SLURM_PATH]))  # tarjob on PATH in the jobs
        self.env.pop("SOURCE_DATE_EPOCH", None)
        self.daemons: list[tuple[str, subprocess.Popen[bytes]]] = []

    # -- starting and stopping ---------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        import pwd
        import time

        munge = pwd.getpwnam("munge")
        os.chown(self.munge_dir, munge.pw_uid, munge.pw_gid)
        self.munge_dir.chmod(0o755)  # munged wants its socket's directory searchable by all
        key = self.munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        os.chown(key, munge.pw_uid, munge.pw_gid)
        socket_path = self.munge_dir / "munge.socket"
        self._spawn("munged", ["munged", "-F", f"--socket={socket_path}", f"--key-file={key}",
                               f"--log-file={self.munge_dir}/munged.log", f"--pid-file={self.munge_dir}/munged.pid",
                               f"--seed-file={self.munge_dir}/munged.seed", "--num-threads=2", "--origin=127.0.0.1"],
                    user="munge")
        deadline = time.monotonic() + timeout
        while not socket_path.exists():
            self._check_alive(deadline, "munged did not open its socket")
            time.sleep(0.05)
        for d in ("state", "spool"):
            (self.root / d).mkdir()
        self.conf.write_text(SLURM_CONF.format(
            node=SLURM_NODE, root=self.root, socket=socket_path,
            ctld_port=free_port(), slurmd_port=free_port(),
        ))
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-N", SLURM_NODE, "-f", str(self.conf)])
        while self.node_state() != "idle":
            self._check_alive(deadline, "the node did not come up idle")
            time.sleep(0.1)

    def _spawn(self, name: str, argv: list[str], user: str | None = None) -> None:
        log = open(self.root / f"{name}.out", "wb")  # noqa: SIM115
        with log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=self.env, start_new_session=True, user=user, group=user,
                                    preexec_fn=_die_with_pytest())
        self.daemons.append((name, proc))

    def _check_alive(self, deadline: float, what: str) -> None:
        import time

        for name, proc in self.daemons:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with status {proc.returncode}: {self.log_tail(name)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} in time: {self.log_tail()}")

    def log_tail(self, name: str | None = None, lines: int = 8) -> str:
        """The last lines of the daemons' logs (for a message)."""
        out = []
        for log in sorted([*self.root.glob("*.log"), *self.root.glob("*.out"), *self.munge_dir.glob("*.log")]):
            if name is None or log.name.startswith(name):
                text = log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"[{log.name}] " + " | ".join(text))
        return " ".join(out)

    def stop(self) -> None:
        """Cancel what is left, then stop the daemons (slurmd, slurmctld, munged), in that order."""
        import time

        if any(name == "slurmctld" and proc.poll() is None for name, proc in self.daemons):
            self.client("scancel", "--user", "root", check=False)
            deadline = time.monotonic() + 15
            while self.client("squeue", "-h", check=False).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.2)
        for _, proc in reversed(self.daemons):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.daemons.clear()

    # -- the clients ----------------------------------------------------------------------------

    def client(self, *args: str, check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(args, env=self.env, cwd=cwd, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def node_state(self) -> str:
        return self.client("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()

    def sbatch(self, script: str | Path, cwd: Path) -> str:
        """Submit ``script`` from ``cwd`` (the jobs run there, as root); the job id."""
        return self.client("sbatch", "--parsable", str(script), cwd=cwd).stdout.strip().split(";")[0]

    def tasks(self, job: str) -> dict[str, str]:
        """The array's tasks Slurm still knows (``MinJobAge`` after they end): id -> state."""
        out = self.client("scontrol", "-o", "show", "job", job, check=False).stdout
        tasks = {}
        for line in out.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            tasks[fields.get("ArrayTaskId", "")] = fields.get("JobState", "") + " " + fields.get("ExitCode", "")
        return tasks

    def running(self, job: str) -> list[str]:
        """The array's tasks running now (ids)."""
        out = self.client("squeue", "-h", "-r", "-j", job, "-t", "RUNNING", "-o", "%K", check=False).stdout
        return out.split()

    def wait(self, job: str, timeout: float = 120.0) -> float:
        """Wait until no task of ``job`` is pending or running; the seconds it took."""
        import time

        t0 = time.monotonic()
        while self.client("squeue", "-h", "-j", job, check=False).stdout.strip():
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"job {job} still queued after {timeout:g} s: {self.log_tail()}")
            time.sleep(0.2)
        return time.monotonic() - t0


# Known to work with Slurm 22.05 (Debian 12): the controller and the node on 127.0.0.1 (no name
# looked up), no cgroups, no accounting, the CPUs allocated one by one (two tasks at once on the 2
# CPUs), the scheduler run every second
SLURM_CONF = """\
ClusterName=tarjobtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={socket}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1,batch_sched_delay=0
ReturnToService=2
KillWait=5
MinJobAge=600
MailProg=/bin/true
NodeName={node} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A single-node Slurm cluster on 127.0.0.1 for the module's tests; skipped (with the reason)
    where Slurm is not installed or its daemons can't start."""
    import tempfile

    reason = _slurm_unavailable()
    if reason:
        pytest.skip(reason)
    # munged runs as the munge user: its directory can't be under pytest's (root only) base
    munge_dir = Path(tempfile.mkdtemp(prefix="tarjob-munge-"))
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), munge_dir)
    try:
        try:
            cluster.start()
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            pytest.skip(f"the Slurm test cluster did not start: {e}")
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(munge_dir, ignore_errors=True)
