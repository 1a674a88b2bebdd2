"""Semantic IDs, the catalogue's vocabulary:

- `codes`: `SemanticIds` (each item's code tuple, token ids, colliding items as one candidate);
- `tokenizers`: how codes are made (RQ-K-means over item embeddings, or a precomputed index file);
- `trie`: the prefix tree of valid code tuples, used by constrained decoding and the objectives.
"""
