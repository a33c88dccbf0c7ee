"""Writing and reading shards on an S3-compatible server: moto in server mode on 127.0.0.1.

The commands run as real processes (the installed console scripts) with s3fs pointed at the moto
server through fsspec's environment configuration (FSSPEC_S3_ENDPOINT_URL -> endpoint_url).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest


def run(ix, s3, tmp_path, script, *args, input=None):
    if not os.path.exists(getattr(ix.scripts, script)):
        pytest.skip(f"the {script} console script is not installed")
    env = dict(s3.env, TMPDIR=str(tmp_path / "tmp"))  # upload temporaries go here: check them
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return subprocess.run([getattr(ix.scripts, script), *map(str, args)], input=input, capture_output=True,
                          env=env, timeout=120)


def temporaries(tmp_path):
    return sorted(os.listdir(tmp_path / "tmp"))


def test_environment_points_fsspec_at_moto(s3):
    import fsspec.config

    conf = {}
    fsspec.config.set_conf_env(conf, envdict=s3.env)
    assert conf["s3"]["endpoint_url"] == s3.endpoint


def test_tarsplit_to_s3_and_tarcat_back(ix, s3, shards, tmp_path):
    prefix = f"s3://{s3.bucket}/train"
    r = run(ix, s3, tmp_path, "tarsplit", "-n", "5", "-v", "--manifest", tmp_path / "m.jsonl",
            "-o", f"{prefix}-%06d.tar", *shards.paths)
    assert r.returncode == 0, r.stderr
    assert s3.keys() == [f"train-{i:06d}.tar" for i in range(3)]
    assert b"closed by maxcount" in r.stderr and b"closed by end" in r.stderr
    assert temporaries(tmp_path) == []

    back = run(ix, s3, tmp_path, "tarcat", f"{prefix}-{{000000..000002}}.tar")
    assert back.returncode == 0, back.stderr
    assert back.stderr == b""
    local = ix.run(ix.tarcat, shards.paths)
    assert back.stdout == local.stdout_bytes  # identical samples, and identical bytes
    assert ix.samples_of_bytes(back.stdout, tmp_path) == shards.expected

    # the manifest describes the objects as stored
    for rec in map(json.loads, (tmp_path / "m.jsonl").read_text().splitlines()):
        key = rec["shard"].split(f"s3://{s3.bucket}/", 1)[1]
        body = s3.get(key)
        assert rec["bytes"] == len(body)
        assert rec["sha256"] == hashlib.sha256(body).hexdigest()


def test_prefix_and_compression_on_s3(ix, s3, shards, tmp_path):
    r = run(ix, s3, tmp_path, "tarsplit", "-n", "12", "-o", f"s3://{s3.bucket}/val/part-%03d.tar.gz", *shards.paths)
    assert r.returncode == 0, r.stderr
    assert s3.keys() == ["val/part-000.tar.gz"]
    assert s3.get("val/part-000.tar.gz")[:2] == b"\x1f\x8b"
    back = run(ix, s3, tmp_path, "tarcat", f"s3://{s3.bucket}/val/part-000.tar.gz")
    assert back.returncode == 0, back.stderr
    assert ix.samples_of_bytes(back.stdout, tmp_path) == shards.expected


def test_tarcat_output_to_s3(ix, s3, shards, tmp_path):
    url = f"s3://{s3.bucket}/all.tar"
    r = run(ix, s3, tmp_path, "tarcat", "-o", url, "--rekey", "%05d", *shards.paths)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b""
    body = s3.get("all.tar")
    assert [k for k, _ in ix.samples_of_bytes(body, tmp_path)] == [f"{i:05d}" for i in range(12)]
    assert temporaries(tmp_path) == []


def test_failing_tarsplit_leaves_no_object_for_the_failed_shard(ix, s3, shards, tmp_path):
    data = open(shards.paths[2], "rb").read()
    broken = tmp_path / "broken.tar"
    broken.write_bytes(data[:3000])  # breaks inside its first sample
    r = run(ix, s3, tmp_path, "tarsplit", "-n", "3", "-o", f"s3://{s3.bucket}/t", shards.paths[0], shards.paths[1],
            broken)
    assert r.returncode == 1
    err = r.stderr.decode().strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tarsplit: error: ") and str(broken) in err[0]
    # 8 good samples -> two finished shards of 3; the third (being written at the failure) is not uploaded
    assert s3.keys() == ["t-000000.tar", "t-000001.tar"]
    got = ix.samples_of_bytes(s3.get("t-000000.tar"), tmp_path) + ix.samples_of_bytes(s3.get("t-000001.tar"), tmp_path)
    assert got == shards.expected[:6]
    assert temporaries(tmp_path) == []  # the local upload temporaries are gone too


def test_failing_tarcat_uploads_nothing(ix, s3, shards, tmp_path):
    broken = tmp_path / "broken.tar"
    broken.write_bytes(open(shards.paths[1], "rb").read()[:7000])
    r = run(ix, s3, tmp_path, "tarcat", "-o", f"s3://{s3.bucket}/all.tar", shards.paths[0], broken)
    assert r.returncode == 1
    assert s3.keys() == []
    assert temporaries(tmp_path) == []


def test_missing_object(ix, s3, tmp_path):
    url = f"s3://{s3.bucket}/nope-000000.tar"
    r = run(ix, s3, tmp_path, "tarcat", url)
    assert r.returncode == 1
    err = r.stderr.decode().strip()
    assert err.startswith("tarcat: error: ") and url in err and "\n" not in err


def test_missing_bucket_for_output(ix, s3, shards, tmp_path):
    url = f"s3://no-such-bucket-{s3.bucket}/x.tar"
    r = run(ix, s3, tmp_path, "tarcat", "-o", url, shards.paths[0])
    assert r.returncode == 1
    err = r.stderr.decode().strip()
    assert err.startswith("tarcat: error: ") and url in err and "\n" not in err
    assert temporaries(tmp_path) == []


def test_stdin_to_s3_shards(ix, s3, shards, tmp_path):
    data = ix.run(ix.tarcat, shards.paths).stdout_bytes
    r = run(ix, s3, tmp_path, "tarsplit", "-n", 4, "-o", f"s3://{s3.bucket}/in/x", input=data)
    assert r.returncode == 0, r.stderr
    assert s3.keys("in/") == [f"in/x-{i:06d}.tar" for i in range(3)]
