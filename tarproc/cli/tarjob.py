"""tarjob: run the same command for every shard, here (a process pool), on Dask, Kubernetes or Slurm."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator

import click

from ..errors import OptionError, SinkError
from ..jobs.journal import DEFAULT_JOURNAL, Journal
from ..jobs.manifests import ClusterJob, check_job_name, k8s_manifest, slurm_script
from ..jobs.run import (
    Attempt,
    Engine,
    JobOptions,
    JobsFailed,
    LocalPool,
    ShardResult,
    Task,
    describe_failure,
    run_one,
    run_shards,
)
from ..jobs.spec import check_command, format_index_list, load_shards, parse_index_list, shard_argv
from ..jobs.status import JobStatus, describe, job_status
from ..sinks import write_atomically
from .common import (
    CONTEXT_SETTINGS,
    MAX_PROCESSES,
    Finite,
    TarprocCommand,
    common_options,
    number,
    say,
    shared_option,
    warn,
)

EPILOG = """\b
Examples:
  tarjob -s '{0000..0999}' -j 8 -- tarproc -c 'run-ocr sample.png' in-{}.tar -o out-{}.tar
  tarjob -s 'shards/*.tar' --retries 3 --command-timeout 3600 -- tarindex {}
  tarjob -s @failed.txt --shell -- 'tarcat s3://b/{}.tar | tarproc -c "..." -o s3://b/new-{}.tar'
  tarjob -s '{0000..0999}' --dask tcp://scheduler:8786 -- tarproc -c '...' in-{}.tar -o out-{}.tar
  tarjob -s '{0000..0999}' -j 50 --k8s-manifest job.yaml --image reg/tarproc:1 -- \\
      tarproc -c '...' gs://b/in-{}.tar -o gs://b/out-{}.tar && kubectl apply -f job.yaml
  tarjob -s '{0000..0999}' -j 100 --slurm job.sh -- \\
      tarproc -c '...' /shared/in-{}.tar -o /shared/out-{}.tar && sbatch job.sh
  tarjob -s '{0000..0999}' --status -- tarproc -c '...' /shared/in-{}.tar -o /shared/out-{}.tar

\b
{} in every argument of COMMAND becomes the shard id (without --shell, no shell runs: quote
nothing twice). Every attempt is a JSON line in the journal (--journal, default ./tarjob.jsonl):
shard, status, attempt, seconds, host, exit code, the tail of its output, the command. A re-run
of the same command skips the shards the journal has as ok (--redo runs them again): after a
crash or Ctrl-C, run the same line again.
The command's stdout and stderr go to the journal's tail (and to --log-dir); a failed shard's
tail is shown on stderr. The command finds $TARJOB_SHARD, $TARJOB_INDEX and $TARJOB_ATTEMPT.
--k8s-manifest and --slurm write files to submit; their tasks run 'tarjob --index I' (shard
number I of SPEC, counting from 0), which is also how to run one shard by hand.
--status reads the journal (on a cluster: the one given with --journal, on a shared file system)
and lists the shard numbers done, failed (with why) and missing (not run, still running, or
stopped before they ended), then the --only list that runs the failed and missing ones again;
with -q, that list alone. Given after --, COMMAND counts only its own records.
"""


@click.command("tarjob", cls=TarprocCommand, epilog=EPILOG,
               context_settings=dict(CONTEXT_SETTINGS, allow_interspersed_args=False))
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- COMMAND [ARGS]...")
@click.option("-s", "--spec", required=True, metavar="SPEC",
              help="Shard ids: a brace expression '{0000..0999}', @FILE (one id a line) or a glob of paths.")
@click.option("-j", "--jobs", type=number(1, MAX_PROCESSES), default=None, metavar="N",
              help="Shards run at once (local pool, --dask local workers, Kubernetes parallelism, "
                   "Slurm %N)  [default: number of CPUs; on clusters: no limit].")
@click.option("--shell", is_flag=True, help="Run COMMAND (one string) with bash -c; {} becomes the quoted id.")
@click.option("--journal", default=DEFAULT_JOURNAL, show_default=True, metavar="FILE",
              help="JSON lines, one per attempt; shards recorded as ok are skipped on a re-run.")
@click.option("--redo", is_flag=True, help="Run every shard, even those the journal has as done.")
@shared_option("--retries", type=number(0), default=2, show_default=True, metavar="N",
              help="Run a failed shard up to N more times.")
@click.option("--backoff", type=Finite(min=0), default=5.0, show_default=True, metavar="SEC",
              help="Wait SEC before the first retry, twice that before the second, and so on.")
@shared_option("--command-timeout", "timeout", type=Finite(min=0, min_open=True), default=None, metavar="SEC",
              help="Kill an attempt (its whole process group) after SEC seconds.")
@click.option("--log-dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Keep each shard's whole output as DIR/ID.log (on the machine that ran it).")
@click.option("--only", metavar="LIST", help="Only these shard numbers of SPEC, e.g. '3,17,40-42' "
              "(kubectl's failedIndexes).")
@click.option("--dry-run", is_flag=True, help="Print the commands that would run, one per line; run nothing.")
@click.option("--dask", metavar="ADDRESS",
              help="Run on a Dask cluster (tcp://host:8786), or 'local': a LocalCluster of -j workers.")
@click.option("--index", "index", type=number(0), default=None, metavar="I",
              help="Run only shard number I of SPEC, here (what cluster tasks run).")
@click.option("--k8s-manifest", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write a Kubernetes Indexed Job to FILE (needs --image); run nothing.")
@click.option("--image", metavar="IMAGE", help="Container image of the Kubernetes pods (with tarjob installed).")
@click.option("--namespace", metavar="NS", help="Kubernetes namespace of the Job.")
@shared_option("--name", default="tarjob", show_default=True, help="Kubernetes Job or Slurm job name.")
@click.option("--cpu", metavar="CPU", help="CPU request per pod (Kubernetes '2', '500m'; Slurm cpus-per-task).")
@click.option("--memory", metavar="MEM", help="Memory request per pod or task ('4Gi'; Slurm '4G').")
@click.option("--slurm", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write an sbatch array script to FILE; run nothing.")
@click.option("--status", "show_status", is_flag=True,
              help="Tell which shards of SPEC the journal has done, failed or missing, and the --only list "
                   "that runs the others again (with -q: that list alone); run nothing.")
@common_options
def main(
    quiet: bool, command: tuple[str, ...], spec: str, jobs: int | None, shell: bool, journal: str, redo: bool,
    retries: int, backoff: float, timeout: float | None, log_dir: str | None, only: str | None, dry_run: bool,
    dask: str | None, index: int | None, k8s_manifest: str | None, image: str | None, namespace: str | None,
    name: str, cpu: str | None, memory: str | None, slurm: str | None, show_status: bool,
) -> None:
    """Run a command once per shard: here, on a Dask cluster, or as a Kubernetes or Slurm job.

    Shards run in parallel (-j), each attempt recorded in a journal; failed shards are retried
    with backoff (--retries, --backoff) and listed at the end (exit status 1). A re-run skips the
    shards already done. Progress and a summary go to stderr.
    """
    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if argv or not show_status:  # --status without COMMAND counts the records of any command
        check_command(argv, shell)
    modes = [flag for flag, given in (("--index", index is not None), ("--dask", dask is not None),
                                      ("--k8s-manifest", k8s_manifest), ("--slurm", slurm),
                                      ("--status", show_status), ("--dry-run", show_status and dry_run),
                                      ("--redo", show_status and redo)) if given]
    if len(modes) > 1:
        raise OptionError(f"{' and '.join(modes)} can't be used together")
    if image and not k8s_manifest:
        raise OptionError("--image goes with --k8s-manifest")
    if k8s_manifest and not image:
        raise OptionError("--k8s-manifest needs --image IMAGE (an image with tarjob and the command installed)")
    if k8s_manifest or slurm:
        check_job_name(name, kubernetes=bool(k8s_manifest))
    shards = load_shards(spec)
    numbered = list(enumerate(shards.ids))
    wanted = None
    if only is not None:
        wanted = parse_index_list(only)
        if wanted[-1] >= len(numbered):
            raise OptionError(f"--only {only}: SPEC has {len(numbered)} shards (numbers 0 to {len(numbered) - 1})")
        numbered = [numbered[i] for i in wanted]
    options = JobOptions(argv, shell=shell, retries=retries, backoff=backoff, timeout=timeout, log_dir=log_dir)

    if show_status:
        book = Journal(journal)
        if not os.path.exists(journal):
            warn(f"{journal}: no such journal (yet): every shard is missing")
        status = job_status(shards.ids, book.records(warn), options.command_text if argv else None, wanted)
        if not argv and len(status.commands) > 1:
            warn(f"{journal} has records of {len(status.commands)} commands for these shards: counting them all "
                 "(give the job's COMMAND after -- to count its own)")
        _print_status(status, spec, journal, quiet)
        return

    if k8s_manifest or slurm:
        cluster = ClusterJob(
            spec, shards.ids, shards.portable, options, parallelism=jobs, name=name,
            journal=journal if journal != DEFAULT_JOURNAL else None, only=wanted,
        )
        if k8s_manifest:
            _write_k8s(cluster, k8s_manifest, image or "", namespace, cpu, memory)
        else:
            _write_slurm(cluster, slurm or "", journal, cpu, memory)
        return

    if index is not None:
        if index >= len(shards.ids):
            n = len(shards.ids)
            raise OptionError(f"--index {index}: SPEC has {n} shards (numbers 0 to {n - 1})")
        numbered = [(index, shards.ids[index])]
    if log_dir and not dry_run:
        try:
            os.makedirs(log_dir, exist_ok=True)
        except OSError as e:
            raise SinkError(f"cannot create the log directory: {e.strerror}", log_dir) from None

    book = Journal(journal)
    todo = numbered if redo else _not_done(numbered, book, options.command_text)
    if dry_run:
        for _, shard in todo:
            click.echo(shlex.join(shard_argv(argv, shard, shell)))
        return
    book.open()  # an unwritable journal is an error before any shard runs
    try:
        if index is not None:
            _run_index(todo, index, options, book, quiet)
        else:
            _run_all(todo, len(numbered), options, book, _engine(dask, jobs), quiet)
    finally:
        book.close()


FAILURES_SHOWN = 20


def _print_status(status: JobStatus, spec: str, journal: str, quiet: bool) -> None:
    """The report of --status on stdout (with -q: the --only list alone, nothing when all done)."""
    rerun = format_index_list(status.rerun)
    if quiet:
        if rerun:
            click.echo(rerun)
        return
    counts = ", ".join(f"{status.count(state)} {state}" for state in ("done", "failed", "missing"))
    lines = [f"{len(status.shards)} shards of {spec!r} in {journal}: {counts}"]
    for state in ("done", "failed", "missing"):
        numbers = status.indexes(state)
        if numbers:
            lines.append(f"{state}: {format_index_list(numbers)}")
    failed = [s for s in status.shards if s.state == "failed"]
    for shard in failed[:FAILURES_SHOWN]:
        lines.append(f"  shard {shard.shard} (number {shard.index}) {describe(shard)}")
    if len(failed) > FAILURES_SHOWN:
        lines.append(f"  ... and {len(failed) - FAILURES_SHOWN} more (jq 'select(.status != \"ok\")' {journal})")
    lines.append(f"re-run: --only {rerun}" if rerun else "all done")
    click.echo("\n".join(lines))


def _write_k8s(cluster: ClusterJob, path: str, image: str, namespace: str | None, cpu: str | None,
               memory: str | None) -> None:
    write_atomically(path, k8s_manifest(cluster, image, namespace=namespace, cpu=cpu, memory=memory))
    say(f"tarjob: wrote {path}: Indexed Job {cluster.name!r} of {len(cluster.picked())} shards "
        f"(kubectl apply -f {path})")


def _write_slurm(cluster: ClusterJob, path: str, journal: str, cpu: str | None, memory: str | None) -> None:
    cluster.journal = os.path.abspath(journal)  # array tasks share it (a shared file system)
    write_atomically(path, slurm_script(cluster, _int_or_none(cpu), memory), mode=0o755)
    say(f"tarjob: wrote {path}: array of {len(cluster.picked())} shards (sbatch {path})")


def _engine(dask: str | None, jobs: int | None) -> Callable[[JobOptions], Engine]:
    """How to start the engine, once there is something to run (a Dask cluster takes seconds)."""
    workers = jobs or os.cpu_count() or 1

    def start(options: JobOptions) -> Engine:
        if dask is None:
            return LocalPool(options, workers)
        from ..jobs.dask_engine import DaskEngine

        return DaskEngine(options, dask, workers)

    return start


def _run_all(todo: list[tuple[int, str]], total: int, options: JobOptions, book: Journal,
             start_engine: Callable[[JobOptions], Engine], quiet: bool) -> None:
    """Run ``todo`` on the engine, show each failure, then the summary; exit 1 if any failed."""
    skipped = total - len(todo)
    if skipped and not quiet:
        say(f"tarjob: skipped {skipped} done (in {book.path}; --redo runs them again)")
    start = time.monotonic()
    failed: list[ShardResult] = []
    ok = 0
    if todo:
        results = run_shards(todo, options, start_engine(options), book, on_retry=_retry_warning(options))
        with contextlib.closing(results):
            for result in _progress(results, len(todo), quiet):
                if result.ok:
                    ok += 1
                else:
                    failed.append(result)
                    _show_failure(result, options)
    seconds = time.monotonic() - start
    if not quiet:
        rate = f"{len(todo) / seconds:.2f}" if seconds > 0 else "-"
        say(f"tarjob: {total} shards: {ok} done, {skipped} skipped, {len(failed)} failed "
            f"in {seconds:.1f} s ({rate} shards/s)")
    if failed:
        failed.sort(key=lambda r: r.index)
        names = ", ".join(r.shard for r in failed[:10]) + (", ..." if len(failed) > 10 else "")
        raise JobsFailed(f"{len(failed)} of {total} shards failed: {names} (see {book.path})")


def _not_done(numbered: list[tuple[int, str]], book: Journal, command: str) -> list[tuple[int, str]]:
    """The shards without an ``ok`` record of this command; a word about those done by another."""
    done = book.done(warn, command)
    todo = [(i, s) for i, s in numbered if s not in done]
    others = book.done(command=None) - done
    again = sum(1 for _, s in todo if s in others)
    if again:
        warn(f"{book.path} has {again} of these shards done by another command: running them "
             "(give each job its own --journal)")
    return todo


def _int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise OptionError(f"--cpu {value!r}: Slurm needs a whole number of CPUs") from None


def _run_index(todo: list[tuple[int, str]], index: int, options: JobOptions, book: Journal, quiet: bool) -> None:
    if not todo:
        if not quiet:
            say(f"tarjob: shard {index} is done already (--redo runs it again)")
        return
    (i, shard), = todo
    result = run_one(i, shard, options, book, on_retry=_retry_warning(options))
    if not result.ok:
        _show_failure(result, options)
        raise JobsFailed(f"shard {shard} (number {i}) failed: {result.last.reason(options.timeout)}")
    if not quiet:
        say(f"tarjob: shard {shard} (number {i}) done in {result.last.seconds:.1f} s")


def _retry_warning(options: JobOptions) -> Callable[[Task, Attempt, float], None]:
    def on_retry(task: Task, attempt: Attempt, pause: float) -> None:
        warn(f"shard {task.shard} {attempt.reason(options.timeout)} (attempt {task.attempt} of "
             f"{options.retries + 1}); retrying in {pause:g} s")

    return on_retry


TAIL_LINES = 10


def _show_failure(result: ShardResult, options: JobOptions) -> None:
    """The failed shard's reason, then the end of its output, each line prefixed with its id."""
    lines = [f"tarjob: {describe_failure(result, options)}"]
    tail = result.last.output_tail.splitlines()[-TAIL_LINES:]
    lines += [f"{result.shard}: {line}" for line in tail]
    say("\n".join(lines))


def _progress(results: Iterator[ShardResult], total: int, quiet: bool) -> Iterator[ShardResult]:
    """A tqdm bar of finished shards on stderr (a terminal only, not with -q), updated per shard."""
    try:
        enabled = not quiet and os.isatty(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        enabled = False
    if not enabled:
        yield from results
        return
    from tqdm import tqdm

    with tqdm(results, total=total, desc="tarjob", unit="shard", file=sys.stderr, dynamic_ncols=True) as bar:
        yield from bar


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tarjob")
