"""The data stage: RecBole / LC-Rec readers, k-core, splits, item text, the artefact cache and
`genrec.prepare` (in-process via Hydra compose, concurrently, and as a command)."""

import gzip
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from genrec.data.preprocess import build_sequences, item_texts, kcore, leave_one_out, sliding_window
from genrec.data.readers import lcrec, recbole
from genrec.data.readers.common import DataError, RawData
from genrec.sid.codes import SemanticIds
from genrec.data.store import cached, config_hash
from genrec.prepare import prepare

REPO = Path(__file__).resolve().parents[1]
OFFICE = Path(__file__).resolve().parents[2] / "shared" / "data" / "apao-office"  # ../shared beside the repo


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    """Nothing a test does may land in the repo's data/."""
    monkeypatch.setenv("GENREC_DATA_DIR", str(tmp_path / "env-data"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "data"


def write(path: Path, text: str, gz: bool = False) -> Path:
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as f:
            f.write(text.encode())
    else:
        path.write_text(text)
    return path


# ---------------------------------------------------------------- RecBole atomic files

INTER = (
    "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    "1\t10\t4\t100\n"
    "2\t11\t3\t90\n"
    "1\t12\t5\n"  # line 4: a field short
    "\n"
    "2\t10\t2\tsoon\n"  # line 6: not a number
    "\t12\t1\t80\n"  # line 7: no user
    "3\t12\t1\t95.5\n"
)
ITEM = (
    "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
    "10\tToy Story\t1995\tAnimation Comedy\n"
    "11\tHeat\t1995\n"  # line 3: a field short
    "12\tAlien\t1979\tHorror Sci-Fi\n"
)


@pytest.mark.parametrize("gz", [False, True])
def test_recbole_reader(tmp_path, gz):
    inter = write(tmp_path / "tiny.inter", INTER, gz)
    item = write(tmp_path / "tiny.item", ITEM, gz)
    raw = recbole.read(str(tmp_path), "tiny")
    assert (raw.users, raw.items, raw.times) == (["1", "2", "3"], ["10", "11", "12"], [100.0, 90.0, 95.5])
    assert raw.meta == {"10": {"movie_title": "Toy Story", "release_year": "1995", "class": "Animation Comedy"},
                        "12": {"movie_title": "Alien", "release_year": "1979", "class": "Horror Sci-Fi"}}
    assert raw.report.bad == {str(inter): 3, str(item): 1}
    assert raw.report.examples == [f"{inter}:4: expected 4 tab-separated fields, got 3",
                                   f"{inter}:6: timestamp is not a number",
                                   f"{inter}:7: missing user_id or item_id",
                                   f"{item}:3: expected 4 tab-separated fields, got 3"]
    assert "skipped 4 bad records" in raw.report.summary()
    with pytest.raises(DataError, match=f"{inter}:4: .*dataset.strict=true"):
        recbole.read(str(tmp_path), "tiny", strict=True)


def test_recbole_reader_missing_file(tmp_path):
    with pytest.raises(DataError, match=f"missing data file {tmp_path / 'nope.inter'}"):
        recbole.read(str(tmp_path), "nope")


def test_recbole_embedded_ml100k_is_found():
    root = recbole.embedded_root()
    assert (root / "ml-100k.inter").exists() and (root / "ml-100k.item").exists()


# ---------------------------------------------------------------- LC-Rec / APAO json


@pytest.mark.parametrize("gz", [False, True])
def test_lcrec_reader(tmp_path, gz):
    inter = write(tmp_path / "Tiny.inter.json", json.dumps({"0": [0, 1, 2], "1": ["2", 3], "2": "oops"}), gz)
    write(tmp_path / "Tiny.item.json", json.dumps({
        "0": {"title": "Pen", "description": "", "brand": "Acme", "categories": "Office, Pens"},
        "3": {"title": "Tea", "brand": 7}, "4": "junk", "5": {"title": "Ink", "categories": ["Office", "Ink"]}}), gz)
    raw = lcrec.read(str(tmp_path), "Tiny")
    assert raw.users == ["0", "0", "0", "1", "1"]
    assert raw.items == ["0", "1", "2", "2", "3"]
    assert raw.times == [0.0, 1.0, 2.0, 0.0, 1.0]  # list position = time
    assert raw.meta == {"0": {"title": "Pen", "description": "", "brand": "Acme", "categories": "Office, Pens"},
                        "3": {"title": "Tea", "brand": "7"},
                        "5": {"title": "Ink", "categories": "Office, Ink"}}  # a list field: its items joined
    # a whole-file JSON has no line to name: the user's / item's key instead
    items = tmp_path / ("Tiny.item.json" + (".gz" if gz else ""))
    assert raw.report.total == 2 and raw.report.examples == [f"{inter}: user '2': item list expected",
                                                             f"{items}: item '4': metadata object expected"]
    with pytest.raises(DataError, match="dataset.strict=true"):
        lcrec.read(str(tmp_path), "Tiny", strict=True)
    write(tmp_path / "Tiny.inter.json", json.dumps({"0": [0, 1, 2]}), gz)  # inter.json clean: item.json's turn
    with pytest.raises(DataError, match=r"item '4': metadata object expected \(dataset.strict=true"):
        lcrec.read(str(tmp_path), "Tiny", strict=True)


def test_lcrec_reader_null_item_names_the_inter_file_and_user(tmp_path):
    """A null (or list, float, bool, empty) item is a bad record of the inter file, never an item 'None'."""
    inter = write(tmp_path / "Tiny.inter.json",
                  json.dumps({"0": [0, 1, 2], "1": [3, None, "4"], "2": [[5], 1.5, True, ""]}))
    raw = lcrec.read(str(tmp_path), "Tiny")
    assert (raw.users, raw.items) == (["0", "0", "0", "1", "1"], ["0", "1", "2", "3", "4"])
    assert raw.times == [0.0, 1.0, 2.0, 0.0, 2.0]  # the skipped item's position stays unused
    assert raw.report.examples == [f"{inter}: user '1': item 2 of 3 is null, not an item id (a string or an integer)",
                                   f"{inter}: user '2': item 1 of 4 is [5], not an item id (a string or an integer)",
                                   f"{inter}: user '2': item 2 of 4 is 1.5, not an item id (a string or an integer)",
                                   f"{inter}: user '2': item 3 of 4 is true, not an item id (a string or an integer)",
                                   f"{inter}: user '2': item 4 of 4 is \"\", not an item id (a string or an integer)"]
    with pytest.raises(DataError, match=f"^{inter}: user '1': item 2 of 3 is null, .*dataset.strict=true"):
        lcrec.read(str(tmp_path), "Tiny", strict=True)


def test_lcrec_reader_bad_files(tmp_path):
    with pytest.raises(DataError, match=f"missing data file {tmp_path / 'Tiny.inter.json'}"):
        lcrec.read(str(tmp_path), "Tiny")
    bad = write(tmp_path / "Tiny.inter.json", '{"0": [1, 2],\n "1": [3,, 4]}')
    with pytest.raises(DataError, match=f"{bad}:2: invalid JSON"):
        lcrec.read(str(tmp_path), "Tiny")
    write(tmp_path / "Tiny.inter.json", "[[1, 2]]")
    with pytest.raises(DataError, match="expected an object"):
        lcrec.read(str(tmp_path), "Tiny")
    write(tmp_path / "Tiny.inter.json", '{"0": [1, 2]}')
    items = write(tmp_path / "Tiny.item.json", '[{"title": "Pen"}]')
    with pytest.raises(DataError, match=f"{items}: expected an object {{item: {{title, ...}}}}, got list"):
        lcrec.read(str(tmp_path), "Tiny")


# ---------------------------------------------------------------- sequences, k-core, splits


def natural(ids):
    return sorted(ids, key=int) if all(s.lstrip("-").isdigit() for s in ids) else sorted(ids)


def sequences_reference(users, items, times, k):
    """Per user: sort by (time, input order), drop exact repeats, then drop users and items
    with fewer than k interactions until none is left to drop. All explicit loops."""
    seqs = {}
    for n, (u, i, t) in enumerate(zip(users, items, times)):
        seqs.setdefault(u, []).append((t, n, i))
    for u in seqs:
        seen, out = set(), []
        for t, _, i in sorted(seqs[u]):
            if (i, t) not in seen:
                seen.add((i, t))
                out.append((i, t))
        seqs[u] = out
    while True:
        icount = {}
        for s in seqs.values():
            for i, _ in s:
                icount[i] = icount.get(i, 0) + 1
        bad_users = {u for u, s in seqs.items() if len(s) < k}
        bad_items = {i for i, c in icount.items() if c < k}
        if not bad_users and not bad_items:
            break
        seqs = {u: [(i, t) for i, t in s if i not in bad_items] for u, s in seqs.items() if u not in bad_users}
    user_ids = natural(list(seqs))
    item_ids = natural(list({i for s in seqs.values() for i, _ in s}))
    index = {i: n for n, i in enumerate(item_ids)}
    flat = [index[i] for u in user_ids for i, _ in seqs[u]]
    flat_times = [t for u in user_ids for _, t in seqs[u]]
    offsets = [0]
    for u in user_ids:
        offsets.append(offsets[-1] + len(seqs[u]))
    return user_ids, item_ids, flat, flat_times, offsets


def random_raw(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(80, 250))
    name = (lambda x: str(x * 7 + 1)) if seed % 2 else (lambda x: f"id{x:02d}")  # numeric ids: 8 < 15 < 106
    users = [name(x) for x in rng.integers(0, 25, n)]
    items = [name(x) for x in rng.integers(0, 15, n)]
    times = [float(t) for t in rng.integers(0, 8, n)]  # few distinct times: many ties
    for j in rng.integers(0, n, 20):  # exact duplicates
        users.append(users[j]), items.append(items[j]), times.append(times[j])
    return users, items, times


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [1, 3, 5])
def test_build_sequences_matches_reference(seed, k):
    users, items, times = random_raw(seed)
    ref = sequences_reference(users, items, times, k)
    if not ref[0]:
        with pytest.raises(DataError, match=f"{k}-core"):
            build_sequences(RawData(users, items, times), k)
        return
    got = build_sequences(RawData(users, items, times), k)
    assert got[0] == ref[0] and got[1] == ref[1]
    assert got[2].tolist() == ref[2] and got[3].tolist() == ref[3] and got[4].tolist() == ref[4]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [2, 4])
def test_kcore_mask_matches_reference(seed, k):
    rng = np.random.default_rng(seed)
    user, item = rng.integers(0, 20, 150), rng.integers(0, 12, 150)
    alive = set(range(150))
    while True:
        uc, ic = {}, {}
        for n in alive:
            uc[user[n]] = uc.get(user[n], 0) + 1
            ic[item[n]] = ic.get(item[n], 0) + 1
        drop = {n for n in alive if uc[user[n]] < k or ic[item[n]] < k}
        if not drop:
            break
        alive -= drop
    assert sorted(np.flatnonzero(kcore(user, item, k)).tolist()) == sorted(alive)


def test_build_sequences_order_ties_and_duplicates():
    raw = RawData(users=["A", "A", "A", "A", "B", "A", "A"], items=["a", "b", "c", "d", "a", "b", "b"],
                  times=[5.0, 3.0, 3.0, 1.0, 2.0, 3.0, 4.0])  # (A, b, 3) twice; (A, b, 4) is not a duplicate
    users, item_ids, flat, times, offsets = build_sequences(raw, 1)
    assert users == ["A", "B"] and item_ids == ["a", "b", "c", "d"]
    assert [item_ids[i] for i in flat] == ["d", "b", "c", "b", "a", "a"]  # b before c: input order
    assert times.tolist() == [1.0, 3.0, 3.0, 4.0, 5.0, 2.0] and offsets.tolist() == [0, 5, 6]


def test_leave_one_out_by_hand():
    split = leave_one_out(np.array([0, 5, 8, 10, 11]))  # lengths 5, 3, 2, 1
    assert split["train"].tolist() == [[0, 1], [0, 2]]
    assert split["valid"].tolist() == [[0, 3], [1, 1]]
    assert split["test"].tolist() == [[0, 4], [1, 2], [2, 1]]


def test_sliding_window_by_hand():
    offsets = np.array([0, 5, 9, 13])
    times = np.array([0, 10, 20, 30, 40, 5, 10, 25, 50, 1, 2, 20, 35], dtype=float)
    split = sliding_window(offsets, times)
    # targets by time; ties (10: users 0 and 1; 20: users 0 and 2) by user
    assert split["train"].tolist() == [[2, 1], [0, 1], [1, 1], [0, 2], [2, 2], [1, 2], [0, 3], [2, 3]]
    assert split["valid"].tolist() == [[0, 4]]
    assert split["test"].tolist() == [[1, 3]]


@pytest.mark.parametrize("seed", range(3))
def test_sliding_window_matches_reference(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 9, 30)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    times = np.concatenate([np.sort(rng.integers(0, 40, n)) for n in lengths]).astype(float)
    ex = sorted((times[offsets[u] + p], u, p) for u in range(30) for p in range(1, lengths[u]))
    ex = [[u, p] for _, u, p in ex]
    a = int(len(ex) * 0.8)
    b = a + int(len(ex) * 0.1)
    split = sliding_window(offsets, times)
    assert split["train"].tolist() == ex[:a] and split["valid"].tolist() == ex[a:b] and split["test"].tolist() == ex[b:]


def test_item_texts_missing_fields():
    meta = {"1": {"title": "Pen", "brand": "Acme"}, "2": {"title": "Pad"}, "4": {"title": "Big \n  Pen", "brand": "X"}}
    got = item_texts(["1", "2", "3", "4"], meta, "Title: {title}. Brand: {brand}.")
    assert got == ["Title: Pen. Brand: Acme.", "Title: Pad. Brand: .", "Title: . Brand: .", "Title: Big Pen. Brand: X."]


def test_item_texts_unknown_field_is_a_typo():
    """A field missing for some items is sparse metadata; a field no item has is a misspelling: one line naming
    the key, the field, its nearest field and the fields there are."""
    meta = {"1": {"title": "Pen", "group": "a"}, "2": {"group": "b"}}
    with pytest.raises(DataError) as e:
        item_texts(["1", "2"], meta, "{titel} in {group}")
    assert str(e.value) == ("dataset.text_template='{titel} in {group}': no item has a field {titel} "
                            "(did you mean {title}?); the items' fields: group, title")
    with pytest.raises(DataError, match=r"'\{nosuchfield\}': no item has a field \{nosuchfield\}; "
                                        r"the items' fields: group, title$"):
        item_texts(["1"], meta, "{nosuchfield}")
    with pytest.raises(DataError, match=r"no item has a field \{0\}"):  # positional: would format the same for all
        item_texts(["1"], meta, "{0} {title}")
    with pytest.raises(DataError, match=r"^dataset.text_template='\{title': expected '\}' before end of string$"):
        item_texts(["1"], meta, "{title")
    assert item_texts(["1", "2"], meta, "{title!r} {group:>3}") == ["'Pen' a", "'' b"]  # conversions, format specs
    assert item_texts(["1", "2"], {}, "Title: {title}.") == ["Title: .", "Title: ."]  # no metadata at all: no typo


# ---------------------------------------------------------------- the artefact cache


def test_cache_key_and_crash_leftovers(tmp_path):
    assert config_hash("sids", {"a": 1, "b": [2]}) == config_hash("sids", {"b": [2], "a": 1})
    assert config_hash("sids", {"a": 1}) != config_hash("sids", {"a": 2}) != config_hash("sequences", {"a": 2})

    def fail(tmp):
        (tmp / "half").write_text("x")
        raise RuntimeError("crash")

    with pytest.raises(RuntimeError):
        cached(tmp_path, "sids", {"a": 1}, fail)
    assert sorted(p.name for p in (tmp_path / "sids").iterdir() if p.is_dir()) == []  # no temp folder left

    final = tmp_path / "sids" / config_hash("sids", {"a": 1})
    final.mkdir()
    (final / "stale").write_text("half-built, no meta.json")
    path, hit = cached(tmp_path, "sids", {"a": 1}, lambda tmp: (tmp / "x.txt").write_text("ok") and {"n": 3})
    assert (path, hit) == (final, False)
    assert sorted(p.name for p in final.iterdir()) == ["meta.json", "x.txt"]
    meta = json.loads((final / "meta.json").read_text())
    assert meta["n"] == 3 and meta["config"] == {"a": 1} and meta["stage"] == "sids"
    assert cached(tmp_path, "sids", {"a": 1}, lambda tmp: pytest.fail("rebuilt")) == (final, True)


def _build_and_die(root):
    """A forked child: SIGKILLed half-way through building an artefact."""
    def build(tmp):
        (tmp / "half").write_text("x")
        os.kill(os.getpid(), signal.SIGKILL)

    cached(root, "embeddings", {"a": 1}, build)


def test_cache_removes_a_killed_builds_temp_folder(tmp_path):
    """The next build of the same artefact removes the temp folders of dead builders (only those)."""
    child = mp.get_context("fork").Process(target=_build_and_die, args=(tmp_path,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL
    folder, name = tmp_path / "embeddings", config_hash("embeddings", {"a": 1})
    dead = folder / f".tmp-{name}-{child.pid}"
    assert (dead / "half").exists()
    alive = folder / f".tmp-{name}-{os.getppid()}"  # a live process's (e.g. a reused pid): kept
    other = folder / f".tmp-{config_hash('embeddings', {'a': 2})}-{child.pid}"  # another artefact's: not ours to judge
    for d in (alive, other):
        d.mkdir()
    path, hit = cached(tmp_path, "embeddings", {"a": 1}, lambda tmp: (tmp / "x.txt").write_text("ok") and None)
    assert not hit and (path / "x.txt").exists()
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".tmp-")) == sorted([alive.name, other.name])


# ---------------------------------------------------------------- genrec.prepare


def write_lcrec(root: Path, name: str = "Tiny", users: int = 40, items: int = 15) -> dict:
    """A tiny Office-like dataset: every user 6 items, every item >= 5 users; plus an index file."""
    root.mkdir(parents=True, exist_ok=True)
    inter = {str(u): [(u * 7 + 3 * j) % items for j in range(6)] for u in range(users)}
    meta = {str(i): {"title": f"Item {i}", "description": f"thing number {i}" if i % 3 else "",
                     "brand": ["Acme", "Bolt"][i % 2], "categories": "Office Products, Misc"} for i in range(items)}
    # codes (i % 4, i // 4 % 3, 1 for items 13 and 14): only items 0 and 12 collide
    index = {str(i): [f"<a_{i % 4}>", f"<b_{i // 4 % 3}>", f"<c_{int(i in (13, 14))}>"] for i in range(items)}
    (root / f"{name}.inter.json").write_text(json.dumps(inter))
    (root / f"{name}.item.json").write_text(json.dumps(meta))
    (root / f"{name}.index.rq-kmeans.json").write_text(json.dumps(index))
    return inter


def cfg_for(overrides):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def tiny(tmp_path, data_dir, *more):
    write_lcrec(tmp_path / "raw")
    return ["dataset=lcrec", f"dataset.root={tmp_path / 'raw'}", "dataset.name=Tiny", f"data_dir={data_dir}", *more]


RQ = ["tokenizer=rqkmeans", "tokenizer.levels=2", "tokenizer.codebook_size=4", "tokenizer.iters=5",
      "embedder=random"]  # the real embedders: tests/test_embed.py


def folders(data_dir):
    """stage -> artefact folder names (and nothing else may be a folder there)."""
    return {s.name: sorted(p.name for p in s.iterdir() if p.is_dir()) for s in sorted(data_dir.iterdir())}


def test_prepare_tiny_end_to_end_and_cache(tmp_path, data_dir):
    inter = write_lcrec(tmp_path / "raw")
    base = tiny(tmp_path, data_dir, *RQ)
    first = prepare(cfg_for(base), log=pytest.fail)
    s = first.summary
    assert s["cache_hits"] == {"sequences": False, "embeddings": False, "sids": False}
    assert (s["users"], s["items"], s["interactions"]) == (40, 15, 240)
    assert first.seq.user_ids == [str(u) for u in range(40)] and first.seq.item_ids == [str(i) for i in range(15)]
    seqs = [first.seq.items[first.seq.offsets[u]:first.seq.offsets[u + 1]].tolist() for u in range(40)]
    assert seqs == list(inter.values())
    assert first.seq.item_text[0] == "Title: Item 0. Brand: Acme. Categories: Office Products, Misc. Description:"
    assert (s["train_examples"], s["valid_examples"], s["test_examples"]) == (40 * 3, 40, 40)
    assert first.sids.codes.shape[0] == 15 and first.sids.num_candidates == 15 and s["levels"] == 3
    assert set(s["timings"]) == {"sequences", "embeddings", "sids"} and s["seconds"] >= 0
    built = folders(data_dir)
    assert {k: len(v) for k, v in built.items()} == {"embeddings": 1, "sequences": 1, "sids": 1}
    mtimes = {p: p.stat().st_mtime_ns for p in data_dir.glob("*/*/meta.json")}

    again = prepare(cfg_for(base), log=pytest.fail)
    assert again.summary["cache_hits"] == {"sequences": True, "embeddings": True, "sids": True}
    assert folders(data_dir) == built
    assert {p: p.stat().st_mtime_ns for p in data_dir.glob("*/*/meta.json")} == mtimes
    assert np.array_equal(again.sids.codes, first.sids.codes) and np.array_equal(again.seq.items, first.seq.items)

    def hits(*changed):
        return prepare(cfg_for(base + list(changed)), log=pytest.fail).summary["cache_hits"]

    assert hits("tokenizer.seed=7") == {"sequences": True, "embeddings": True, "sids": False}
    assert hits("embedder.seed=1") == {"sequences": True, "embeddings": False, "sids": False}
    assert hits("dataset.text_template='{title}'") == {"sequences": False, "embeddings": False, "sids": False}
    assert {k: len(v) for k, v in folders(data_dir).items()} == {"embeddings": 3, "sequences": 2, "sids": 4}


def test_prepare_precomputed_and_collision_policy(tmp_path, data_dir):
    base = tiny(tmp_path, data_dir, "tokenizer=precomputed")
    s = prepare(cfg_for(base), log=pytest.fail).summary
    assert s["cache_hits"] == {"sequences": False, "sids": False}  # no embeddings needed
    assert (s["levels"], s["unique_codes"], s["max_collision"]) == (4, 15, 1)
    assert (s["unique_codes_before"], s["max_collision_before"]) == (14, 2)  # items 0 and 12 collide
    merged = prepare(cfg_for(base + ["tokenizer.collision=merge"]), log=pytest.fail)
    assert merged.summary["cache_hits"] == {"sequences": True, "sids": False}
    assert (merged.summary["levels"], merged.summary["unique_codes"]) == (3, 14)
    assert merged.sids.item_to_cand[0] == merged.sids.item_to_cand[12]


def test_prepare_sliding_split(tmp_path, data_dir):
    s = prepare(cfg_for(tiny(tmp_path, data_dir, "tokenizer=precomputed", "dataset.split=sliding"))).summary
    assert (s["train_examples"], s["valid_examples"], s["test_examples"]) == (160, 20, 20)  # 200 examples, 8:1:1
    with pytest.raises(DataError, match="dataset.split='random'"):
        prepare(cfg_for(tiny(tmp_path, data_dir, "tokenizer=precomputed", "dataset.split=random")))


def write_recbole(root: Path, bad: bool = True) -> Path:
    """12 users x 6 movies over 8 movies, with one malformed row (line 5) and the index file."""
    root.mkdir(parents=True, exist_ok=True)
    rows = [f"{u}\t{(u + 3 * j) % 8 + 1}\t3\t{1000 + 10 * j}" for u in range(1, 13) for j in range(6)]
    if bad:
        rows.insert(3, "7\t3\t4")
    (root / "tiny.inter").write_text("user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
                                     + "\n".join(rows) + "\n")
    (root / "tiny.item").write_text("item_id:token\tmovie_title:token_seq\trelease_year:token\n"
                                    + "".join(f"{i}\tMovie {i}\t199{i}\n" for i in range(1, 9)))
    (root / "tiny.index.json").write_text(json.dumps({str(i): [f"<a_{i}>", "<b_0>"] for i in range(1, 9)}))
    return root / "tiny.inter"


def recbole_overrides(root, data_dir, *more):
    return ["dataset=ml100k", f"dataset.reader.root={root}", "dataset.reader.name=tiny",
            "dataset.text_template='{movie_title} ({release_year})'", "tokenizer=precomputed",
            f"tokenizer.path={root / 'tiny.index.json'}", f"data_dir={data_dir}", *more]


def test_prepare_reports_bad_records_and_strict(tmp_path, data_dir):
    inter = write_recbole(tmp_path / "raw")
    logged = []
    p = prepare(cfg_for(recbole_overrides(tmp_path / "raw", data_dir)), log=logged.append)
    assert logged == [f"[data] skipped 1 bad records (tiny.inter: 1); first: {inter}:5: "
                      f"expected 4 tab-separated fields, got 3"]
    assert (p.summary["users"], p.summary["items"], p.summary["interactions"]) == (12, 8, 72)
    assert p.seq.item_text[0] == "Movie 1 (1991)"
    # a fresh cache: strict turns the bad row into an error naming it
    with pytest.raises(DataError, match=f"{inter}:5: .*dataset.strict=true"):
        prepare(cfg_for(recbole_overrides(tmp_path / "raw", tmp_path / "fresh", "dataset.strict=true")))


def test_prepare_strict_is_not_bypassed_by_the_cache(tmp_path, data_dir):
    """A non-strict run caches the sequences of a file with a bad row; a later strict run on
    the same files must still refuse them."""
    inter = write_recbole(tmp_path / "raw")
    prepare(cfg_for(recbole_overrides(tmp_path / "raw", data_dir)), log=lambda m: None)
    with pytest.raises(DataError, match=f"{inter}:5: "):
        prepare(cfg_for(recbole_overrides(tmp_path / "raw", data_dir, "dataset.strict=true")), log=lambda m: None)


def test_prepare_clear_errors(tmp_path, data_dir):
    with pytest.raises(DataError, match=r"no interactions left after 100-core filtering; lower dataset\.kcore"):
        prepare(cfg_for(tiny(tmp_path, data_dir, "tokenizer=precomputed", "dataset.kcore=100")))
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError, match=f"missing data file {missing / 'Tiny.inter.json'}"):
        prepare(cfg_for(tiny(tmp_path, data_dir, "tokenizer=precomputed", f"dataset.root={missing}")))
    with pytest.raises(DataError, match=r"tokenizer\.codebook_size=64"):
        prepare(cfg_for(tiny(tmp_path, data_dir, *RQ, "tokenizer.codebook_size=64")))


@pytest.mark.parametrize("template, says", [
    ("'{nosuchfield}'", r"no item has a field \{nosuchfield\}; the items' fields: group, title$"),
    ("'{titel} in {group}'", r"no item has a field \{titel\} \(did you mean \{title\}\?\)"),
])
def test_prepare_refuses_a_misspelt_template_before_embeddings(data_dir, template, says):
    """It used to blank every item's text (semantic IDs collapsed to one code before disambiguation)."""
    with pytest.raises(DataError, match=r"^dataset.text_template=.*" + says):
        prepare(cfg_for(["experiment=tiny", f"data_dir={data_dir}", f"dataset.text_template={template}"]))
    assert folders(data_dir) == {"sequences": []}  # nothing cached, no embeddings computed


def test_prepare_checks_the_template_before_reading(tmp_path, data_dir):
    with pytest.raises(DataError, match=r"^dataset.text_template='Title: \{title': expected '\}'"):
        prepare(cfg_for(tiny(tmp_path, data_dir, *RQ, f"dataset.root={tmp_path / 'nowhere'}",
                             "dataset.text_template='Title: {title'")))


def test_prepare_refuses_to_embed_one_text_for_every_item(tmp_path, data_dir):
    """No item metadata (as apao_grocery): fine for precomputed semantic IDs, an error for ones built from text."""
    base = tiny(tmp_path, data_dir)
    (tmp_path / "raw" / "Tiny.item.json").unlink()
    assert prepare(cfg_for(base + ["tokenizer=precomputed"]), log=pytest.fail).summary["items"] == 15
    with pytest.raises(DataError, match=r"^dataset Tiny: every item's text is 'Title: \. Brand: \. Categories: \. "
                                        r"Description:' \(no item metadata\?\): text embeddings would give every item "
                                        r"one semantic ID; fix dataset\.text_template or use tokenizer=precomputed$"):
        prepare(cfg_for(base + RQ))
    assert "embeddings" not in folders(data_dir)


def test_hydra_lists_options_for_a_typo():
    with pytest.raises(Exception, match=r"(?s)dataset/ml100kk.*Available options.*lcrec.*ml100k.*office"):
        cfg_for(["dataset=ml100kk"])


@pytest.mark.skipif(not OFFICE.exists(), reason="needs ../shared/data/apao-office")
def test_prepare_office_counts(data_dir):
    p = prepare(cfg_for(["dataset=lcrec", f"dataset.root={OFFICE}", "dataset.name=Office",
                         "tokenizer=precomputed", f"data_dir={data_dir}"]), log=pytest.fail)
    s = p.summary
    assert (s["users"], s["items"], s["interactions"]) == (4905, 2420, 53258)
    assert (s["levels"], s["unique_codes"], s["unique_codes_before"], s["max_collision_before"]) == (5, 2420, 2415, 2)
    assert (s["valid_examples"], s["test_examples"]) == (4905, 4905)
    assert s["train_examples"] == 53258 - 3 * 4905  # positions 1..n-3 of every user


# ---------------------------------------------------------------- concurrency


def _prepare_slowly(cfg, queue):
    """A forked child: every build sleeps first, so both processes reach each stage together."""
    import genrec.sid.tokenizers as sid
    import genrec.prepare as gp

    build, call = gp.build_sequences, sid.Precomputed.__call__
    gp.build_sequences = lambda *a, **k: (time.sleep(1.0), build(*a, **k))[1]
    sid.Precomputed.__call__ = lambda *a, **k: (time.sleep(1.0), call(*a, **k))[1]
    p = gp.prepare(cfg, log=lambda m: None)
    queue.put((p.summary["cache_hits"], p.summary["artefacts"], p.sids.codes.tolist()))


def test_concurrent_prepares_build_each_artefact_once(tmp_path, data_dir):
    cfg = cfg_for(tiny(tmp_path, data_dir, "tokenizer=precomputed"))
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_prepare_slowly, args=(cfg, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    for stage in ("sequences", "sids"):
        assert sorted(r[0][stage] for r in results) == [False, True]  # one built, the other waited and read
    assert results[0][1:] == results[1][1:]
    assert {k: len(v) for k, v in folders(data_dir).items()} == {"sequences": 1, "sids": 1}
    assert not [p for p in data_dir.rglob("*") if p.name.startswith(".tmp")]
    for meta in data_dir.glob("*/*/meta.json"):
        json.loads(meta.read_text())
    assert SemanticIds.load(Path(results[0][1])).codes.tolist() == results[0][2]


# ---------------------------------------------------------------- python -m genrec.prepare


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """Three commands at once (start-up dominates): a good run, a missing dataset, a typo."""
    tmp = tmp_path_factory.mktemp("cli")
    write_lcrec(tmp / "raw")
    common = [f"data_dir={tmp / 'data'}"]  # Hydra's own run dir settings as they are: see test_cli_leaves_no_run_dir
    args = {
        "ok": ["dataset=lcrec", f"dataset.root={tmp / 'raw'}", "dataset.name=Tiny", "tokenizer=precomputed"],
        "missing": ["dataset=lcrec", f"dataset.root={tmp / 'nowhere'}", "dataset.name=Tiny", "tokenizer=precomputed"],
        "typo": ["dataset=ml100kk"],
    }
    env = {**os.environ, "GENREC_DATA_DIR": str(tmp / "env-data"), "HF_HUB_OFFLINE": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    procs = {k: subprocess.Popen([sys.executable, "-m", "genrec.prepare", *a, *common], cwd=tmp, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k, a in args.items()}
    out = {k: (p.communicate(timeout=180), p.returncode) for k, p in procs.items()}
    return tmp, out


def test_cli_prints_json_summary_last(cli):
    tmp, out = cli
    (stdout, stderr), rc = out["ok"]
    assert rc == 0, stderr
    s = json.loads(stdout.strip().splitlines()[-1])
    assert (s["users"], s["items"], s["interactions"], s["unique_codes"], s["max_collision"]) == (40, 15, 240, 15, 1)
    assert isinstance(s["seconds"], float)
    assert "40 users, 15 items, 240 interactions" in stdout
    assert (tmp / "data" / "sids").is_dir() and not (tmp / "env-data").exists()


def test_cli_leaves_no_run_dir(cli):
    """The data stage's artefacts live in the cache: a prepare (done or refused) leaves no outputs/<run>/ holding
    only .hydra/ and an empty prepare.log, which genrec.report would list as a running, later failed, run."""
    tmp, out = cli
    assert out["ok"][1] == 0 and out["missing"][1] == 2
    assert sorted(p.name for p in tmp.iterdir()) == ["data", "raw"]


def test_cli_bad_dataset_is_one_error_line(cli):
    tmp, out = cli
    (stdout, stderr), rc = out["missing"]
    assert rc == 2
    assert stderr.strip().splitlines() == [f"error: missing data file {tmp / 'nowhere' / 'Tiny.inter.json'} "
                                           f"(nor Tiny.inter.json.gz); set dataset.root or run "
                                           f"`python -m genrec.download dataset=<name>`"]
    assert "Traceback" not in stdout + stderr


def test_cli_typo_lists_the_options(cli):
    _, out = cli
    (stdout, stderr), rc = out["typo"]
    assert rc == 2 and stdout == ""
    [line] = stderr.strip().splitlines()
    assert line.startswith("error: dataset=ml100kk: not an option of dataset (did you mean ml100k?): "), line
    assert {"lcrec", "ml100k", "office", "yelp"} <= set(line.split(": ")[-1].split(", ")), line


def test_prepare_rebuilds_when_a_raw_file_changes(tmp_path, data_dir):
    """The raw files a stage read are part of its key: editing the interactions gives new
    sequences (and so new embeddings and SIDs, whose keys name them); editing the precomputed
    index gives new SIDs only; unchanged files are cache hits."""
    inter = write_lcrec(tmp_path / "raw")
    base = tiny(tmp_path, data_dir, *RQ)
    first = prepare(cfg_for(base), log=pytest.fail)
    seq_meta = [json.loads(p.read_text()) for p in (data_dir / "sequences").glob("*/meta.json")]
    assert len(seq_meta) == 1 and sorted(Path(f).name for f in seq_meta[0]["inputs"]) == ["Tiny.inter.json", "Tiny.item.json"]
    assert prepare(cfg_for(base), log=pytest.fail).summary["cache_hits"] == {"sequences": True, "embeddings": True, "sids": True}

    inter["0"] = inter["0"][:-1] + [inter["1"][0]]  # user 0's last item changes
    (tmp_path / "raw" / "Tiny.inter.json").write_text(json.dumps(inter))
    edited = prepare(cfg_for(base), log=pytest.fail)
    assert edited.summary["cache_hits"] == {"sequences": False, "embeddings": False, "sids": False}
    last = edited.seq.items[edited.seq.offsets[1] - 1]  # user 0's last item
    assert edited.seq.item_ids[last] == str(inter["1"][0]) != first.seq.item_ids[first.seq.items[first.seq.offsets[1] - 1]]
    assert prepare(cfg_for(base), log=pytest.fail).summary["cache_hits"] == {"sequences": True, "embeddings": True, "sids": True}

    pre = base[:4] + ["tokenizer=precomputed"]  # the same (edited) raw files
    assert prepare(cfg_for(pre), log=pytest.fail).summary["cache_hits"] == {"sequences": True, "sids": False}
    index_file = tmp_path / "raw" / "Tiny.index.rq-kmeans.json"
    index = json.loads(index_file.read_text())
    index["3"] = index["11"]  # a second colliding pair
    index_file.write_text(json.dumps(index))
    s = prepare(cfg_for(pre), log=pytest.fail).summary
    assert s["cache_hits"] == {"sequences": True, "sids": False} and s["unique_codes_before"] == 13
