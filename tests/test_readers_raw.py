"""Raw-dump readers (Amazon 2014/2018/2023, Yelp) on tiny files in the real formats."""

import gzip
import json
from datetime import datetime, timezone

import pytest

from genrec.data.readers.amazon import read_amazon2014, read_amazon2018, read_amazon2023
from genrec.data.readers.common import DataError
from genrec.data.readers.yelp import read_yelp


def write(path, lines, gz):
    """Write lines to `path` (gzipped as `path.gz` when gz); return the written path."""
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def expected(records, user, item, time, scale=1.0):
    """Reference: the good records' (user, item, time) in file order, by an explicit loop."""
    out = ([], [], [])
    for r in records:
        out[0].append(r[user]), out[1].append(r[item]), out[2].append(float(r[time]) / scale)
    return out


def check_bad(data, path, lines, reasons):
    """The report counts exactly the bad `lines` of `path`, naming each line."""
    assert data.report.bad == {str(path): len(lines)}
    assert data.report.total == len(lines)
    for line, reason in zip(lines, reasons):
        assert any(e.startswith(f"{path}:{line}: ") and reason in e for e in data.report.examples)


# ---------------------------------------------------------------- Amazon 2014 (python literals)

A14 = [
    {"reviewerID": "U1", "asin": "I1", "reviewerName": "Jo's", "helpful": [0, 1], "reviewText": 'say "hi"',
     "overall": 5.0, "summary": "ok", "unixReviewTime": 1400000300, "reviewTime": "05 13, 2014"},
    {"reviewerID": "U2", "asin": "I2", "helpful": [1, 1], "overall": 4.0, "unixReviewTime": 1300000000},
    {"reviewerID": "U1", "asin": "I2", "overall": 3.0, "unixReviewTime": 1400000100},
    {"reviewerID": "U2", "asin": "I3", "overall": 3.0, "unixReviewTime": 1400000100},
]
A14_META = [
    {"asin": "I1", "title": "Pen &amp; Ink", "brand": "Acme", "price": 3.5, "imUrl": "http://x/y.jpg",
     "categories": [["Office Products", "Pens"], ["Office Products", "Writing"]], "description": "Blue ink."},
    {"asin": "I9", "title": "never reviewed"},
    {"asin": "I2", "title": "Stapler", "categories": [["Office Products"]],
     "related": {"also_bought": ["I1"]}, "salesRank": {"Office Products": 12}},
    {"asin": "I2", "title": "duplicate line: the first one wins"},
]


def amazon2014_files(tmp_path, gz):
    # python-literal lines exactly as the 2014 dump writes them (repr of a dict), plus bad ones
    lines = [repr(A14[0]),
             "{'reviewerID': 'U3', 'asin': 'I1', 'unixRev",  # 2: truncated
             repr(A14[1]),
             repr({"reviewerID": "U4", "asin": "I1", "overall": 1.0}),  # 4: no unixReviewTime
             "",
             "__import__('os').system('touch PWNED')",  # 6: code, not a literal
             "{'reviewerID': __import__('os').getcwd(), 'asin': 'I1', 'unixReviewTime': 1}",  # 7: code inside
             repr({"reviewerID": "U5", "asin": "I1", "unixReviewTime": "yesterday"}),  # 8: time not a number
             repr(A14[2]), repr(A14[3])]
    reviews = write(tmp_path / "reviews_Office_Products_5.json", lines, gz)
    py2 = r"{'asin': 'I3', 'title': u'Mug \u2013 Caf\xe9', 'categories': [[u'Office Products']], 'price': 2}"
    meta = write(tmp_path / "meta_Office_Products.json", [repr(m) for m in A14_META] + [py2], gz)
    return reviews, meta


@pytest.mark.parametrize("gz", [False, True])
def test_amazon2014(tmp_path, monkeypatch, gz):
    monkeypatch.chdir(tmp_path)
    reviews, _ = amazon2014_files(tmp_path, gz)
    # the config names the .gz file; the reader also finds the un-gzipped twin (and vice versa)
    data = read_amazon2014(tmp_path, "reviews_Office_Products_5.json.gz", "meta_Office_Products.json")
    assert (data.users, data.items, data.times) == expected(A14, "reviewerID", "asin", "unixReviewTime")
    assert all(isinstance(t, float) for t in data.times)
    assert data.meta == {
        "I1": {"title": "Pen & Ink", "brand": "Acme", "categories": "Office Products, Pens, Writing",
               "price": "3.5", "description": "Blue ink."},
        "I2": {"title": "Stapler", "brand": "", "categories": "Office Products", "price": "", "description": ""},
        "I3": {"title": "Mug \u2013 Caf\xe9", "brand": "", "categories": "Office Products", "price": "2",
               "description": ""},
    }
    check_bad(data, reviews, [2, 4, 6, 7, 8], ["malformed", "missing unixReviewTime", "malformed", "malformed",
                                               "malformed"])
    assert not (tmp_path / "PWNED").exists()  # rejected, never executed


def test_amazon2014_strict_names_file_and_line(tmp_path):
    reviews, _ = amazon2014_files(tmp_path, gz=True)
    with pytest.raises(DataError, match=f"{reviews}:2: malformed"):
        read_amazon2014(tmp_path, reviews.name, None, strict=True)
    # a missing key is an error too once the malformed line is gone
    lines = [repr(A14[0]), repr({"asin": "I1", "unixReviewTime": 5})]
    path = write(tmp_path / "r.json", lines, gz=False)
    with pytest.raises(DataError, match=f"{path}:2: missing reviewerID"):
        read_amazon2014(tmp_path, "r.json", None, strict=True)


def test_amazon2014_bad_meta_line_is_reported(tmp_path):
    write(tmp_path / "r.json", [repr(A14[0])], gz=False)
    meta = write(tmp_path / "m.json", ["{'asin': 'I1', 'title': 'x'", repr({"title": "no asin"}), repr(A14_META[0])],
                 gz=True)
    data = read_amazon2014(tmp_path, "r.json", "m.json.gz")
    assert data.meta["I1"]["title"] == "Pen & Ink"
    check_bad(data, meta, [1, 2], ["malformed", "missing asin"])
    with pytest.raises(DataError, match=f"{meta}:1:"):
        read_amazon2014(tmp_path, "r.json", "m.json.gz", strict=True)


def test_hostile_literals_are_counted_not_crashing(tmp_path):
    lines = ["{[1]: 2}",  # unhashable key
             repr({"reviewerID": "U1", "asin": "I1", "unixReviewTime": 10 ** 400}),  # float overflow
             "[" * 5000 + "]" * 5000,  # nesting past the recursion limit
             repr({"reviewerID": "U1", "asin": "I1", "unixReviewTime": [1]}),
             "{'reviewerID': 'U1', 'asin': 'I1', 'unixReviewTime': (lambda: 1)()}",
             repr(A14[0])]
    path = write(tmp_path / "r.json", lines, gz=False)
    data = read_amazon2014(tmp_path, "r.json", None)
    assert data.items == ["I1"] and data.times == [float(A14[0]["unixReviewTime"])]
    assert data.report.bad == {str(path): 5}


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="missing data file .*reviews_Beauty_5.json.gz.*genrec.download"):
        read_amazon2014(tmp_path, "reviews_Beauty_5.json.gz", None)


# ---------------------------------------------------------------- Amazon 2018 (JSON lines)

A18 = [
    {"overall": 5.0, "verified": True, "reviewTime": "09 1, 2016", "reviewerID": "U1", "asin": "B1",
     "style": {"Size:": " Large"}, "reviewerName": "A", "unixReviewTime": 1472688000, "vote": "2"},
    {"overall": 2.0, "verified": False, "reviewerID": "U2", "asin": "B1", "unixReviewTime": 1472688000},
    {"overall": 4.0, "verified": True, "reviewerID": "U1", "asin": "B2", "unixReviewTime": 1372688000},
]
A18_META = [
    {"category": ["Toys &amp; Games", "Puzzles", "Puzzles"], "description": ["A puzzle.", "1000 pieces."],
     "title": "Big &quot;Puzzle&quot;", "brand": "Ravensburger", "price": "$12.99", "asin": "B1", "also_buy": []},
    {"category": [], "description": [], "title": "Ball", "brand": "", "price": "", "asin": "B2"},
]


@pytest.mark.parametrize("gz", [False, True])
def test_amazon2018(tmp_path, gz):
    lines = [json.dumps(A18[0]), json.dumps(A18[1]), '{"reviewerID": "U3", "asin": ', json.dumps(A18[2]),
             json.dumps({"reviewerID": "U3", "unixReviewTime": 1}), "[1, 2]"]
    reviews = write(tmp_path / "Toys_and_Games_5.json", lines, gz)
    write(tmp_path / "meta_Toys_and_Games.json", [json.dumps(m) for m in A18_META], gz)
    suffix = ".gz" if gz else ""
    data = read_amazon2018(tmp_path, "Toys_and_Games_5.json" + suffix, "meta_Toys_and_Games.json" + suffix)
    assert (data.users, data.items, data.times) == expected(A18, "reviewerID", "asin", "unixReviewTime")
    assert data.meta == {
        "B1": {"title": 'Big "Puzzle"', "brand": "Ravensburger", "categories": "Toys & Games, Puzzles",
               "price": "$12.99", "description": "A puzzle. 1000 pieces."},
        "B2": {"title": "Ball", "brand": "", "categories": "", "price": "", "description": ""},
    }
    check_bad(data, reviews, [3, 5, 6], ["malformed", "missing asin", "not an object"])
    with pytest.raises(DataError, match=f"{reviews}:3:"):
        read_amazon2018(tmp_path, reviews.name, None, strict=True)


def test_amazon2018_rejects_python_literals(tmp_path):
    """2018 files are strict JSON: a single-quoted (python) line is malformed there."""
    reviews = write(tmp_path / "r.json", [json.dumps(A18[0]), repr(A18[2])], gz=False)
    data = read_amazon2018(tmp_path, "r.json", None)
    assert data.items == ["B1"]
    check_bad(data, reviews, [2], ["malformed"])


# ---------------------------------------------------------------- Amazon 2023 (JSONL, ms)

A23 = [
    {"rating": 5.0, "title": "Great", "text": "x", "images": [], "asin": "C1v2", "parent_asin": "C1",
     "user_id": "AGX", "timestamp": 1588615855070, "helpful_vote": 0, "verified_purchase": True},
    {"rating": 3.0, "asin": "C2", "parent_asin": "C2", "user_id": "AHY", "timestamp": 1588615855071},
]
A23_META = [
    {"main_category": "All Beauty", "title": "Lip Balm", "average_rating": 4.5, "features": ["SPF 15", "Mint"],
     "description": ["Soft lips."], "price": None, "images": [], "store": "Burt's", "categories": [],
     "details": {"Brand": "B"}, "parent_asin": "C1"},
    {"title": "Soap", "features": [], "description": [], "price": 4.99, "store": "S",
     "categories": ["Beauty", "Bath"], "parent_asin": "C2"},
]


@pytest.mark.parametrize("gz", [False, True])
def test_amazon2023(tmp_path, gz):
    lines = [json.dumps(A23[0]), json.dumps({"user_id": "AZZ", "parent_asin": "C1"}), json.dumps(A23[1]), "{oops}"]
    reviews = write(tmp_path / "All_Beauty.jsonl", lines, gz)
    write(tmp_path / "meta_All_Beauty.jsonl", [json.dumps(m) for m in A23_META], gz)
    data = read_amazon2023(tmp_path, "All_Beauty.jsonl.gz", "meta_All_Beauty.jsonl.gz")
    ref = expected(A23, "user_id", "parent_asin", "timestamp", scale=1000.0)
    assert (data.users, data.items) == ref[:2]
    assert data.times == pytest.approx(ref[2], abs=1e-6)
    assert data.times[0] < data.times[1]  # one millisecond apart stays ordered
    assert data.meta == {
        "C1": {"title": "Lip Balm", "store": "Burt's", "categories": "", "features": "SPF 15 Mint", "price": "",
               "description": "Soft lips."},
        "C2": {"title": "Soap", "store": "S", "categories": "Beauty, Bath", "features": "", "price": "4.99",
               "description": ""},
    }
    check_bad(data, reviews, [2, 4], ["missing timestamp", "malformed"])
    with pytest.raises(DataError, match=f"{reviews}:2: missing timestamp"):
        read_amazon2023(tmp_path, reviews.name, None, strict=True)


# ---------------------------------------------------------------- Yelp

YELP = [
    {"review_id": "r1", "user_id": "u1", "business_id": "b1", "stars": 4.0, "useful": 0, "text": "Nice.",
     "date": "2018-07-07 22:09:11"},
    {"review_id": "r2", "user_id": "u2", "business_id": "b2", "stars": 1.0, "date": "2012-01-03 15:28:18"},
    {"review_id": "r3", "user_id": "u1", "business_id": "b2", "stars": 5.0, "date": "2014-02-05 20:30:30"},
]
BUSINESS = [
    {"business_id": "b1", "name": "Joe &amp; Co Pizza", "address": "1 Main St", "city": "Tampa", "state": "FL",
     "stars": 4.0, "review_count": 7, "is_open": 1, "attributes": {"WiFi": "u'free'"},
     "categories": "Pizza, Restaurants", "hours": None},
    {"business_id": "b2", "name": "Barber", "city": "Reno", "state": "NV", "categories": None},
    {"business_id": "b3", "name": "never reviewed", "city": "X", "state": "Y", "categories": "Z"},
]


def utc_seconds(s):
    """Reference epoch seconds, computed independently of the reader's parser."""
    return (datetime.strptime(s, "%Y-%m-%d %H:%M:%S") - datetime(1970, 1, 1)).total_seconds()


@pytest.mark.parametrize("gz", [False, True])
def test_yelp(tmp_path, gz):
    lines = [json.dumps(YELP[0]), json.dumps({**YELP[1], "date": "07/07/2018"}), json.dumps(YELP[1]),
             json.dumps({"user_id": "u3", "date": "2018-07-07 22:09:11"}), json.dumps(YELP[2]), "not json"]
    reviews = write(tmp_path / "yelp_academic_dataset_review.json", lines, gz)
    write(tmp_path / "yelp_academic_dataset_business.json", [json.dumps(b) for b in BUSINESS], gz)
    data = read_yelp(tmp_path)  # default file names; the .gz twin is found too
    assert data.users == [r["user_id"] for r in YELP]
    assert data.items == [r["business_id"] for r in YELP]
    assert data.times == [utc_seconds(r["date"]) for r in YELP]
    assert data.times[1] == datetime(2012, 1, 3, 15, 28, 18, tzinfo=timezone.utc).timestamp()
    assert data.meta == {
        "b1": {"name": "Joe & Co Pizza", "city": "Tampa", "state": "FL", "categories": "Pizza, Restaurants"},
        "b2": {"name": "Barber", "city": "Reno", "state": "NV", "categories": ""},
    }
    check_bad(data, reviews, [2, 4, 6], ["malformed", "missing business_id", "malformed"])
    with pytest.raises(DataError, match=f"{reviews}:2: malformed"):
        read_yelp(tmp_path, strict=True)


def test_text_template_fields_always_present(tmp_path):
    """Every metadata dict has every template field as a string, so str.format never fails."""
    write(tmp_path / "r.json", [repr(A14[0]), repr(A14[1])], gz=False)
    write(tmp_path / "m.json", [repr({"asin": "I1"}), repr({"asin": "I2", "title": ["A", "B"], "price": 0})], gz=False)
    data = read_amazon2014(tmp_path, "r.json", "m.json")
    template = "Title: {title}. Brand: {brand}. Categories: {categories}. Description: {description} {price}"
    assert template.format(**data.meta["I1"]) == "Title: . Brand: . Categories: . Description:  "
    assert template.format(**data.meta["I2"]) == "Title: A B. Brand: . Categories: . Description:  0"
