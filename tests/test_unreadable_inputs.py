"""Input files that cannot be opened, decompressed or decoded: one line naming the path."""

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

from genrec.data.readers import lcrec, recbole
from genrec.data.readers.common import DataError

ROOT = Path(__file__).parents[1]
INTER = "user_id:token\titem_id:token\ttimestamp:float\n1\t10\t100\n2\t11\t90\n"


def not_gzip(path: Path) -> None:
    path.write_text(INTER)  # named .gz, plain text inside


def truncated_gzip(path: Path) -> None:
    data = gzip.compress(INTER.encode() * 50)
    path.write_bytes(data[: len(data) // 2])


def corrupt_gzip(path: Path) -> None:
    data = bytearray(gzip.compress(INTER.encode() * 50))
    data[len(data) // 2: len(data) // 2 + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))


CASES = [  # (file name, how it is made, what the line says after the path)
    ("tiny.inter.gz", not_gzip, "bad gzip file (Not a gzipped file"),
    ("tiny.inter.gz", truncated_gzip, "bad gzip file (Compressed file ended"),
    ("tiny.inter.gz", corrupt_gzip, "bad gzip file ("),
    ("tiny.inter", lambda p: p.write_bytes(INTER.encode() + b"3\t\xe9t\xe9\t80\n"), "not UTF-8 text"),
    ("tiny.inter.gz", lambda p: p.write_bytes(gzip.compress(INTER.encode() + b"3\t\xff\t80\n")), "not UTF-8 text"),
    ("tiny.inter", lambda p: p.mkdir(), "is a directory, not a file"),
]


@pytest.mark.parametrize("name,make,says", CASES, ids=["not-gzip", "truncated-gz", "corrupt-gz", "latin1", "latin1-gz",
                                                       "directory"])
def test_unreadable_file_is_one_line_naming_it(tmp_path, name, make, says):
    make(tmp_path / name)
    with pytest.raises(DataError) as e:
        recbole.read(str(tmp_path), "tiny")
    assert str(e.value).startswith(f"{tmp_path / name}: {says}") and "\n" not in str(e.value)


def test_json_reader_bad_utf8_names_the_file(tmp_path):
    (tmp_path / "Tiny.inter.json").write_bytes(b'{"0": ["caf\xe9"]}')
    with pytest.raises(DataError, match=f"^{tmp_path / 'Tiny.inter.json'}: not UTF-8 text"):
        lcrec.read(str(tmp_path), "Tiny")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_permission_denied_names_the_file(tmp_path):
    path = tmp_path / "tiny.inter"
    path.write_text(INTER)
    path.chmod(0)
    with pytest.raises(DataError, match=f"^{path}: cannot read \\(Permission denied\\)"):
        recbole.read(str(tmp_path), "tiny")


def test_cli_corrupt_gz_is_one_line(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    not_gzip(raw / "tiny.inter.gz")
    out = subprocess.run([sys.executable, "-m", "genrec.prepare", "dataset=ml100k", f"dataset.reader.root={raw}",
                          "dataset.reader.name=tiny", "embedder=random", f"data_dir={tmp_path}/data"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert out.stderr == f"error: {raw / 'tiny.inter.gz'}: bad gzip file (Not a gzipped file (b'us'))\n"
