"""Turning processed rows into datasets: the output-schema renderer (``renderer``) and writers."""
