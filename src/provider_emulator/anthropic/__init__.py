"""The Anthropic wire format: Messages and Message Batches."""
