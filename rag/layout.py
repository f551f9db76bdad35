"""What a knowledge folder holds, by name, importable without the heavy parts of ``rag``.

The GUI looks at these at start-up (is there a knowledge base yet? is the store as last found
good?) on its own thread: importing ``rag.knowledge`` for two names would import numpy, the
embedder and the store there, hundreds of milliseconds before the window is shown.
"""

from __future__ import annotations

REGISTRY_FILE = "registry.sqlite3"
"""The document registry (the truth) inside a knowledge folder."""
CHROMA_FOLDER = "chroma"
"""The vector index (rebuildable from the registry) inside a knowledge folder."""
