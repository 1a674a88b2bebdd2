"""genrec: generative recommendation with semantic IDs."""

__version__ = "0.1.0"
