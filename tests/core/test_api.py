"""The Python API as a user meets it: ``help(tarproc.Dataset)`` documents every parameter, the read
policy and the network settings are objects that reach the readers, the old flat keywords still
work (one ``DeprecationWarning`` each call), and the warnings are the standard library's."""

from __future__ import annotations

import inspect
import logging
import os
import pydoc
import re
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path
from typing import Any

import pytest
from faultserver import FaultServer
from tarhelpers import run, tarfile_shard, write_tar

import tarproc
from tarproc import (
    CacheWarning,
    Dataset,
    DataWarning,
    Network,
    NetworkWarning,
    OptionError,
    TarprocWarning,
)
from tarproc.errors import DuplicateError, SourceError, TarFormatError
from tarproc.tar import ReadPolicy

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def shard(path: Path, n: int = 6, prefix: str = "k") -> str:
    write_tar(path, [{"__key__": f"{prefix}{i}", "cls": i} for i in range(n)])
    return str(path)


def keys(ds: Any) -> list[str]:
    return [k for batch in ds for k in batch[0]]


# ---------------------------------------------------------------------------------------------
# help() is enough


def documented(obj: Any) -> set[str]:
    """The names a docstring documents: the ``name:`` entries of its Args-like sections."""
    return set(re.findall(r"^\s{4,}(\w+): ", inspect.getdoc(obj) or "", re.MULTILINE))


def test_help_of_the_dataset_documents_every_parameter_of_its_signature() -> None:
    params = [name for name, p in inspect.signature(Dataset).parameters.items() if p.kind != p.VAR_KEYWORD]
    assert len(params) > 25
    missing = [name for name in params if name not in documented(Dataset)]
    assert missing == [], f"Dataset parameters without an entry in its docstring: {missing}"
    text = pydoc.render_doc(tarproc.Dataset)
    for section in ("Raises:", "Example:", "Deprecated keywords"):
        assert section in text
    for old in ("dup", "max_member_size", "cache_dir", "cache_size", "retries", "timeout", "prefetch"):
        assert f"``{old}``" in text  # the deprecated spellings are said, with their new place


def test_help_of_the_value_objects_documents_every_field() -> None:
    import dataclasses

    for cls in (ReadPolicy, Network):
        fields = [f.name for f in dataclasses.fields(cls)]
        missing = [name for name in fields if name not in documented(cls)]
        assert missing == [], f"{cls.__name__} fields without an entry in its docstring: {missing}"
    assert tarproc.Network is Network and tarproc.ReadPolicy is ReadPolicy


def test_the_loaders_public_methods_have_docstrings() -> None:
    from tarproc.dataset.loader import Loader

    public = [name for name, _ in inspect.getmembers(Loader) if not name.startswith("_") or name == "__len__"]
    assert {"state_dict", "load_state_dict", "workers"} <= set(public)
    assert [name for name in public if not inspect.getdoc(getattr(Loader, name))] == []
    assert "num_workers" in documented(Loader) and "dataset" in documented(Loader)


# ---------------------------------------------------------------------------------------------
# the objects reach the readers


def test_read_policy_reaches_the_reader(tmp_path: Path) -> None:
    path = tmp_path / "dup.tar"
    # a field twice in one sample: an error by default, the first kept with dup="skip"
    import io
    import tarfile

    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in (("a.cls", b"1"), ("a.cls", b"2"), ("b.cls", b"3")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with pytest.raises(DuplicateError):
        list(Dataset(str(path), to_tuple=("__key__", "cls"), tensors="numpy", lengths=None))
    got = list(Dataset(str(path), to_tuple=("__key__", "cls"), tensors="numpy", lengths=None,
                       read=ReadPolicy(dup="skip")))
    assert [list(b[0]) for b in got] == [["a", "b"]] and [int(c) for c in got[0][1]] == [1, 3]
    big = shard(tmp_path / "big.tar", 2)
    with pytest.raises(TarFormatError):
        list(Dataset(big, tensors="numpy", lengths=None, read=ReadPolicy(max_member_size=0)))



def test_the_counts_read_the_shards_as_the_policy_says(tmp_path: Path) -> None:
    # lengths="auto" counts a shard by reading it: with the readers' policy, so that the count is
    # what an epoch finds (two archives one after the other need ignore_zeros, as GNU tar -i)
    halves = []
    for j in range(2):
        part = tmp_path / f"part{j}.tar"
        write_tar(part, [{"__key__": f"k{j}{i}", "cls": i} for i in range(3)])
        halves.append(part.read_bytes())
    joined = tmp_path / "joined.tar"
    joined.write_bytes(b"".join(halves))
    with pytest.raises(TarFormatError, match="garbage after the end-of-archive"):
        Dataset(str(joined), to_tuple=("__key__",), tensors="numpy")
    ds = Dataset(str(joined), to_tuple=("__key__",), tensors="numpy", batch_size=4,
                 read=ReadPolicy(ignore_zeros=True))
    assert ds.lengths == {str(joined): 6} and len(ds) == 2
    assert [k for (keys,) in ds for k in keys] == ["k00", "k01", "k02", "k10", "k11", "k12"]

def test_read_policy_skip_shard_leaves_a_damaged_shard_with_a_data_warning(tmp_path: Path) -> None:
    good = shard(tmp_path / "good.tar", 6, "g")
    whole = Path(shard(tmp_path / "whole.tar", 6, "d")).read_bytes()
    damaged = tmp_path / "damaged.tar"
    damaged.write_bytes(whole[: 512 * 5 + 100])  # cut inside the third member's data
    urls = [good, str(damaged)]
    with pytest.raises(TarFormatError):
        list(Dataset(urls, batch_size=4, to_tuple=("__key__",), tensors="numpy", lengths=None))
    ds = Dataset(urls, batch_size=4, to_tuple=("__key__",), tensors="numpy", lengths=None,
                 read=ReadPolicy(on_error="skip-shard"))
    with pytest.warns(DataWarning, match="damaged.tar.*skipping the rest of this shard"):
        got = keys(ds)
    assert [k for k in got if k.startswith("g")] == [f"g{i}" for i in range(6)]
    assert ds.skipped_shards == 1 and ds.on_error == "fail"  # samples still fail; shards are skipped


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    www = tmp_path / "www"
    www.mkdir()
    write_tar(www / "s.tar", [{"__key__": f"k{i:03d}", "bin": os.urandom(3000)} for i in range(20)])
    with FaultServer(www) as server:
        yield server


def test_network_object_reaches_the_readers(served: Any) -> None:
    url = f"{served.url}/s.tar"
    size = os.path.getsize(served.root / "s.tar")
    served.cut("/s.tar", after=size // 2)
    ds = Dataset(url, batch_size=8, to_tuple=("__key__",), tensors="numpy", lengths=[20],
                 network=Network(retries=0, prefetch=0))
    with pytest.raises(SourceError, match="read failed at byte"):
        keys(ds)
    served.cut("/s.tar", after=size // 2)
    ds = Dataset(url, batch_size=8, to_tuple=("__key__",), tensors="numpy", lengths=[20],
                 network=Network(retries=1, prefetch=0, backoff=0.01))
    with pytest.warns(NetworkWarning, match=r"read failed at byte \d+ .*retry 1 of 1"):
        assert keys(ds) == [f"k{i:03d}" for i in range(20)]


# ---------------------------------------------------------------------------------------------
# the old flat keywords


OLD = [
    ({"dup": "skip"}, lambda ds: ds.read.dup == "skip"),
    ({"max_member_size": 1 << 20}, lambda ds: ds.read.max_member_size == 1 << 20),
    ({"retries": 7}, lambda ds: ds.network.retries == 7),
    ({"timeout": 12.5}, lambda ds: ds.network.timeout == 12.5),
    ({"prefetch": 1 << 20}, lambda ds: ds.network.prefetch == 1 << 20),
    ({"cache_dir": "CACHE"}, lambda ds: os.path.isdir(os.path.join(ds._test_cache, "counts"))),
    ({"cache_dir": "CACHE", "cache_size": 10**9}, lambda ds: True),
    ({"dup": "warn", "retries": 2, "cache_dir": "CACHE"},
     lambda ds: ds.read.dup == "warn" and ds.network.retries == 2),
]


@pytest.mark.parametrize(("old", "check"), OLD, ids=["+".join(o) for o, _ in OLD])
def test_each_old_keyword_works_with_exactly_one_deprecation_warning(tmp_path: Path, old: dict[str, Any],
                                                                     check: Any) -> None:
    path = shard(tmp_path / "s.tar")
    old = {k: (str(tmp_path / "cache") if v == "CACHE" else v) for k, v in old.items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = Dataset(path, batch_size=4, to_tuple=("__key__",), tensors="numpy", **old)
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(deprecations) == 1, [str(w.message) for w in caught]
    message = str(deprecations[0].message)
    assert deprecations[0].filename == __file__  # the user's line, not the library's
    assert "deprecated" in message and all(name in message for name in old)
    assert ("read=tarproc.ReadPolicy(" in message) == bool({"dup", "max_member_size"} & set(old))
    assert ("network=tarproc.Network(" in message) == bool(set(old) - {"dup", "max_member_size"})
    ds._test_cache = str(tmp_path / "cache")
    assert check(ds)
    assert len(keys(ds)) == 6


def test_an_object_and_its_old_keyword_together_are_an_option_error(tmp_path: Path) -> None:
    path = shard(tmp_path / "s.tar")
    with pytest.raises(OptionError, match=r"give dup inside read=\.\.\., not beside it"):
        Dataset(path, read=ReadPolicy(links="skip"), dup="warn")
    with pytest.raises(OptionError, match=r"give retries, timeout inside network=\.\.\., not beside it"):
        Dataset(path, network=Network(prefetch=0), retries=3, timeout=5)
    with pytest.raises(OptionError, match="bad read"):
        Dataset(path, read="skip")
    with pytest.raises(TypeError, match=r"Dataset has no parameter shufle \(did you mean shuffle"):
        Dataset(path, shufle=10)  # an OptionError that is a TypeError, as Python's own was
    # an old keyword of the other group goes with an object: one warning, no error
    with pytest.warns(DeprecationWarning, match="network=tarproc.Network"):
        ds = Dataset(path, read=ReadPolicy(dup="skip"), retries=3)
    assert ds.read.dup == "skip" and ds.network.retries == 3


# ---------------------------------------------------------------------------------------------
# warnings through the standard library


def test_the_warning_classes_are_exported_and_filterable_separately() -> None:
    for cls in (DataWarning, NetworkWarning, CacheWarning):
        assert issubclass(cls, TarprocWarning) and getattr(tarproc, cls.__name__) is cls
    assert issubclass(TarprocWarning, UserWarning)


def _bad_seven(sample: dict[str, Any]) -> dict[str, Any]:
    if sample["__key__"].endswith("3"):
        raise ValueError("no")
    return sample


def test_a_trainer_can_make_them_errors_or_silence_them_by_class(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    path = shard(tmp_path / "s.tar", 6)

    def dataset() -> Dataset:
        return Dataset(path, batch_size=2, to_tuple=("__key__",), tensors="numpy", map=_bad_seven, on_error="skip")

    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=DataWarning)
        with pytest.raises(DataWarning, match="skipped: .*map failed on sample 'k3'"):
            keys(dataset())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=DataWarning)
        assert len(keys(dataset())) == 5
    assert [w for w in caught if issubclass(w.category, TarprocWarning)] == []
    with warnings.catch_warnings(record=True) as caught:  # NetworkWarning ignored: DataWarning still comes
        warnings.filterwarnings("ignore", category=NetworkWarning)
        keys(dataset())
    assert [w.category for w in caught] == [DataWarning]
    # routed to logging, as a trainer that logs does
    with warnings.catch_warnings():
        logging.captureWarnings(True)
        try:
            with caplog.at_level(logging.WARNING, logger="py.warnings"):
                keys(dataset())
        finally:
            logging.captureWarnings(False)
    assert any("DataWarning: skipped:" in r.getMessage() for r in caplog.records)


def test_each_warning_is_shown_every_time_not_once_per_place(tmp_path: Path) -> None:
    from tarproc.errors import warn

    with warnings.catch_warnings(record=True) as caught:
        for _ in range(3):
            warn("the same words", NetworkWarning)
    assert len(caught) == 3


SCRIPT = """
import sys, torch, tarproc
from tarhelpers import write_tar
write_tar(sys.argv[1], [{"__key__": f"k{i}", "cls": i} for i in range(8)])
def bad(sample):
    if sample["__key__"] == "k3":
        raise ValueError("no")
    return sample
ds = tarproc.Dataset(sys.argv[1], batch_size=2, to_tuple=("__key__",), map=bad, on_error="skip")
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
print(sum(len(b[0]) for b in loader))
"""


def test_warnings_of_forked_dataloader_workers_show_on_stderr(tmp_path: Path) -> None:
    tests = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "s.tar")], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["7"]
    said = [line for line in r.stderr.splitlines() if "DataWarning: skipped:" in line]
    assert len(said) == 1 and "map failed on sample 'k3'" in said[0], r.stderr


def test_a_command_prints_each_warning_as_one_line_and_restores_the_settings(served: Any) -> None:
    from tarproc.cli.tarcat import main as tarcat_main

    size = os.path.getsize(served.root / "s.tar")
    served.cut("/s.tar", after=size // 2)
    before = (warnings.showwarning, list(warnings.filters))
    r = run(tarcat_main, ["--prefetch", "0", f"{served.url}/s.tar"])
    assert r.exit_code == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tarcat: warning: {served.url}/s.tar: read failed at byte ")
    assert (warnings.showwarning, list(warnings.filters)) == before


# ---------------------------------------------------------------------------------------------
# the receiver and malloc


def test_a_receiver_leaves_malloc_alone_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tarproc.transport import receiver as module

    tuned: list[bool] = []
    monkeypatch.setattr(module, "tune_malloc", lambda: tuned.append(True) or True)
    with module.Receiver(f"ipc://{tmp_path}/a", wait=0.01):
        pass
    assert tuned == []
    with module.Receiver(f"ipc://{tmp_path}/b", wait=0.01, reuse_memory=True):
        pass
    assert tuned == [True]


# crossings the grouping must not change (found by a review against the release before it)


def test_a_count_made_under_one_read_policy_is_not_taken_under_another(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TARPROC_CACHE_DIR", str(tmp_path / "cache"))
    # a.jpg, and b.jpg a hard link to it: links="skip" leaves b out, the default reads it
    hard = tarfile_shard(tmp_path / "hard.tar", [("a.jpg", b"x"), ("b.jpg", "->a.jpg")], link=tarfile.LNKTYPE)
    skipping = Dataset(str(hard), to_tuple=("__key__",), tensors="numpy", read=ReadPolicy(links="skip"))
    assert skipping.lengths == {str(hard): 1}
    following = Dataset(str(hard), to_tuple=("__key__",), tensors="numpy")  # the same counts' cache
    assert following.lengths == {str(hard): 2}
    assert [k for (keys,) in following for k in keys] == ["a", "b"]
    again = Dataset(str(hard), to_tuple=("__key__",), tensors="numpy", read=ReadPolicy(links="skip"))
    assert again.lengths == {str(hard): 1} and again.count_sources[str(hard)] == "counted (cache)"


def test_a_duplicate_let_pass_is_said_once_by_the_epoch_not_again_by_the_count(tmp_path: Path) -> None:
    path = tarfile_shard(tmp_path / "dup.tar", [("a.cls", b"1"), ("a.cls", b"2"), ("b.cls", b"3")])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ds = Dataset(str(path), to_tuple=("__key__",), tensors="numpy", read=ReadPolicy(dup="warn"))
        assert ds.lengths == {str(path): 2}
        assert [k for (keys,) in ds for k in keys] == ["a", "b"]
    said = [w for w in seen if issubclass(w.category, tarproc.TarprocWarning)]
    assert len(said) == 1 and "duplicate field 'cls' in sample 'a'" in str(said[0].message), said


def test_the_old_cache_keywords_on_local_shards_are_left_out_as_before(tmp_path: Path) -> None:
    path = shard(tmp_path / "local.tar", 3)
    with pytest.warns(DeprecationWarning, match="cache_size"):
        ds = Dataset(path, tensors="numpy", cache_size=1 << 20)
    assert ds.network.cache_dir is None and ds.network.cache_size is None and len(ds) == 1


def test_ignore_zeros_takes_the_flags_it_took_before_the_policy() -> None:
    import numpy as np

    assert ReadPolicy(ignore_zeros=1).ignore_zeros is True
    assert ReadPolicy(ignore_zeros=np.bool_(False)).ignore_zeros is False
    with pytest.raises(OptionError, match="bad ignore_zeros 'yes'"):
        ReadPolicy(ignore_zeros="yes")


def test_the_old_module_name_of_the_tar_core_still_imports_with_a_deprecation_warning() -> None:
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from tarproc.tario import FileRange, TarWriter, iter_members\n"
            "import tarproc.tar as t; assert FileRange is t.FileRange and TarWriter is t.TarWriter\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "DeprecationWarning: tarproc.tario is deprecated: import from tarproc.tar" in done.stderr
