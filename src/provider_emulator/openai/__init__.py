"""The OpenAI wire format: Chat Completions, Files, Batches."""
