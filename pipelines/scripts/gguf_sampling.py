"""Print, as JSON, the general.sampling.* keys llama.cpp's converter writes for a model directory.

Run by the llama.cpp converter venv's python (gguf-py from the pinned tree) through pipelines.core.runner.run, never
imported by modelmint:

    gguf_sampling.py MODEL_DIR

The converter reads generation_config.json in gguf-py's Metadata.load and writes the sampling defaults with
Metadata.set_gguf_meta_model; this runs the same two calls into a writer that writes no file and prints
{key: [GGUFValueType, value]}. A metadata-only upstream change rewrites these keys in the GGUFs already built
(pipelines/gguf/retemplate.py) with what a full conversion would write.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf


def main() -> None:
    model_dir = Path(sys.argv[1])
    meta = gguf.Metadata.load(None, model_dir, model_dir.name, 0)
    writer = gguf.GGUFWriter(None, arch="llama")
    meta.set_gguf_meta_model(writer)
    keys = {k: [int(v.type), v.value] for k, v in writer.kv_data[0].items() if k.startswith("general.sampling.")}
    print(json.dumps(keys))


if __name__ == "__main__":
    main()
