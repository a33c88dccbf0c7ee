"""Every variant of ``tarjob --k8s-manifest`` against the official Kubernetes OpenAPI schema of each
supported version (1.29 and later: the JSON schemas that kubernetes-validate ships, strict: an
unknown field is an error), plus the rules the API server checks beyond the schema (names, labels,
references between the documents, the Job's podFailurePolicy constraints).

The manifest is read as kubectl reads it: YAML documents, the comments skipped.
"""

from __future__ import annotations

import re

import pytest
import yaml

from tarproc.cli.tarjob import main as tarjob

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (make install-dev)")
from kubernetes_validate.utils import all_versions  # noqa: E402

MIN_VERSION = (1, 29)  # backoffLimitPerIndex is beta and on by default from 1.29 (docs/recipes.md)


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


VERSIONS = sorted({".".join(map(str, _minor(v))) for v in all_versions() if _minor(v) >= MIN_VERSION}, key=_minor)

COMMAND = ["--", "tarproc", "-c", "echo $KEY $(date) > sample.txt", "gs://b/in-{}.tar", "-o", "gs://b/out-{}.tar"]

VARIANTS = {
    "brace spec, defaults": ["-s", "{0000..0999}"],
    "parallelism, retries, resources": ["-s", "{0000..0999}", "-j", "50", "--retries", "3", "--name", "ocr",
                                        "--namespace", "data", "--cpu", "500m", "--memory", "8Gi"],
    "no retries, one at a time": ["-s", "{0..9}", "-j", "1", "--retries", "0"],
    "timeout, shared journal, log dir": ["-s", "{0..9}", "--timeout", "3600", "--journal", "/shared/j.jsonl",
                                         "--log-dir", "/shared/logs", "--backoff", "0.5"],
    "@list: a ConfigMap": ["-s", "@ids.txt", "-j", "4", "--namespace", "data"],
    "glob: a ConfigMap": ["-s", "shards/*.tar", "--retries", "1"],
    "--only of a brace spec": ["-s", "{0000..0999}", "--only", "3,17,40-42", "-j", "2", "--name", "ocr-retry"],
    "--only of a list": ["-s", "@ids.txt", "--only", "1", "--retries", "5", "--cpu", "2", "--memory", "1Gi"],
    "a 63-character name": ["-s", "{0..2}", "--name", "a" * 61 + "-1"],
}
SHELL_VARIANT = ["-s", "@ids.txt", "--shell", "--", "tarcat s3://b/{}.tar | tarproc -c 'echo \"$$1\"' -o s3://b/n-{}.tar"]


@pytest.fixture
def manifest(tmp_path, monkeypatch, ix):
    here = tmp_path
    monkeypatch.chdir(here)
    (here / "ids.txt").write_text("books-0000\nbooks-0001\nit's a shard\n")
    (here / "shards").mkdir()
    for name in ("a.tar", "b.tar"):
        (here / "shards" / name).write_bytes(b"")

    def make(args):
        r = ix.run(tarjob, ["--k8s-manifest", "job.yaml", "--image", "reg.example.com/t:1", *args])
        assert r.exit_code == 0, r.stderr
        return list(yaml.safe_load_all((here / "job.yaml").read_text()))

    return make


@pytest.mark.parametrize("name", [*VARIANTS, "--shell"])
def test_manifest_validates_against_the_official_schema(manifest, name):
    docs = manifest([*VARIANTS[name], *COMMAND] if name in VARIANTS else SHELL_VARIANT)
    for version in VERSIONS:
        for doc in docs:
            try:
                assert kv.validate(doc, version, strict=True) == version
            except kv.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                pytest.fail(f"Kubernetes {version}: {doc['kind']} {path}: {e.message}")
    check_api_rules(docs)


def test_versions_cover_the_supported_range():
    assert VERSIONS[0] == "1.29" and len(VERSIONS) >= 5  # 1.29 .. 1.33 at least (backoffLimitPerIndex GA)


def test_an_invalid_manifest_is_caught(manifest):
    """The check itself: a field of the wrong type, an unknown field, a missing required one."""
    (_, job) = manifest(["-s", "@ids.txt", *COMMAND])
    broken = yaml.safe_load(yaml.safe_dump(job))
    broken["spec"]["completions"] = "3"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, VERSIONS[0], strict=True)
    broken = yaml.safe_load(yaml.safe_dump(job))
    broken["spec"]["backoffLimitPerIndx"] = 1
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, VERSIONS[-1], strict=True)
    broken = yaml.safe_load(yaml.safe_dump(job))
    del broken["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"][0]["status"]
    with pytest.raises(kv.ValidationError):  # required before 1.35
        kv.validate(broken, "1.29", strict=True)


# -------------------------------------------------------------------------------------------
# what the API server checks beyond the schema (k8s.io/kubernetes pkg/apis/batch/validation and
# apimachinery's name and label validation), for what tarjob writes

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
CONFIGMAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")
MAX_INDEXED_COMPLETIONS = 100_000  # with backoffLimitPerIndex


def check_api_rules(docs):
    *configmaps, job = docs
    assert job["kind"] == "Job" and all(d["kind"] == "ConfigMap" for d in configmaps) and len(configmaps) <= 1
    name = job["metadata"]["name"]
    assert DNS_LABEL.fullmatch(name) and len(name) <= 63  # the pods' job-name label
    for doc in docs:
        for value in doc["metadata"].get("labels", {}).values():
            assert len(value) <= 63 and LABEL_VALUE.fullmatch(value)
        if "namespace" in doc["metadata"]:
            assert DNS_LABEL.fullmatch(doc["metadata"]["namespace"])
    spec = job["spec"]
    pod = spec["template"]["spec"]
    assert spec["completionMode"] == "Indexed"
    assert 1 <= spec["completions"] <= MAX_INDEXED_COMPLETIONS and 1 <= spec["parallelism"] <= MAX_INDEXED_COMPLETIONS
    assert spec["backoffLimitPerIndex"] >= 0
    # podFailurePolicy: only with restartPolicy Never; FailIndex only with backoffLimitPerIndex;
    # onExitCodes names one of the containers, values sorted, unique, not 0 with In
    assert pod["restartPolicy"] == "Never"
    containers = {c["name"] for c in pod["containers"]}
    assert all(DNS_LABEL.fullmatch(c) for c in containers)
    for rule in spec["podFailurePolicy"]["rules"]:
        if rule["action"] == "FailIndex":
            assert "backoffLimitPerIndex" in spec
        if "onExitCodes" in rule:
            codes = rule["onExitCodes"]
            assert codes["containerName"] in containers
            assert codes["values"] == sorted(set(codes["values"])) and 0 not in codes["values"]
        for condition in rule.get("onPodConditions", []):
            assert condition["status"] in ("True", "False", "Unknown")
    # volumes: unique names, each mount names one, each ConfigMap volume names the ConfigMap written
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    assert len(volumes) == len(pod.get("volumes", []))
    for container in pod["containers"]:
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes
        args = container["args"]
        assert args[:2] == ["--index", "$(JOB_COMPLETION_INDEX)"]  # the Job controller sets that variable
    written = {cm["metadata"]["name"] for cm in configmaps}
    for volume in volumes.values():
        if "configMap" in volume:
            assert volume["configMap"]["name"] in written
    for cm in configmaps:
        assert DNS_SUBDOMAIN.fullmatch(cm["metadata"]["name"]) and len(cm["metadata"]["name"]) <= 253
        assert cm["metadata"].get("namespace") == job["metadata"].get("namespace")
        assert all(CONFIGMAP_KEY.fullmatch(k) for k in cm["data"])
        assert sum(len(k) + len(v.encode()) for k, v in cm["data"].items()) < 1024 * 1024


def test_only_sends_the_picked_ids_in_the_configmap(manifest):
    cm, job = manifest(VARIANTS["--only of a brace spec"] + COMMAND)
    assert cm["data"]["shards"] == "0003\n0017\n0040\n0041\n0042\n"
    assert job["spec"]["completions"] == 5 and job["spec"]["parallelism"] == 2
