"""The progress bar of a run: one tick per global iteration, the last accuracy and virtual time beside it."""

from __future__ import annotations

from typing import Any


def open_bar(enabled: bool, total: int, initial: int, desc: str) -> Any:
    """A tqdm bar of ``total`` global iterations starting at ``initial``, or None when not ``enabled``."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="it", leave=True)


def show(bar: Any, accuracy: float, virtual_time: float) -> None:
    """Show the last test accuracy and the virtual time (seconds) beside ``bar`` (None: nothing)."""
    if bar is not None:
        bar.set_postfix(acc=f"{accuracy:.4f}", vtime=f"{virtual_time:.1f}s")


def tick(bar: Any) -> None:
    """Count one global iteration on ``bar`` (None: nothing)."""
    if bar is not None:
        bar.update(1)


def close_bar(bar: Any) -> None:
    """Close ``bar`` (None: nothing); the caller drops its reference."""
    if bar is not None:
        bar.close()
