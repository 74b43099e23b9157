"""BIG-bench JSON tasks (`benchmark_tasks/<name>/task.json`) from the `bigbench==1.0.0` sdist on the
package index, fetched into the cache one task at a time. pip cannot download this sdist (its metadata
declares a direct-URL dependency, which pip refuses), so the archive is streamed from the index and only
the requested task files are kept. The tasks carry BIG-bench's canary: evaluate on them, never train."""
from __future__ import annotations

import os
import pathlib
import re
import tarfile
import urllib.request

from jaxlm.corpora.download import FetchError, cache_dir, write_atomic

SDIST = "bigbench-1.0.0.tar.gz"
TASKS = "bigbench-1.0.0/bigbench/benchmark_tasks"


def index_url() -> str:
    return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def sdist_url() -> str:
    page = f"{index_url()}/bigbench/"
    try:
        html = urllib.request.urlopen(page, timeout=60).read().decode("utf-8", "replace")
    except OSError as err:
        raise FetchError(f"could not read {page} ({err}): check network access to the package index") from None
    for link in re.findall(r'href="([^"]+)"', html):
        if link.split("#")[0].endswith("/" + SDIST):
            return urllib.request.urljoin(page, link.split("#")[0])
    raise FetchError(f"{page} lists no {SDIST}")


def task_path(name: str) -> pathlib.Path:
    return cache_dir() / "bigbench" / name / "task.json"


def bigbench_tasks(*names: str) -> dict[str, pathlib.Path]:
    """name -> cached task.json of each named BIG-bench task, streaming the sdist once for those missing."""
    missing = {f"{TASKS}/{n}/task.json": n for n in names if not task_path(n).is_file()}
    if missing:
        with urllib.request.urlopen(sdist_url(), timeout=600) as response, \
                tarfile.open(fileobj=response, mode="r|gz") as archive:
            for member in archive:
                if member.name in missing:
                    text = archive.extractfile(member).read().decode("utf-8")
                    write_atomic(task_path(missing.pop(member.name)), text)
                    if not missing:
                        break
        if missing:
            raise FetchError(f"{SDIST} has no task {', '.join(missing.values())}")
    return {n: task_path(n) for n in names}


def bigbench_task(name: str) -> pathlib.Path:
    return bigbench_tasks(name)[name]
