"""Rich progress bars for huggingface_hub downloads, on stderr.

huggingface_hub drives a tqdm-like object (constructor with desc/total/initial, update,
close, context manager); this adapter forwards those calls to one rich Progress.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from huggingface_hub import constants
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


@dataclass
class DownloadProgress:
    progress: Progress | None  # None when bars are off

    def tqdm_class(self, label: str) -> type:
        """A bar class for one file; huggingface_hub would label it with a truncated URL."""
        return _rich_bar(self.progress, label) if self.progress is not None else _silent_bar()


@contextmanager
def download_progress(enabled: bool = True, console: Console | None = None) -> Iterator[DownloadProgress]:
    """Bars on stderr unless disabled here or by HF_HUB_DISABLE_PROGRESS_BARS."""
    if not enabled or constants.HF_HUB_DISABLE_PROGRESS_BARS:
        yield DownloadProgress(None)
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console or Console(stderr=True),
        transient=False,
    )
    with progress:
        yield DownloadProgress(progress)


def _rich_bar(progress: Progress, label: str) -> type:
    class RichBar:
        def __init__(self, *_: Any, total: float | None = None, initial: int = 0, **__: Any) -> None:
            self._task = progress.add_task(label, total=total, completed=initial)

        def update(self, n: float = 1) -> None:
            progress.advance(self._task, n)

        def close(self) -> None:
            progress.refresh()

        def __enter__(self) -> "RichBar":
            return self

        def __exit__(self, *_: Any) -> None:
            self.close()

    return RichBar


def _silent_bar() -> type:
    class SilentBar:
        def __init__(self, *_: Any, **__: Any) -> None:
            pass

        def update(self, n: float = 1) -> None:
            pass

        def close(self) -> None:
            pass

        def __enter__(self) -> "SilentBar":
            return self

        def __exit__(self, *_: Any) -> None:
            pass

    return SilentBar
