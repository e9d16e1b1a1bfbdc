"""Rendering a row: its input variables, the prompts, and the ``output_schema`` columns."""
