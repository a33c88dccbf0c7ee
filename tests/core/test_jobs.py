"""tarproc.jobs: shard specs, the journal, attempts with retries and timeouts, the manifests."""

from __future__ import annotations

import json
import os
import time

import pytest
import yaml

from tarproc.errors import OptionError
from tarproc.jobs import (
    JobOptions,
    Journal,
    JournalError,
    LocalPool,
    SpecError,
    expand_spec,
    load_shards,
    parse_index_list,
    run_shards,
    shard_argv,
)
from tarproc.jobs.manifests import ClusterJob, k8s_manifest, slurm_script, to_yaml
from tarproc.jobs.run import run_attempt
from tarproc.jobs.spec import check_command
from tarproc.sinks import write_atomically

# -------------------------------------------------------------------------------------------
# specs


def test_brace_spec():
    assert expand_spec("{0000..0002}") == ["0000", "0001", "0002"]
    assert expand_spec("{a,b}-{0..1}") == ["a-0", "a-1", "b-0", "b-1"]
    assert load_shards("{0..3}").portable


def test_list_file_spec(tmp_path):
    path = tmp_path / "ids.txt"
    path.write_text("# shards\n0007\n\n  0012  \n0044\n")
    shards = load_shards(f"@{path}")
    assert shards.ids == ["0007", "0012", "0044"] and not shards.portable


def test_glob_spec_is_sorted_paths(tmp_path):
    for name in ["b.tar", "a.tar", "c.txt"]:
        (tmp_path / name).write_bytes(b"")
    shards = load_shards(str(tmp_path / "*.tar"))
    assert shards.ids == [str(tmp_path / "a.tar"), str(tmp_path / "b.tar")] and not shards.portable


@pytest.mark.parametrize("spec, error, text", [
    ("{0..2}{0..1}x{0,0}", OptionError, "twice"),
    ("", OptionError, "empty"),
    ("@/no/such/list", SpecError, "cannot read the shard list"),
    ("/no/such/dir/*.tar", SpecError, "no files match"),
])
def test_bad_specs(spec, error, text):
    with pytest.raises(error, match=text):
        load_shards(spec)


def test_empty_list_file(tmp_path):
    (tmp_path / "ids").write_text("# nothing\n")
    with pytest.raises(SpecError, match="names no shards"):
        load_shards(f"@{tmp_path / 'ids'}")


def test_command_needs_placeholder():
    with pytest.raises(OptionError, match="no '{}'"):
        check_command(["echo", "hi"], shell=False)
    with pytest.raises(OptionError, match="one string"):
        check_command(["echo", "{}"], shell=True)
    check_command(["echo {}"], shell=True)


def test_shell_quotes_the_id():
    assert shard_argv(["cat {}.txt"], "it's", shell=True) == ["bash", "-c", "cat 'it'\"'\"'s'.txt"]
    assert shard_argv(["a{}b", "{}"], "x;y") == ["ax;yb", "x;y"]


def test_index_list():
    assert parse_index_list("1,3-4, 9") == [1, 3, 4, 9]
    with pytest.raises(OptionError):
        parse_index_list("3-1")
    with pytest.raises(OptionError):
        parse_index_list("x")


# -------------------------------------------------------------------------------------------
# journal


def test_journal_append_and_done(tmp_path):
    j = Journal(str(tmp_path / "j.jsonl"))
    j.append({"shard": "a", "status": "failed"})
    j.append({"shard": "a", "status": "ok"})
    j.append({"shard": "b", "status": "timeout"})
    j.close()
    assert j.done() == {"a"}
    assert (tmp_path / "j.jsonl").read_text().count("\n") == 3


def test_journal_truncated_last_line_is_a_warning_and_next_append_starts_a_line(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text('{"shard": "a", "status": "ok"}\n{"shard": "b", "sta')
    warnings: list[str] = []
    j = Journal(str(path))
    assert j.done(warnings.append) == {"a"}
    assert len(warnings) == 1 and "line 2: a truncated record" in warnings[0]
    j.append({"shard": "b", "status": "ok"})
    j.close()
    assert Journal(str(path)).done(warnings.append) == {"a", "b"}


@pytest.mark.parametrize("line, text", [("garbage", "line 2: not a JSON record"),
                                        ('{"status": "ok"}', "line 2: not a record of tarjob"),
                                        ('{"shard": "x", "status": "great"}', "line 2: not a record")])
def test_journal_corrupt_line_is_an_error(tmp_path, line, text):
    path = tmp_path / "j.jsonl"
    path.write_text(f'{{"shard": "a", "status": "ok"}}\n{line}\n{{"shard": "b", "status": "ok"}}\n')
    with pytest.raises(JournalError, match=text) as e:
        Journal(str(path)).done()
    assert str(e.value).startswith(f"{path}: ")


def test_journal_appends_are_whole_lines_across_writers(tmp_path):
    path = str(tmp_path / "j.jsonl")
    writers = [Journal(path) for _ in range(4)]
    for i in range(200):
        writers[i % 4].append({"shard": str(i), "status": "ok", "output_tail": "x" * 3000})
    for w in writers:
        w.close()
    assert len(Journal(path).done()) == 200


# -------------------------------------------------------------------------------------------
# attempts and the loop


def test_attempt_captures_output_tail_and_status():
    a = run_attempt(["bash", "-c", "head -c 5000 /dev/zero | tr '\\0' x; echo; echo oops >&2; exit 3"])
    assert a.status == "failed" and a.exit_code == 3
    assert a.output_tail.endswith("oops\n") and len(a.output_tail) == 2048
    assert a.reason() == "exited with status 3"


def test_attempt_timeout_kills_the_group():
    # 600 s: past pytest's timeout, were the group waited for
    a = run_attempt(["bash", "-c", "sleep 600 & sleep 600"], timeout=0.3)
    assert a.status == "timeout"
    assert a.reason(0.3) == "timed out after 0.3 s"


def test_attempt_missing_program():
    a = run_attempt(["/no/such/program"])
    assert a.status == "error" and "No such file" in a.output_tail


def test_run_shards_retries_with_backoff(tmp_path):
    # shard 'b' fails twice, then succeeds; the counter lives in a file
    cmd = ["bash", "-c", f"n=$(cat {tmp_path}/{{}}.n 2>/dev/null || echo 0); echo $((n+1)) > {tmp_path}/{{}}.n;"
           f' [ {{}} != b ] || [ $n -ge 2 ]']
    options = JobOptions(cmd, retries=2, backoff=0.2)
    journal = Journal(str(tmp_path / "j.jsonl"))
    retried = []
    t0 = time.monotonic()
    results = list(run_shards([(0, "a"), (1, "b")], options, LocalPool(options, 2), journal,
                              on_retry=lambda task, attempt, pause: retried.append((task.attempt, pause))))
    assert time.monotonic() - t0 >= 0.6  # 0.2 s then 0.4 s
    assert [(r.shard, r.ok, r.attempts) for r in sorted(results, key=lambda r: r.index)] == [("a", True, 1),
                                                                                          ("b", True, 3)]
    assert retried == [(1, 0.2), (2, 0.4)]
    records = [json.loads(line) for line in open(journal.path)]
    assert [(r["shard"], r["attempt"], r["status"]) for r in records if r["shard"] == "b"] == [
        ("b", 1, "failed"), ("b", 2, "failed"), ("b", 3, "ok")]
    assert set(records[0]) == {"shard", "index", "status", "attempt", "seconds", "host", "exit_code",
                               "output_tail", "start", "engine", "command"}
    assert records[0]["command"] == options.command_text


def test_run_shards_gives_up_after_retries(tmp_path):
    options = JobOptions(["bash", "-c", "echo no {} >&2; exit 1"], retries=1, backoff=0)
    results = list(run_shards([(0, "x")], options, LocalPool(options, 1), None))
    assert len(results) == 1 and not results[0].ok and results[0].attempts == 2
    assert results[0].last.output_tail == "no x\n"


def test_closing_early_kills_running_commands(tmp_path):
    options = JobOptions(["bash", "-c", f"echo $$ > {tmp_path}/{{}}.pid; exec sleep 30"])
    gen = run_shards([(0, "a"), (1, "b"), (2, "c")], options, LocalPool(options, 2), None)
    import threading

    def stop_soon() -> None:
        deadline = time.monotonic() + 60  # not a test failure: the main thread's asserts say what happened
        while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)  # the scenario: a Ctrl-C while both jobs run
        os.kill(os.getpid(), 2)  # SIGINT: KeyboardInterrupt in the main thread, inside the loop

    threading.Thread(target=stop_soon, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        list(gen)
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# -------------------------------------------------------------------------------------------
# manifests


def cluster_job(**kw):
    base = dict(spec="{0000..0009}", ids=[f"{i:04d}" for i in range(10)], portable=True,
                options=JobOptions(["tarproc", "-c", "echo $(date) $$", "in-{}.tar", "-o", "out-{}.tar"], retries=3),
                parallelism=4, name="ocr")
    base.update(kw)
    return ClusterJob(**base)


def test_yaml_writer_round_trips_through_pyyaml():
    value = {"a": [1, {"b": "x: y", "c": ["p", "q"]}, []], "d": {}, "e": "it's \"q\" \n", "f": True, "g": None}
    assert yaml.safe_load(to_yaml(value)) == value


def test_k8s_manifest_structure():
    docs = list(yaml.safe_load_all(k8s_manifest(cluster_job(), "reg/tarproc:1", namespace="data", cpu="2",
                                                memory="4Gi")))
    assert len(docs) == 1
    job = docs[0]
    assert job["apiVersion"] == "batch/v1" and job["kind"] == "Job"
    assert job["metadata"]["name"] == "ocr" and job["metadata"]["namespace"] == "data"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == 10 and spec["parallelism"] == 4 and spec["backoffLimitPerIndex"] == 3
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["image"] == "reg/tarproc:1" and container["command"] == ["tarjob"]
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}}
    args = container["args"]
    assert args[:2] == ["--index", "$(JOB_COMPLETION_INDEX)"]
    assert args[args.index("-s") + 1] == "{0000..0009}" and args[args.index("--retries") + 1] == "0"
    # Kubernetes would expand $(date) and turn $$ into $: escaped
    assert args[args.index("--") + 1:] == ["tarproc", "-c", "echo $$(date) $$$$", "in-{}.tar", "-o", "out-{}.tar"]


def test_k8s_manifest_embeds_listed_ids_in_a_configmap():
    docs = list(yaml.safe_load_all(k8s_manifest(cluster_job(portable=False, spec="@ids.txt"), "img")))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Job"]
    assert docs[0]["data"]["shards"] == "".join(f"{i:04d}\n" for i in range(10))
    pod = docs[1]["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "shards", "configMap": {"name": "ocr-shards"}}]
    assert pod["containers"][0]["volumeMounts"][0]["mountPath"] == "/etc/tarjob"
    args = pod["containers"][0]["args"]
    assert args[args.index("-s") + 1] == "@/etc/tarjob/shards"


def test_slurm_script_header():
    text = slurm_script(cluster_job(), cpus=4, memory="8G")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "#SBATCH --array=0-9%4" in lines and "#SBATCH --job-name=ocr" in lines
    assert "#SBATCH --cpus-per-task=4" in lines and "#SBATCH --mem=8G" in lines
    assert "set -euo pipefail" in lines
    assert lines[-1].startswith('exec tarjob --index "$SLURM_ARRAY_TASK_ID" -s \'{0000..0009}\' --retries 3 ')


def test_write_atomically(tmp_path):
    path = tmp_path / "job.yaml"
    write_atomically(str(path), "a: 1\n")
    assert path.read_text() == "a: 1\n" and os.listdir(tmp_path) == ["job.yaml"]
