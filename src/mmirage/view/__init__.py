"""``mmirage view``: a read-only local web page of one pipeline, live while it runs and after.

Everything shown is read from the files a run already writes (status.json, checkpoints, part
files, published shards, receipts, the results store): the page never writes a file, never
asks a provider anything, and every value from data or a model is shown as escaped text.
"""
