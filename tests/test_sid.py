"""Semantic-ID tokenizers: RQ-K-means (faiss), precomputed index files, disambiguation."""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from genrec.data.readers.common import DataError
from genrec.sid.tokenizers import Precomputed, RQKMeans, collisions, disambiguate

OFFICE = Path(__file__).resolve().parents[2] / "shared" / "data" / "apao-office"  # ../shared beside the repo


def ranks_reference(codes):
    """Per item: how many earlier items share its code tuple (explicit loop)."""
    seen, out = {}, []
    for row in map(tuple, codes):
        out.append(seen.get(row, 0))
        seen[row] = seen.get(row, 0) + 1
    return out


def parse_reference(tokens):
    """"<a_12>" -> 12, by plain string operations."""
    return [int(t[1:-1].split("_")[1]) for t in tokens]


# ---------------------------------------------------------------- disambiguation


@pytest.mark.parametrize("seed", range(4))
def test_disambiguate_matches_explicit_ranks(seed):
    rng = np.random.default_rng(seed)
    codes = rng.integers(3, size=(60, 2))  # 9 possible tuples for 60 items: many collisions
    out = disambiguate(codes)
    assert out.shape == (60, 3)
    assert (out[:, :2] == codes).all()
    assert out[:, 2].tolist() == ranks_reference(codes)
    assert len({tuple(r) for r in out}) == 60
    groups = {}
    for row in map(tuple, codes):
        groups[row] = groups.get(row, 0) + 1
    assert collisions(codes) == {"unique_codes_before": len(groups), "max_collision_before": max(groups.values())}


# ---------------------------------------------------------------- RQ-K-means


def clustered(n=240, dim=16, k=8, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, dim)) * 4
    emb = centres[rng.integers(k, size=n)] + rng.normal(size=(n, dim)) * 0.5
    return with_duplicates(emb)


def with_duplicates(emb):
    """Items 1 and 2 get item 0's embedding: they must collide and be disambiguated."""
    emb = emb.astype(np.float32)
    emb[1] = emb[2] = emb[0]
    return emb


@pytest.mark.parametrize("data", ["clustered", "random"])
def test_rqkmeans_unique_codes_and_falling_error(data):
    emb = clustered() if data == "clustered" else with_duplicates(np.random.default_rng(1).normal(size=(240, 16)))
    ids = [str(i) for i in range(len(emb))]
    tok = RQKMeans(levels=3, codebook_size=8, iters=10, seed=3)
    sids = tok(emb, ids)
    assert sids.codes.shape == (240, 4)  # T = levels + 1
    assert len({tuple(r) for r in sids.codes}) == 240
    assert sids.sizes[:3] == [8, 8, 8] and sids.sizes[3] == sids.codes[:, 3].max() + 1
    assert ((sids.codes[:, :3] >= 0) & (sids.codes[:, :3] < 8)).all()
    # the duplicated embeddings share levels 1-3 and differ only in the extra token
    assert (sids.codes[0, :3] == sids.codes[1, :3]).all() and (sids.codes[0, :3] == sids.codes[2, :3]).all()
    assert sorted(sids.codes[[0, 1, 2], 3].tolist()) == [0, 1, 2]
    # the extra token is the rank among items with the same first three codes
    assert sids.codes[:, 3].tolist() == ranks_reference(sids.codes[:, :3])
    assert tok.facts["unique_codes_before"] == len({tuple(r) for r in sids.codes[:, :3]}) < 240
    # reconstruction error: below the zero-codebook error, and falling with each level
    err = [float((emb.astype(np.float64) ** 2).sum(1).mean())] + tok.errors
    assert len(tok.errors) == 3
    assert all(b < a for a, b in zip(err, err[1:])), err
    assert tok.facts["reconstruction_error"] == tok.errors


def test_rqkmeans_reproducible_with_seed():
    emb = clustered(seed=5)
    ids = [str(i) for i in range(len(emb))]
    a = RQKMeans(levels=3, codebook_size=8, iters=10, seed=11)(emb, ids)
    b = RQKMeans(levels=3, codebook_size=8, iters=10, seed=11)(emb, ids)
    assert np.array_equal(a.codes, b.codes)


def test_rqkmeans_without_disambiguation_keeps_collisions():
    emb = clustered()
    sids = RQKMeans(levels=2, codebook_size=4, iters=5, seed=0, disambiguate=False)(emb, [str(i) for i in range(240)])
    assert sids.codes.shape == (240, 2) and sids.sizes == [4, 4]
    assert sids.num_candidates == len({tuple(r) for r in sids.codes}) <= 16


def test_rqkmeans_codebook_larger_than_items_is_a_clear_error():
    emb = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    with pytest.raises(DataError, match=r"tokenizer\.codebook_size=16"):
        RQKMeans(levels=2, codebook_size=16)(emb, [str(i) for i in range(10)])


# ---------------------------------------------------------------- precomputed index files


INDEX = {
    "0": ["<a_1>", "<b_2>", "<c_0>"],
    "1": ["<a_3>", "<b_0>", "<c_1>"],
    "2": ["<a_1>", "<b_2>", "<c_0>"],  # collides with 0
    "3": ["<a_0>", "<b_0>", "<c_0>"],
    "4": ["<a_1>", "<b_2>", "<c_0>"],  # collides with 0 and 2
    "9": ["<a_5>", "<b_5>", "<c_5>"],  # not in the dataset: ignored
}
ITEMS = ["0", "1", "2", "3", "4"]


def write_index(path, index, gz=False):
    data = json.dumps(index).encode()
    if gz:
        with gzip.open(path.with_name(path.name + ".gz"), "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_precomputed_extra_token(tmp_path, gz):
    path = tmp_path / "D.index.json"
    write_index(path, INDEX, gz)
    tok = Precomputed(str(path))
    sids = tok(None, ITEMS)
    base = [parse_reference(INDEX[i]) for i in ITEMS]
    assert sids.codes[:, :3].tolist() == base
    assert sids.codes[:, 3].tolist() == ranks_reference(base) == [0, 0, 1, 0, 2]
    assert sids.sizes == [4, 3, 2, 3]  # max code + 1 per level (of the dataset's items)
    assert sids.num_candidates == 5
    assert tok.facts == {"unique_codes_before": 3, "max_collision_before": 3}


def test_precomputed_merge_and_no_collision(tmp_path):
    path = write_index(tmp_path / "D.index.json", INDEX)
    sids = Precomputed(str(path), collision="merge")(None, ITEMS)
    assert sids.codes.tolist() == [parse_reference(INDEX[i]) for i in ITEMS]
    assert sids.num_candidates == 3
    assert sids.item_to_cand[0] == sids.item_to_cand[2] == sids.item_to_cand[4] != sids.item_to_cand[1]
    # without collisions extra_token adds no level
    plain = Precomputed(str(path))(None, ["0", "1", "3"])
    assert plain.codes.shape == (3, 3)


@pytest.mark.parametrize("index, items, match", [
    (INDEX, ["0", "7"], r"no semantic ID for item '7'"),
    ({"0": ["<a_1>", "<b_x>"]}, ["0"], r"tokens must look like"),
    ({"0": ["<b_1>", "<a_2>"]}, ["0"], r"levels out of order"),
    ({"0": ["<a_1>", "<b_2>"], "1": ["<a_1>"], "2": ["<a_3>", "<b_1>"]}, ["0", "1", "2"],
     r"item '1' has 1 codes, item '0' 2 \(items have codes of different lengths\)"),
])
def test_precomputed_bad_index_names_the_file(tmp_path, index, items, match):
    path = write_index(tmp_path / "D.index.json", index)
    with pytest.raises(DataError, match=match) as e:
        Precomputed(str(path))(None, items)
    assert str(path) in str(e.value)


def test_precomputed_bad_policy():
    with pytest.raises(ValueError, match="collision"):
        Precomputed("x.json", collision="drop")


@pytest.mark.skipif(not OFFICE.exists(), reason="needs ../shared/data/apao-office")
def test_precomputed_office_release():
    path = OFFICE / "Office.index.rq-kmeans.json"
    index = json.loads(path.read_text())
    items = sorted(index, key=int)
    base = [parse_reference(index[i]) for i in items]
    sids = Precomputed(str(path))(None, items)
    assert sids.codes.shape == (2420, 5) and sids.num_levels == 5
    assert sids.num_candidates == 2420 == len({tuple(r) for r in sids.codes})
    assert sids.codes[:, :4].tolist() == base
    assert sids.codes[:, 4].tolist() == ranks_reference(base)
    merged = Precomputed(str(path), collision="merge")(None, items)
    assert merged.codes.shape == (2420, 4)
    assert merged.num_candidates == 2415 == len({tuple(r) for r in base})
