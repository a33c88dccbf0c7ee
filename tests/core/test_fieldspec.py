"""The one field-spec grammar (tarproc.fieldspec), every consumer parsing through it, the deprecated
tarcat rename, and the one list of media extensions."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from tarhelpers import run, samples, tarfile_shard, write_tar

import tarproc
from tarproc import fieldspec
from tarproc.cli.tar2tsv import main as tar2tsv
from tarproc.cli.tarcat import main as tarcat
from tarproc.cli.tardecode import main as tardecode
from tarproc.cli.tarfirst import main as tarfirst
from tarproc.dataset.fields import parse_decoding, parse_selection
from tarproc.decode.stage import DEFAULT_FIELDS, parse_field_list
from tarproc.errors import OptionError
from tarproc.fieldspec import TAKE_ALL, Accepts, Alternative, FieldSpec, parse_spec, parse_specs
from tarproc.first import IMAGE_FIELDS, make_matcher, parse_alternatives
from tarproc.stages import parse_fields
from tarproc.tables import parse_columns

PACKAGE = Path(tarproc.__file__).parent

# -------------------------------------------------------------------------------------------
# the grammar


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("jpg", ["jpg"]),
        ("jpg;png", ["jpg;png"]),
        ("jpg,png", ["jpg;png"]),  # ',' is ';'
        ("image=jpg;jpeg;png cls", ["image=jpg;jpeg;png", "cls"]),
        ("  img = JPG ; png \t cls ", ["img=jpg;png", "cls"]),  # spaces around separators, case
        ("seg.png json.Label meta.json.boxes.0", ["seg.png", "json.Label", "meta.json.boxes.0"]),
        ("jpg;png:size __key__ __url__", ["jpg:size;png:size", "__key__", "__url__"]),
        ("a=jpg:sha256;png:type", ["a=jpg:sha256;png:type"]),
    ],
)
def test_good_specs(text, want):
    assert [str(s) for s in parse_specs(text, TAKE_ALL)] == want


def test_value_objects():
    image, path = parse_specs("image=jpg;PNG:size json.label", TAKE_ALL)
    assert image == FieldSpec("image", (Alternative("jpg", (), "size"), Alternative("png", (), "size")), renamed=True)
    assert image.fields == ("jpg", "png")
    assert path == FieldSpec("json.label", (Alternative("json", ("label",)),))
    assert parse_spec("x.json").alternatives == (Alternative("x.json"),)  # a dotted name, not a path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty field spec ''; a field spec needs at least one field"),
        ("   ", "empty field spec '   '; a field spec needs at least one field"),
        ("a=", "bad field spec 'a=': no field after 'a'"),
        ("=b", "bad field spec '=b': no name before '='"),
        ("a=b=c", "bad field spec 'a=b=c': two '='"),
        ("a;;b", "bad field spec 'a;;b': an empty alternative"),
        ("jpg;", "bad field spec 'jpg;': an empty alternative"),
        ("jpg:bogus", "bad field spec 'jpg:bogus': unknown modifier 'bogus'; use one of size, sha256, type"),
        ("__key__:size", "bad field spec '__key__:size': __key__ takes no modifier"),
        ("json.a:size", "bad field spec 'json.a:size': a JSON path takes no modifier"),
        ("x..y", "bad field spec 'x..y': an empty component in 'x..y'"),
        ("a/b", "bad field spec 'a/b': 'a/b' is not a field name (no '/' in field names)"),
        ("__x__", "bad field spec '__x__': '__x__' is not a field (a field spec takes only __key__ and __url__)"),
        ("cls cls", "bad field spec 'cls cls': 'cls' is named twice; rename one with NAME=FIELD"),
    ],
)
def test_bad_specs_name_the_bad_part(text, message):
    with pytest.raises(OptionError) as e:
        parse_specs(text, TAKE_ALL)
    assert str(e.value) == message
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("accepts", "text", "message"),
    [
        (Accepts("tarcat -f", rename=True), "jpg:size", "tarcat -f takes no modifier (':size')"),
        (Accepts("tarcat -f", rename=True), "img:jpg", "tarcat -f takes no modifier (':jpg') (to rename, write NAME=FIELD)"),
        (Accepts("the decode field"), "img=jpg", "the decode field takes no NAME= (it names nothing)"),
        (Accepts("x", several=False), "jpg png", "x takes one spec; join alternatives with ';'"),
        (Accepts("x", meta=frozenset()), "__key__", "'__key__' is not a field (x takes no __names__)"),
    ],
)
def test_each_consumer_refuses_what_it_does_not_take(accepts, text, message):
    with pytest.raises(OptionError, match=re.escape(message)):
        parse_specs(text, accepts)


def test_a_path_is_a_dotted_name_where_paths_are_not_taken():
    assert parse_spec("json.label", Accepts("x")).alternatives == (Alternative("json.label"),)


# -------------------------------------------------------------------------------------------
# every consumer parses through it: its errors are the grammar's


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (parse_fields, "x:", "bad field spec 'x:': no field after 'x'"),
        (parse_fields, ";", "bad field spec ';': no field"),
        (parse_columns, "img=jpg;;png", "bad field spec 'img=jpg;;png': an empty alternative"),
        (parse_columns, "jpg:bogus", "unknown modifier 'bogus'"),
        (lambda t: make_matcher(fields=t), "img=jpg", "tarfirst -f takes no NAME="),
        (parse_alternatives, "jpg:size", "tarfirst -f takes no modifier"),
        (parse_field_list, "img=jpg", "the decode field takes no NAME="),
        (parse_field_list, ";", "bad field list ';': no field"),
        (lambda t: parse_decoding(None, image=t), "jpg:size", "the decode field takes no modifier"),
        (lambda t: parse_selection([t]), "img=jpg", "a to_tuple column takes no NAME="),
        (lambda t: parse_selection([t]), ";,", "bad field spec ';,': no field"),
    ],
)
def test_consumers_parse_through_the_grammar(parse, text, message):
    with pytest.raises(OptionError, match=re.escape(message)):
        parse(text)


def test_consumers_read_the_same_spec_alike():
    text = "JPG ; jpeg,png"
    assert parse_fields(text) == [("jpg", ["jpg", "jpeg", "png"])]
    assert [a.field for a in parse_columns(text.replace(",", ";"))[0].alternatives] == ["jpg", "jpeg", "png"]
    assert parse_alternatives(text) == ("jpg", "jpeg", "png")
    assert parse_field_list(text) == ["jpg", "jpeg", "png"]
    assert parse_selection([text]) == [["jpg", "jpeg", "png"]]
    assert parse_selection(["__valid__", "wav.lengths"]) == [["__valid__"], ["wav.lengths"]]


def error_line(result, prog):
    """The one ``PROG: error: ...`` line of a failed run (click adds a usage hint below it)."""
    (line,) = [line for line in result.stderr.splitlines() if line.startswith(f"{prog}: error: ")]
    assert "Traceback" not in result.stderr
    return line


@pytest.fixture
def shard(tmp_path):
    return str(write_tar(tmp_path / "a.tar", [
        {"__key__": "k0", "png": b"P0", "cls": b"0", "json": b'{"label": "cat"}'},
        {"__key__": "k1", "jpg": b"J1", "cls": b"1", "json": b'{"label": "dog"}'},
    ]))


def test_tarcat_renames_with_the_grammar_and_no_warning(shard):
    r = run(tarcat, ["-f", "image=jpg;png cls", shard])
    assert r.exit_code == 0, r.stderr
    assert r.stderr == ""
    assert samples(r.stdout_bytes) == [("k0", {"image": b"P0", "cls": b"0"}), ("k1", {"image": b"J1", "cls": b"1"})]


def test_tarcat_old_rename_still_works_with_one_warning_line(shard):
    old = run(tarcat, ["-f", "image:jpg,png cls", shard])
    new = run(tarcat, ["-f", "image=jpg;png cls", shard])
    assert old.exit_code == 0, old.stderr
    assert old.stdout_bytes == new.stdout_bytes
    assert old.stderr == ("tarcat: warning: -f 'image:...' renames in the old spelling, which goes away in the "
                          "next release; write 'image=jpg;png cls'\n")


def test_tarcat_refuses_a_bad_spec_in_one_line(shard):
    r = run(tarcat, ["-f", "a=b=c", shard])
    assert r.exit_code == 2
    assert error_line(r, "tarcat") == "tarcat: error: bad field spec 'a=b=c': two '='"


def test_tar2tsv_takes_the_whole_grammar(shard):
    r = run(tar2tsv, [shard, "-f", "__key__ img=jpg;png:size json.label"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines() == ["__key__\timg\tjson.label", "k0\t2\tcat", "k1\t2\tdog"]


def test_tarfirst_takes_alternatives(shard):
    r = run(tarfirst, [shard, "-f", "jpg; png"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes == b"P0"
    r = run(tarfirst, [shard, "-f", "img=jpg"])
    assert r.exit_code == 2
    assert error_line(r, "tarfirst") == "tarfirst: error: bad field list 'img=jpg': tarfirst -f takes no NAME= (it names nothing)"


def test_tardecode_field_goes_through_the_grammar(shard):
    r = run(tardecode, [shard, "--field", "img=jpg", "--size", "8"])
    assert r.exit_code == 2
    assert error_line(r, "tardecode") == ("tardecode: error: bad field list 'img=jpg': the decode field takes no NAME= "
                                          "(it names nothing)")


def test_dataset_image_and_to_tuple_go_through_the_grammar(shard):
    with pytest.raises(OptionError, match=re.escape("a to_tuple column takes no NAME=")):
        tarproc.Dataset(shard, to_tuple=("img=jpg", "cls"))
    with pytest.raises(OptionError, match=re.escape("the decode field takes no modifier")):
        tarproc.Dataset(shard, image="jpg:size")
    with pytest.raises(OptionError, match="give a sequence of columns"):
        tarproc.Dataset(shard, to_tuple="jpg")


def test_every_field_spec_option_uses_the_one_help_text():
    from tarproc.cli.tarserve import main as tarserve
    from tarproc.cli.tarshow import main as tarshow

    options = [(tarcat, "fields"), (tarshow, "fields"), (tar2tsv, "spec"), (tarfirst, "fields"),
               (tardecode, "field"), (tarserve, "field")]
    for command, name in options:
        (option,) = [p for p in command.params if p.name == name]
        assert fieldspec.SPEC_HELP in (option.help or ""), command.name


# -------------------------------------------------------------------------------------------
# one list of media extensions


def test_the_lists_derive_from_the_one_list():
    assert IMAGE_FIELDS is fieldspec.FIRST_IMAGE_EXTENSIONS
    assert IMAGE_FIELDS[:4] == ("jpg", "jpeg", "png", "webp")
    assert set(fieldspec.FIRST_IMAGE_EXTENSIONS) <= set(fieldspec.IMAGE_EXTENSIONS)
    assert set(fieldspec.CLASS_DIR_IMAGE_EXTENSIONS) <= set(fieldspec.IMAGE_EXTENSIONS)
    assert DEFAULT_FIELDS == fieldspec.DEFAULT_IMAGE_SPEC == "jpg;jpeg;png;webp"  # what the decoders read
    assert set(fieldspec.DECODABLE_IMAGE_EXTENSIONS) <= set(fieldspec.IMAGE_EXTENSIONS)
    assert not (set(fieldspec.IMAGE_EXTENSIONS) & (fieldspec.AUDIO_EXTENSIONS | fieldspec.VIDEO_EXTENSIONS))
    from tarproc import sniff, tables

    assert sniff.AUDIO_EXTENSIONS is fieldspec.AUDIO_EXTENSIONS
    assert tables.IMAGE_SUFFIXES == set(fieldspec.CLASS_DIR_IMAGE_EXTENSIONS)


def _image_extension_lists(tree: ast.AST) -> list[int]:
    """Lines of literal lists, tuples, sets or dict keys of image extensions (with ``jpg`` and two
    more), and of spec strings like ``"jpg;jpeg;png"``."""
    images = set(fieldspec.IMAGE_EXTENSIONS)
    found = []
    for node in ast.walk(tree):
        words: list[str] = []
        if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
            elements = node.keys if isinstance(node, ast.Dict) else node.elts
            words = [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"\w+([;,]\w+)+", node.value):
            words = re.split("[;,]", node.value)
        if "jpg" in words and len(images.intersection(words)) >= 3:
            found.append(node.lineno)
    return found


def test_the_scan_finds_a_list():
    assert _image_extension_lists(ast.parse('X = ("jpg", "jpeg", "png")\nY = {"jpg", "gif", "bmp"}')) == [1, 2]
    assert _image_extension_lists(ast.parse('f(field="jpg;jpeg;png;webp")')) == [1]
    assert _image_extension_lists(ast.parse('X = {"jpg": "jpeg", "png": "png", "tif": "tiff"}')) == [1]
    assert _image_extension_lists(ast.parse('X = ("jpeg", "png", "gif")  # format names, not extensions')) == []


def test_no_other_module_lists_image_extensions():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "fieldspec.py" and path.parent == PACKAGE:
            continue
        for line in _image_extension_lists(ast.parse(path.read_text(encoding="utf-8"))):
            offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    assert offenders == [], "image extensions belong in tarproc/fieldspec.py: " + ", ".join(offenders)


def test_tarshow_takes_what_tarcat_takes_and_names_itself(shard):
    from tarproc.cli.tarshow import main as tarshow

    r = run(tarshow, [shard, "-f", "cls img:jpg;png", "-c", "1"])
    assert r.exit_code == 0, r.stderr
    assert r.stderr.startswith("tarshow: warning: -f 'img:...' renames in the old spelling")
    r = run(tarshow, [shard, "-f", "img=jpg:size"])
    assert error_line(r, "tarshow") == ("tarshow: error: bad field spec 'img=jpg:size': tarshow -f takes no modifier "
                                        "(':size')")


# -------------------------------------------------------------------------------------------
# what the consumers did before the one grammar, they still do (issue 34: no behaviour changed)


def test_the_commands_defaults_are_their_old_image_lists():
    # subsets of the one list, in the order tarfirst always tried them
    assert fieldspec.FIRST_IMAGE_EXTENSIONS == ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff", "ppm",
                                                "pgm", "pbm", "pnm", "jp2", "avif")
    from tarproc import tables

    assert tables.IMAGE_SUFFIXES == frozenset({"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff"})


def test_tarfirst_default_still_skips_a_heic_for_a_jpg(tmp_path):
    shard = write_tar(tmp_path / "heic.tar", [{"__key__": "s1", "heic": b"H"}, {"__key__": "s2", "jpg": b"J"}])
    r = run(tarfirst, [shard])
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes == b"J"


def test_classes_from_dirs_takes_the_old_image_suffixes(tmp_path):
    from tarproc.cli.tarcreate import main as tarcreate

    for name in ("cat/a.jpg", "dog/b.ppm", "dog/c.heic"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    r = run(tarcreate, ["--classes-from-dirs", tmp_path, "--no-shuffle"])
    assert r.exit_code == 0, r.stderr
    assert samples(r.stdout_bytes) == [("cat/a", {"cls": b"0", "jpg": b"x"})]


@pytest.mark.parametrize("command", ["tarcat", "tarshow"])
def test_an_old_rename_of_a_field_named_like_a_modifier(tmp_path, command):
    from tarproc.cli.tarshow import main as tarshow

    shard = str(write_tar(tmp_path / "a.tar", [{"__key__": "k", "type": b"T", "size": b"S", "cls": b"1"}]))
    assert parse_fields("x:type y:size,cls") == [("x", ["type"]), ("y", ["size", "cls"])]
    if command == "tarcat":
        r = run(tarcat, ["-f", "x:type", shard])
        assert r.exit_code == 0, r.stderr
        assert samples(r.stdout_bytes) == [("k", {"x": b"T"})]
        assert r.stderr == ("tarcat: warning: -f 'x:...' renames in the old spelling, which goes away in the next "
                            "release; write 'x=type'\n")
    else:
        r = run(tarshow, [shard, "-f", "x:sha256", "-c", "1"])
        assert r.exit_code == 0, r.stderr
        assert r.stderr.startswith("tarshow: warning: -f 'x:...' renames in the old spelling")


@pytest.mark.parametrize("text", ["jpg;png;", "jpg,png,", "jpg;;png", ";jpg;png", " jpg ; ; png "])
def test_empty_alternatives_are_left_out_as_before(text):
    assert parse_fields(text) == [("jpg", ["jpg", "png"])]
    assert parse_alternatives(text) == ("jpg", "png")
    assert parse_field_list(text) == ["jpg", "png"]
    assert parse_selection([text]) == [["jpg", "png"]]
    assert parse_fields(f"img:{text}") == [("img", ["jpg", "png"])]


@pytest.mark.parametrize(("command", "args"), [
    ("tarcat", ["-f", "jpg;png;"]),
    ("tarshow", ["-f", "jpg,png,", "-c", "1"]),
    ("tarfirst", ["-f", "png;"]),
    ("tardecode", ["--field", "jpg;", "--size", "8", "--device", "cpu"]),
])
def test_commands_leave_out_empty_alternatives(shard, command, args):
    from tarproc.cli.tarshow import main as tarshow

    main = {"tarcat": tarcat, "tarshow": tarshow, "tarfirst": tarfirst, "tardecode": tardecode}[command]
    r = run(main, [shard, *args] if command != "tarcat" else [*args, shard])
    # (tardecode then fails on the shard's images, which are not images: not on its --field)
    assert r.exit_code != 2 and "bad field" not in r.stderr, r.stderr


def test_a_dataset_leaves_out_empty_alternatives(shard):
    got = [(bytes(image[0]), int(cls[0]))
           for image, cls in tarproc.Dataset(shard, to_tuple=("jpg;png;", "cls;"), batch_size=1)]
    assert got == [(b"P0", 0), (b"J1", 1)]


def test_tar2tsv_reads_its_columns_as_before(tmp_path):
    shard = write_tar(tmp_path / "a.tar", [{"__key__": "k", "a,b": b"AB", "a": b"A"}])
    r = run(tar2tsv, [shard, "-f", "__key__ a,b"])  # ',' is part of the field name in tar2tsv
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines() == ["__key__\ta,b", "k\tAB"]
    assert parse_columns("a , b") == list(parse_specs("a , b", Accepts("x", commas=False)))
    assert [c.name for c in parse_columns("a , b")] == ["a", ",", "b"]
    for text in ("jpg;", "jpg;;png", ";"):  # refused before, refused still
        with pytest.raises(OptionError, match="an empty alternative"):
            parse_columns(text)


def test_a_space_inside_a_to_tuple_column_or_decode_field_is_part_of_a_name(tmp_path):
    assert parse_selection(["a b", " c d ; e "]) == [["a b"], ["c d", "e"]]
    assert parse_field_list("my jpg;png") == ["my jpg", "png"]
    shard = tarfile_shard(tmp_path / "s.tar", [("k.a b", b"x")])
    got = [bytes(column[0]) for (column,) in tarproc.Dataset(str(shard), to_tuple=("a b",), batch_size=1)]
    assert got == [b"x"]
