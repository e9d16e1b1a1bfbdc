"""Convert a GGUF model (the embedded SmolLM2) into a Hugging Face folder that vLLM can load.

Run with the engine venv's python (it has torch, transformers, gguf and accelerate):
    python _gguf_to_hf.py MODEL.gguf OUT_DIR

vLLM 0.32 cannot load ``.gguf`` files. transformers can read one (dequantising the weights) but
refuses ``save_pretrained`` on the model it read, so a plain model is built from the same config
(without its ``quantization_config``), given the dequantised weights, and saved with the
tokenizer. OUT_DIR is written whole or not at all (a temp folder renamed at the end).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def convert(gguf: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(loaded.state_dict(), strict=True)  # every weight, or stop here
    plain.tie_weights()
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    plain.save_pretrained(str(partial))
    tokenizer.save_pretrained(str(partial))
    partial.rename(out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: _gguf_to_hf.py MODEL.gguf OUT_DIR")
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
