"""The Qt front end: the main window, its panels and dialogs, and the Qt adapters over the workers
(``app.gui.workers``). The only part of ``app`` that imports PySide6."""
