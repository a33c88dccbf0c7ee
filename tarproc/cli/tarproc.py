"""tarproc: run a shell command (or a Python function) on every sample, in parallel, in order."""

from __future__ import annotations

import contextlib
import os
import sys

import click

from ..errors import OptionError
from ..process import ON_JOB_ERROR, JobStats, map_samples, shell_samples
from ..sniff import escape_text
from ..tar import ReadStats
from .common import (
    MAX_PROCESSES,
    Finite,
    ReadOptions,
    TarprocCommand,
    WriteOptions,
    common_options,
    job_input_options,
    number,
    output_option,
    progress,
    say,
    shared_option,
    write_tar,
    writer_options,
)

EPILOG = """\b
Examples:
  tarproc -p 8 -c 'gm mogrify -resize 256x256 sample.jpg' train-0000.tar > small-0000.tar
  tarcat 'train-{0000..0009}.tar' | tarproc -p 4 -c 'cwebp -quiet sample.jpg -o sample.webp' \\
      --exclude jpg | tarsplit -n 10000 -o webp
  tarproc -c 'exiftool -json sample.jpg > sample.exif.json' --command-timeout 30 -e skip in.tar -o out.tar
  tarproc -c 'file -b sample.*' --log info -f info in.tar | tar -xOf - --wildcards '*.info'
  tarproc -p 4 --map mymodule:resize in.tar > out.tar     # def resize(sample: dict) -> dict | None

\b
Each sample's fields are written to a private temporary directory as sample.EXT (the key is
never a file name: it is in $KEY, with $SAMPLE_DIR and $INDEX); bash runs the command there, and
the sample.* regular files present afterwards are the output sample, under the same key (none
left: the sample is dropped). The command's stdout and stderr never enter the tar stream: they
go to stderr, each line prefixed with the key, or into a field with --log. When the command
exits, the rest of its process group is killed.
"""

def _names(values: tuple[str, ...]) -> list[str]:
    """Field lists given as repeated options and/or comma/space separated."""
    return [name for value in values for name in value.replace(",", " ").split()]


@click.command("tarproc", cls=TarprocCommand, epilog=EPILOG)
@job_input_options  # damaged shards: --on-bad-shard (--on-error from 1.1); network: --read-timeout
@output_option
@click.option("-c", "--command", metavar="CMD", help="Shell command run by bash in each sample's directory.")
@click.option("-s", "--script", type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="Bash script run in each sample's directory (instead of -c).")
@click.option("--map", "function", metavar="MODULE:FUNCTION",
              help="Python function applied to each sample dict in worker processes (instead of -c); "
                   "also path/to/file.py:function.")
@shared_option("-p", "--processes", "procs", type=number(1, MAX_PROCESSES), default=None, metavar="N",
              help="Jobs run at the same time  [default: number of CPUs].")
@click.option("--window", type=number(1), default=None, metavar="N",
              help="Most samples in flight or waiting for an earlier one to finish  "
                   "[default: 4 x procs; 64 x procs with --map].")
@click.option("--unordered", is_flag=True, help="Write samples as they finish, not in input order.")
@shared_option("--command-timeout", "timeout", type=Finite(min=0, min_open=True), default=None, metavar="SEC",
              help="Kill a sample's command (its whole process group) after SEC seconds: an error.")
@click.option("-e", "--on-command-error", "on_error", type=click.Choice(ON_JOB_ERROR), default="fail",
              show_default=True,
              help="When a command fails or times out: stop with its key and output, drop the sample "
                   "(counted), or keep the input sample unchanged.")
@click.option("-f", "--fields", multiple=True, metavar="LIST",
              help="Collect only these fields (comma-separated, glob patterns), e.g. 'jpg,json' (both: a list, "
                   "not a field spec).")
@click.option("--exclude", multiple=True, metavar="LIST", help="Do not collect these fields (glob patterns).")
@click.option("--log", "log_field", metavar="FIELD",
              help="Put the command's stdout and stderr into FIELD of the output sample, not on stderr.")
@shared_option("--tmpdir", type=click.Path(exists=True, file_okay=False), metavar="DIR",
              help="Where the sample directories (and the commands' output) go; a full one stops the run, "
                   "naming it  [default: $TMPDIR or /tmp].")
@writer_options
@common_options
def main(
    reading: ReadOptions,
    writing: WriteOptions,
    quiet: bool,
    output: str,
    command: str | None,
    script: str | None,
    function: str | None,
    procs: int | None,
    window: int | None,
    unordered: bool,
    timeout: float | None,
    on_error: str,
    fields: tuple[str, ...],
    exclude: tuple[str, ...],
    log_field: str | None,
    tmpdir: str | None,
) -> None:
    """Run a shell command (or a Python function) on every sample, in parallel, keeping the order.

    INPUTS are tar shards as for tarcat (default stdin); the output is one tar stream (stdout or
    -o). A summary goes to stderr at the end (not with -q).
    """
    given = [name for name, value in (("-c", command), ("-s", script), ("--map", function)) if value is not None]
    if len(given) != 1:
        raise OptionError("give one of -c CMD, -s SCRIPT or --map MODULE:FUNCTION" +
                          (f" (not {' and '.join(given)})" if given else ""))
    if function is not None and timeout is not None:
        raise OptionError("--command-timeout works with -c and -s only (a Python function can't be stopped "
                          "safely)")
    if function is not None and log_field is not None:
        raise OptionError("--log works with -c and -s only")
    workers = procs or os.cpu_count() or 1
    stats = ReadStats()
    jobs = JobStats()

    source = reading.samples(stats)
    with contextlib.closing(source):
        if function is not None:
            processed = map_samples(
                source, function, workers=workers, window=window, ordered=not unordered, on_error=on_error,
                fields=_names(fields), exclude=_names(exclude), stats=jobs,
            )
        else:
            processed = shell_samples(
                source, command, script=script, workers=workers, window=window, ordered=not unordered,
                timeout=timeout, on_error=on_error, log_field=log_field, fields=_names(fields),
                exclude=_names(exclude), tmpdir=tmpdir, max_file_size=reading.max_member_size, stats=jobs,
                on_log=_forward_log,
            )
        with contextlib.closing(processed):
            write_tar(progress(processed, quiet, "tarproc"), output, writing)
    if not quiet:
        say(f"tarproc: {jobs.summary()}")


def _forward_log(key: str, log: bytes) -> None:
    """A command's output on our stderr, each line prefixed with its sample's key."""
    text = log.decode("utf-8", "replace")
    prefix = escape_text(key)  # the key comes from the data; the output is the user's own command's
    lines = "".join(f"{prefix}: {line}\n" for line in text.splitlines())
    sys.stderr.write(lines)
    sys.stderr.flush()


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tarproc")
