"""Merging: published shards into one dataset (``shards``), and batch results into the rows
that wait for them (``row_rebuild``, ``merged_output``)."""
