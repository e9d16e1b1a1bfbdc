"""The embedded CPU model: llama.cpp running SmolLM2-135M-Instruct, no key and no GPU needed.

Install with ``pip install -e '.[local]'`` in the mmirage checkout (the model file is
fetched on first use, see ``model_file``). The model is text-only: image parts of a
message are ignored.
"""

from llm_kit.local.engine import LocalEngine
from llm_kit.local.model_file import MODEL_PATH_ENV, default_model_path

__all__ = ["MODEL_PATH_ENV", "LocalEngine", "default_model_path"]
