"""tarjob's core: the same per-shard command on a local pool, Dask, Kubernetes or Slurm.

- ``spec``: shard ids from a SPEC (brace expression, ``@list``, glob) and each shard's argv;
- ``journal``: the JSON-lines record of every attempt, appended whole, read back to resume;
- ``run``: one attempt (own process group, timeout, output tail), retries with backoff, the
  local pool and the loop over an engine;
- ``dask_engine``: attempts as Dask tasks (imports ``distributed`` only when used);
- ``manifests``: a Kubernetes Indexed Job and a Slurm array script running ``tarjob --index``;
- ``status``: which shards the journal has done, failed or missing (``tarjob --status``).
"""

from .journal import DEFAULT_JOURNAL, Journal, JournalError
from .run import Attempt, JobOptions, JobsFailed, LocalPool, ShardResult, Task, run_one, run_shards
from .spec import Shards, SpecError, expand_spec, format_index_list, load_shards, parse_index_list, shard_argv
from .status import JobStatus, ShardStatus, job_status

__all__ = [
    "DEFAULT_JOURNAL", "Attempt", "JobOptions", "JobStatus", "JobsFailed", "Journal", "JournalError", "LocalPool",
    "ShardResult", "ShardStatus", "Shards", "SpecError", "Task", "expand_spec", "format_index_list", "job_status",
    "load_shards", "parse_index_list", "run_one", "run_shards", "shard_argv",
]
