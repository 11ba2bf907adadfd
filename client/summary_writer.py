"""``SummaryWriter``: ``torch.utils.tensorboard.SummaryWriter``'s scalar logging, streamed to a
curvecast service through :class:`~curvecast.client.Monitor`.

Code written for TensorBoard switches with its import line::

    # from torch.utils.tensorboard import SummaryWriter
    from curvecast import SummaryWriter

    writer = SummaryWriter("runs/exp1")               # the run's name: runs/exp1
    writer.add_scalar("Loss/train", loss, global_step=step)
    writer.add_scalars("Loss", {"train": a, "val": b}, step)   # keys Loss/train, Loss/val
    writer.close()

Tags become metric keys by the contract's rule (:func:`curvecast.contract.key_for_name`, the
rule ``curvecast import tensorboard`` applies to the same tags): a tag that is a valid key is
kept, other characters become ``_``. ``add_scalars(main, {tag: v})`` logs ``main/tag``. A
call without ``global_step`` logs at the step after that key's last one (TensorBoard would put
every such point at step 0, where the service keeps only the first). ``walltime`` is each
point's wall time. ``new_style`` and ``double_precision`` are accepted and change nothing (the
service stores float64). ``purge_step``, ``max_queue``, ``flush_secs`` and
``filename_suffix`` concern event files and are accepted and ignored: the monitor sends a batch
every second. ``add_hparams`` merges its hyper-parameters into the run's config and logs its
metrics. The other ``add_*`` methods (histograms, images, text, graphs, ...) record nothing and
warn once each. Standard library only, like the rest of the client.
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from curvecast.client._monitor import Monitor
from curvecast.contract import key_for_name

__all__ = ["SummaryWriter"]


def _default_log_dir(comment: str) -> str:
    """TensorBoard's default run directory name: ``runs/<Mon DD_HH-MM-SS>_<host><comment>``."""
    stamp = datetime.now().strftime("%b%d_%H-%M-%S")
    return os.path.join("runs", f"{stamp}_{socket.gethostname()}{comment}")


def _scalar(value: Any) -> Any:
    """A one-element array or tensor as the 0-d value ``Monitor.log`` takes (TensorBoard's
    ``add_scalar`` squeezes one)."""
    ndim = getattr(value, "ndim", 0)
    if ndim and hasattr(value, "reshape"):
        size = value.numel() if callable(getattr(value, "numel", None)) else value.size
        if size == 1:
            return value.reshape(())
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return value.item()
    return value


class SummaryWriter:
    """Scalars logged as with ``torch.utils.tensorboard.SummaryWriter``, sent to curvecast.

    Args:
        log_dir: the run's name (TensorBoard's directory); default ``runs/<date>_<host>``
            followed by ``comment``.
        comment: appended to the default ``log_dir`` (ignored when ``log_dir`` is given).
        purge_step, max_queue, flush_secs, filename_suffix: accepted for compatibility; they
            change nothing.
        **monitor_args: passed to :class:`~curvecast.client.Monitor` (``url``, ``project``,
            ``config``, ``total_steps``, ``token``, ``run_id``, ...). ``config={"fit_key":
            "Loss/val"}`` names the series to forecast when its tag is not one of the
            contract's loss names (``loss``, ``eval/loss``, ``val_loss``, ...).
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        comment: str = "",
        purge_step: int | None = None,
        max_queue: int = 10,
        flush_secs: int = 120,
        filename_suffix: str = "",
        **monitor_args: Any,
    ) -> None:
        self.log_dir = os.fspath(log_dir) if log_dir is not None else _default_log_dir(comment)
        self._walltime: float | None = None
        self._keys: dict[str, str | None] = {}
        self._next_step: dict[str, int] = {}
        self._warned: set[str] = set()
        monitor_args.setdefault("run_name", self.log_dir[-200:] or "runs")
        self.monitor = Monitor(wall_clock=self._wall_clock, **monitor_args)

    # -- what Monitor reads --------------------------------------------------------------------

    def _wall_clock(self) -> float:
        # Monitor.log reads the wall time of its points from here, in the calling thread: the
        # add_* call's walltime while it runs, else the clock.
        walltime = self._walltime
        return time.time() if walltime is None else walltime

    def _key(self, tag: str) -> str | None:
        try:
            return self._keys[tag]
        except KeyError:
            key = self._keys[tag] = key_for_name(str(tag))
            if key is None:
                warnings.warn(f"curvecast: tag {tag!r} has no character a metric name may "
                              "hold; its points are not sent", RuntimeWarning, stacklevel=3)
            return key

    def _log(self, points: Mapping[str, Any], global_step: Any, walltime: Any) -> None:
        if not points:
            return
        if global_step is None:
            step = max(self._next_step.get(key, 0) for key in points)
        else:
            step = int(global_step)
        for key in points:
            self._next_step[key] = step + 1
        self._walltime = None if walltime is None else float(walltime)
        try:
            self.monitor.log(step, points)
        finally:
            self._walltime = None

    # -- TensorBoard's API ---------------------------------------------------------------------

    def add_scalar(self, tag: str, scalar_value: Any, global_step: Any = None,
                   walltime: Any = None, new_style: bool = False,
                   double_precision: bool = False) -> None:
        """Log ``scalar_value`` under ``tag``'s key at ``global_step`` (default: the step after
        that key's last one) with wall time ``walltime`` (default: now)."""
        key = self._key(tag)
        if key is not None:
            self._log({key: _scalar(scalar_value)}, global_step, walltime)

    def add_scalars(self, main_tag: str, tag_scalar_dict: Mapping[str, Any],
                    global_step: Any = None, walltime: Any = None) -> None:
        """Log each ``{tag: value}`` under ``main_tag/tag``'s key, at one step."""
        points = {}
        for tag, value in tag_scalar_dict.items():
            key = self._key(f"{main_tag}/{tag}")
            if key is not None:
                points[key] = _scalar(value)
        self._log(points, global_step, walltime)

    def add_hparams(self, hparam_dict: Mapping[str, Any], metric_dict: Mapping[str, Any],
                    hparam_domain_discrete: Any = None, run_name: str | None = None,
                    global_step: Any = None) -> None:
        """Merge ``hparam_dict`` into the run's config and log ``metric_dict``'s values."""
        self.monitor.update_config({str(k): _scalar(v) for k, v in hparam_dict.items()})
        for tag, value in metric_dict.items():
            self.add_scalar(tag, value, global_step)

    def flush(self) -> None:
        """Wait until what was logged so far is stored (up to the monitor's
        ``flush_timeout``; what is not sent by then stays queued)."""
        self.monitor.flush()

    def close(self) -> None:
        """Send everything and mark the run finished (as ``Monitor.finish()``)."""
        self.monitor.finish()

    def get_logdir(self) -> str:
        """The run's name (TensorBoard's log directory)."""
        return self.log_dir

    @property
    def run_id(self) -> str:
        """The curvecast run's id."""
        return self.monitor.run_id

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.monitor.finish("failed" if exc_type is not None else "finished")

    def __getattr__(self, name: str) -> Callable[..., None]:
        # add_histogram, add_image, add_text, add_graph, ...: TensorBoard code calls them;
        # curvecast records scalars only.
        if not name.startswith("add_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

        def ignored(*args: Any, **kwargs: Any) -> None:
            if name not in self._warned:
                self._warned.add(name)
                warnings.warn(f"curvecast.SummaryWriter records scalars only: {name}() does "
                              "nothing (warned once)", RuntimeWarning, stacklevel=2)

        return ignored

    def __repr__(self) -> str:
        return f"SummaryWriter(log_dir={self.log_dir!r}, run_id={self.run_id!r})"
