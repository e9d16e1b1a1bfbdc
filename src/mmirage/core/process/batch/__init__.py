"""The ``batch_api`` processor: provider configs, adapters, chunking, receipts, collection."""
