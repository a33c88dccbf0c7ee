"""Manifests for cluster schedulers: a Kubernetes Indexed Job and a Slurm array script.

Neither is submitted: the files are written (atomically) for ``kubectl apply -f`` or ``sbatch``.
Each task of the cluster runs ``tarjob --index I -s SPEC ... -- COMMAND`` for its shard I.

When the SPEC is not a pure brace expression (``@list``, a glob), the tasks can't expand it
themselves: the ids travel with the manifest (a ConfigMap mounted at ``/etc/tarjob/shards``; in a
Slurm script, a here-document read as ``-s @-``). Some shards only (``--only``): a Slurm array of
those task ids (the shard numbers of the SPEC), a Kubernetes Job of the picked ids in a ConfigMap
(its completion indexes count from 0).

YAML is written without a YAML library: block style, every string value JSON-quoted (valid YAML).

>>> print(to_yaml({"a": [1, {"b": "x y"}], "c": {}}), end="")
a:
  - 1
  - b: "x y"
c: {}
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

from ..errors import OptionError
from .run import JobOptions
from .spec import format_index_list

SHARDS_DIR = "/etc/tarjob"
CONFIGMAP_LIMIT = 1_000_000  # a ConfigMap holds at most 1 MiB


@dataclass
class ClusterJob:
    """What both manifests need: the shards, the per-shard options, and how the cluster runs them."""

    spec: str
    ids: list[str]  # every id of the SPEC
    portable: bool  # the SPEC expands to ``ids`` anywhere (a pure brace expression)
    options: JobOptions
    parallelism: int | None = None
    name: str = "tarjob"
    journal: str | None = None
    only: list[int] | None = None  # the shard numbers to run (--only, sorted); None: all

    def picked(self) -> list[str]:
        """The ids to run."""
        return self.ids if self.only is None else [self.ids[i] for i in self.only]

    def tarjob_args(self, index: str, spec: str, retries: int) -> list[str]:
        """The arguments of ``tarjob --index`` in one task."""
        options = self.options
        args = ["--index", index, "-s", spec, "--retries", str(retries), "--backoff", f"{options.backoff:g}", "-q"]
        if options.timeout is not None:
            args += ["--command-timeout", f"{options.timeout:g}"]
        if self.journal:
            args += ["--journal", self.journal]
        if options.log_dir:
            args += ["--log-dir", options.log_dir]
        if options.shell:
            args.append("--shell")
        return [*args, "--", *options.command]


_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def check_job_name(name: str, kubernetes: bool) -> None:
    """A Kubernetes Job name is a DNS label (it becomes the pods' ``job-name`` label); a Slurm
    one goes on an ``#SBATCH`` line, where a space would end it."""
    if kubernetes and (len(name) > 63 or not _K8S_NAME.fullmatch(name)):
        raise OptionError(f"--name {name!r}: a Kubernetes Job name is lower-case letters, digits and '-' "
                          "(63 at most; it starts and ends with a letter or digit)")
    if not kubernetes and (not name or any(c.isspace() or c in "'\"\\%" for c in name)):
        raise OptionError(f"--name {name!r}: a Slurm job name here has no spaces, quotes or '%'")


def _check_listable(ids: list[str]) -> None:
    """Ids that travel as a list (a ConfigMap, a here-document) must read back as themselves
    through ``-s @FILE``, which skips '#' lines and strips blanks."""
    for shard in ids:
        if shard != shard.strip() or shard.startswith("#") or "\n" in shard or "\r" in shard:
            raise OptionError(f"shard id {shard!r} can't be passed in a list (it starts with '#', or has "
                              "surrounding blanks or a line break): rename it, or use a brace expression")


# ---------------------------------------------------------------------------------------------
# YAML


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    return json.dumps(str(value), ensure_ascii=False)


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
_YAML_WORDS = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"}


def _key(key: Any) -> str:
    """A mapping key: plain when it can't be read as anything but that string."""
    text = str(key)
    if _PLAIN_KEY.fullmatch(text) and text.lower() not in _YAML_WORDS:
        return text
    return _scalar(text)


def to_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML of dicts, lists and scalars (strings JSON-quoted)."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return pad + "{}\n"
        out = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                out.append(f"{pad}{_key(key)}:\n" + to_yaml(item, indent + 2))
            else:
                out.append(f"{pad}{_key(key)}: {_inline(item)}\n")
        return "".join(out)
    if isinstance(value, list):
        if not value:
            return pad + "[]\n"
        out = []
        for item in value:
            if isinstance(item, (dict, list)) and item:
                body = to_yaml(item, indent + 2)
                out.append(f"{pad}- " + body[indent + 2:])  # the first line goes after the dash
            else:
                out.append(f"{pad}- {_inline(item)}\n")
        return "".join(out)
    return pad + _scalar(value) + "\n"


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def _k8s_escape(arg: str) -> str:
    """Kubernetes expands ``$(VAR)`` in a container's args and turns ``$$`` into ``$``: our own
    arguments must reach tarjob unchanged."""
    return arg.replace("$", "$$")


# ---------------------------------------------------------------------------------------------
# Kubernetes


def k8s_manifest(
    job: ClusterJob, image: str, namespace: str | None = None, cpu: str | None = None, memory: str | None = None,
) -> str:
    """A multi-document YAML: (a ConfigMap of the ids and) an Indexed Job of ``len(ids)`` pods."""
    labels = {"app.kubernetes.io/name": "tarjob", "app.kubernetes.io/instance": job.name}
    metadata: dict[str, Any] = {"name": job.name}
    if namespace:
        metadata["namespace"] = namespace
    metadata["labels"] = labels
    documents: list[dict[str, Any]] = []
    spec = job.spec
    ids = job.picked()
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if not job.portable or job.only is not None:  # completion indexes count from 0: the picked ids go along
        _check_listable(ids)
        text = "".join(shard + "\n" for shard in ids)
        if len(text.encode()) > CONFIGMAP_LIMIT:
            raise OptionError(f"{len(ids)} shard ids are too many for a ConfigMap (1 MiB); "
                              "use a brace expression for -s")
        cm_meta = dict(metadata, name=f"{job.name}-shards")
        documents.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": cm_meta, "data": {"shards": text}})
        spec = f"@{SHARDS_DIR}/shards"
        volumes.append({"name": "shards", "configMap": {"name": cm_meta["name"]}})
        mounts.append({"name": "shards", "mountPath": SHARDS_DIR, "readOnly": True})
    # retries are the Job's (a fresh pod, maybe on another node); each pod makes one attempt. A
    # pod's own file system is thrown away with it and may be read-only: no journal there unless
    # --journal names one (on a shared volume)
    pod_job = job if job.journal else dataclasses.replace(job, journal="/dev/null")
    args = [_k8s_escape(a) for a in pod_job.tarjob_args("$(JOB_COMPLETION_INDEX)", spec, retries=0)]
    args[1] = "$(JOB_COMPLETION_INDEX)"
    container: dict[str, Any] = {"name": "tarjob", "image": image, "command": ["tarjob"], "args": args}
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    if requests:
        container["resources"] = {"requests": requests}
    if mounts:
        container["volumeMounts"] = mounts
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if volumes:
        pod["volumes"] = volumes
    documents.append({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "completionMode": "Indexed",
            "completions": len(ids),
            "parallelism": job.parallelism or len(ids),
            "backoffLimitPerIndex": job.options.retries,
            "podFailurePolicy": {"rules": [
                # a drained or preempted node is not the shard's fault: not counted against it
                # ('status' is required by the API before 1.35)
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                # exit status 2 is a usage error: retrying can't help
                {"action": "FailIndex", "onExitCodes": {"containerName": "tarjob", "operator": "In", "values": [2]}},
            ]},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    })
    ns = f" -n {namespace}" if namespace else ""
    head = (f"# {len(ids)} shards of {job.spec!r}: kubectl apply -f THIS_FILE\n"
            f"# failed indexes: kubectl get job {job.name}{ns} -o jsonpath='{{.status.failedIndexes}}'\n")
    return head + "".join("---\n" + to_yaml(doc) for doc in documents)


# ---------------------------------------------------------------------------------------------
# Slurm


def slurm_script(job: ClusterJob, cpus: int | None = None, memory: str | None = None) -> str:
    """An sbatch array script: task ``$SLURM_ARRAY_TASK_ID`` runs shard number that of the SPEC
    (with ``only``, the array has those task ids only)."""
    n = len(job.picked())
    tasks = f"0-{len(job.ids) - 1}" if job.only is None else format_index_list(job.only)
    array = tasks + (f"%{job.parallelism}" if job.parallelism else "")
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job.name}",
        f"#SBATCH --array={array}",
        f"#SBATCH --output={job.name}-%A_%a.out",
    ]
    if cpus:
        lines.append(f"#SBATCH --cpus-per-task={cpus}")
    if memory:
        lines.append(f"#SBATCH --mem={memory}")
    lines += [
        f"# {n} shards of {job.spec!r}: sbatch THIS_FILE; re-run some: sbatch --array=3,17 THIS_FILE",
        "# tarjob must be on PATH (activate its environment in ~/.bashrc or here)",
        "set -euo pipefail",
    ]
    # the task id is the one word the shell expands; everything else is quoted as given
    args = job.tarjob_args("TASK", job.spec if job.portable else "@-", job.options.retries)
    command = " ".join('"$SLURM_ARRAY_TASK_ID"' if i == 1 else shlex.quote(a) for i, a in enumerate(args))
    if job.portable:
        lines.append(f"exec tarjob {command}")
    else:  # the ids, as listed now, on stdin (a here-document)
        _check_listable(job.ids)
        marker = "TARJOB_SHARDS"
        while marker in job.ids:
            marker += "_"
        lines.append(f"exec tarjob {command} <<'{marker}'")
        lines += job.ids
        lines.append(marker)
    return "\n".join(lines) + "\n"
