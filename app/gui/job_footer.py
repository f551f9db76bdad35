"""The footer of a dialog that runs one long job: a progress bar, a status line, Start and Cancel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QBoxLayout, QDialogButtonBox, QLabel, QProgressBar, QPushButton

from app.gui.display_text import plain_label

if TYPE_CHECKING:
    from app.gui.workers.transfers import Transfer


@dataclass
class JobFooter:
    """The widgets of the footer; the dialog connects the buttons."""

    progress: QProgressBar
    status: QLabel
    buttons: QDialogButtonBox
    start_button: QPushButton
    cancel_button: QPushButton

    def cancel_job(self, transfer: Transfer) -> None:
        """Asks a running job to stop: sets its cancel event, says "Cancelling…" and disables Cancel
        (the dialog stays open until the job has stopped)."""
        transfer.cancel.set()
        self.status.setText("Cancelling…")
        self.cancel_button.setEnabled(False)


def add_job_footer(layout: QBoxLayout, start_text: str) -> JobFooter:
    """Adds a hidden progress bar (its room kept while hidden, so showing it moves nothing), a
    plain-text status line and a button box with a primary ``start_text`` button and Cancel to
    ``layout``."""
    progress = QProgressBar()
    progress.setVisible(False)
    policy = progress.sizePolicy()
    policy.setRetainSizeWhenHidden(True)
    progress.setSizePolicy(policy)
    status = plain_label("")
    status.setWordWrap(True)
    layout.addWidget(progress)
    layout.addWidget(status)
    buttons = QDialogButtonBox()
    start = buttons.addButton(start_text, QDialogButtonBox.ButtonRole.AcceptRole)
    start.setObjectName("primary")
    cancel = buttons.addButton(QDialogButtonBox.StandardButton.Cancel)
    layout.addWidget(buttons)
    return JobFooter(progress, status, buttons, start, cancel)
