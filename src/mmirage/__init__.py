"""MMIRAGE: declarative dataset pipelines through LLMs, on top of llm_kit."""
