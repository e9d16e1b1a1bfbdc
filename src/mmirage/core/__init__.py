"""The pipeline's engine parts: loading, processing and writing rows."""
