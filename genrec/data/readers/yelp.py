"""The Yelp academic dataset (JSON lines): reviews are the interactions, businesses the items.

The dump needs a manual download (license click-through): https://business.yelp.com/data/resources/open-dataset/
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from genrec.data.readers.amazon import read_lines, timed
from genrec.data.readers.common import RawData


def epoch(value: object) -> float:
    """"YYYY-MM-DD HH:MM:SS" (UTC; a bare date also works) -> seconds since 1970."""
    if not isinstance(value, str):
        raise ValueError(f"date {value!r} is not a string")
    t = datetime.fromisoformat(value.strip())
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def read_yelp(root: str, reviews: str = "yelp_academic_dataset_review.json",
              business: str | None = "yelp_academic_dataset_business.json", strict: bool = False) -> RawData:
    fields = {"name": ("name", " "), "city": ("city", " "), "state": ("state", " "),
              "categories": ("categories", ", ")}
    return read_lines(root, reviews, business, timed(json.loads, "date", epoch),
                      "user_id", "business_id", "date", "business_id", fields, strict)
