"""The embedded world: scenes, captions, analytic rewards and the tiny model's pretraining."""

from pathlib import Path

# The embedded world's committed base model. Named here, where neither the registry nor the
# loader is imported, so that checking it imports no diffusers (whose import-time warnings would
# spill onto a one-line error) and the loader and the registry need not import each other.
SHAPES_TINY_CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "shapes-tiny.safetensors"
