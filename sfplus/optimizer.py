"""The ScheduleFree+ optimizer: AdamC + Schedule-Free averaging + a Polyak step size.

This module holds the class; the parts its step is made of live beside it: the step itself (with
the step size on the host or on the device) in :mod:`~curvecast.sfplus._step`, the maths in
:mod:`~curvecast.sfplus.functional`, :mod:`~curvecast.sfplus._device` and
:mod:`~curvecast.sfplus._kernels`, the compiled step in :mod:`~curvecast.sfplus._fused`, the
hyper-parameters' checks in :mod:`~curvecast.sfplus._hparams`, the state's layout and the
tensors a step gathers in :mod:`~curvecast.sfplus._state`, the weight norms of
``stats(norms=True)`` in :mod:`~curvecast.sfplus._stats` and the collectives in
:mod:`~curvecast.sfplus._distributed`.
The names of the statistics are :mod:`curvecast.contract`'s ``OPTIMIZER_STATS`` and
``NORM_STATS`` (``curvecast.sfplus.STATS_KEYS`` and ``NORM_STATS_KEYS``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

from curvecast.sfplus import _device, _hparams, _state, _stats, _step
from curvecast.sfplus import _distributed as _dist
from curvecast.sfplus import functional as F

__all__ = ["ScheduleFreePlus"]

LossLike = Tensor | float
Closure = Callable[[], LossLike]

#: Hyper-parameters added after the first release, with the value that means "as before".
_ADDED_LATER: dict[str, Any] = {"fused": None, "device_scalars": None}
#: ``torch.compile`` modes ``compile_mode`` accepts.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class ScheduleFreePlus(torch.optim.Optimizer):
    r"""ScheduleFree+ (the paper's Algorithm 1): learning-rate-free AdamC + Schedule-Free averaging.

    Three sequences are involved: ``z`` (the raw AdamC iterate), ``x`` (a weighted average of
    ``z``: the model to evaluate and ship) and ``y = beta x + (1 - beta) z`` (where gradients are
    taken). Each step ``t``, with gradient ``g`` and loss ``F`` measured at ``y``::

        tau     = min(t / anneal_steps, 1)
        beta_t  = 1 - exp((1 - tau) ln(1 - sf_beta) + tau ln(1 - sf_beta_max))
        I       = beta_t <g, z - x>                            # Taylor estimate of f(z) - f(y)
        e       = polyak_beta e + (1 - polyak_beta) sqrt(pi/2) ||g||_1
        e_hat   = e / (1 - polyak_beta^t)                      # bias-corrected, never written back
        eta     = max(0, F + I - f_star) / e_hat               # the Polyak step
        alpha   = min(1, t/warmup_steps) * lr * eta            # effective step size
        gamma_max = max(gamma_max, alpha)
        c       = 1 if t <= c_warmup else w_t / sum(w),  w_t = t^r gamma_max^weight_lr_power
        z      -= alpha^2 weight_decay y                       # fully decoupled AdamC decay
        z      -= alpha m_hat / (sqrt(v_hat) + eps)            # Adam step on z
        x       = (1 - c) x + c z
        y       = beta_t x + (1 - beta_t) z

    ``||g||_1`` and ``<g, z - x>`` run over *all* parameters of all groups; under
    ``torch.distributed`` the loss is averaged over the data-parallel group and sums over sharded
    (DTensor) parameters are added up across shards, so every rank takes the same step.

    Memory: besides the parameter (which holds ``y``) each parameter has three buffers, ``exp_avg``,
    ``exp_avg_sq`` and ``z_minus_y``; ``x`` is never stored because ``z - y = beta (z - x)``. That
    is 4 parameter-sized tensors in all, one more than AdamW.

    Synchronisation: on an accelerator (``device_scalars``) the step size is computed on the
    device and the update consumes it there: ``step()`` reads nothing on the host and never
    waits for the device. :meth:`stats` reads the last step's statistics when it is called (one
    transfer, then cached); :attr:`step_stats` hands them over unread (the client hook's
    background thread reads them). On CPU the loss and the two global sums are fetched in one
    transfer per step (free there) and the scalars are host arithmetic, which :meth:`stats`
    returns at no cost. ``stats(norms=True)`` costs one extra reduction pass and sync, only
    when asked.

    Train/eval: the parameters hold ``y`` in train mode (the default) and ``x`` in eval mode.
    Call :meth:`eval` before evaluating or saving a model for use, :meth:`train` before training
    again, or wrap evaluation in ``with opt.averaged(model): ...``. ``step()`` refuses to run in
    eval mode. Normalisation-layer running statistics are collected at ``y``, not ``x``; for
    BatchNorm models recompute them at ``x`` before evaluating.

    Args:
        params: parameters or parameter groups, as for any ``torch.optim.Optimizer``.
        lr: multiplier on the Polyak step size (1.0 = the paper's learning-rate-free setting).
        betas: Adam's ``(beta1, beta2)`` for the moments of ``z``'s update.
        eps: Adam's epsilon, and the initial ``gamma_max``.
        weight_decay: fully decoupled AdamC ``lambda``: ``z -= alpha^2 * lambda * y``. Not on the
            AdamW scale: the paper uses 5-50 and calls it necessary with the Polyak step, which
            otherwise grows as weight norms grow and gradient norms shrink. The default 5 is the
            paper's most used value, the best of its 5/20/50 on the corpus's small models and close
            to 20 at 1M parameters (BENCHMARKS.md, "train_quality" and "sfplus_corpus"); keep
            ``alpha**2 * lambda`` well below 1 (a 0.1M model with 50 diverged). ``0`` turns the
            decay off.
        sf_beta: Schedule-Free interpolation ``beta`` in ``(0, 1)`` (initial value if annealed).
            The default 0.8 is the paper's starting value (its long runs anneal 0.8 -> 0.965; its
            shorter ones keep 0.9). Measured here, 0.9 makes the eval loss at x climb for a few
            hundred steps once averaging starts (the paper's "hump") and ends higher
            (BENCHMARKS.md, "train_quality").
        sf_beta_max: final ``beta`` when annealing.
        anneal_steps: if ``> 0``, anneal ``beta`` log-linearly from ``sf_beta`` to ``sf_beta_max``
            over this many steps (the paper anneals 0.9 -> 0.965 over the run).
        warmup_steps: length of the linear multiplicative warmup ``min(1, t / warmup_steps)``.
            The paper: "a learning rate warmup is still needed" (its runs: 400-2,000 steps).
            Shorter warmups than the default 500, and no warmup at all, end at a higher loss on
            a 1M-parameter, 3,000-step run (BENCHMARKS.md, "train_quality"); for runs shorter
            than a few thousand steps use a tenth to a quarter of the run. ``0`` turns it off.
        c_warmup: steps without averaging (``c = 1``, so ``x`` follows ``z``); ``None`` means
            ``2 * warmup_steps``, the paper's heuristic.
        r: averaging weights grow as ``t^r`` (the paper recommends ``r = 1`` for long runs).
        weight_lr_power: averaging weights grow as ``gamma_max^weight_lr_power``.
        polyak_beta: EMA coefficient of the Polyak denominator, in ``[0, 1)``. The default 0.9 is
            the paper's: "We apply an exponential moving average (coefficient 0.9) to the
            stochastic estimates", and its L1-approximation study (Figure "l1_approximation") uses
            a 0.9 EMA because the per-batch denominator "is too noisy to be used in practice".
            The public reference defaults to 0 (no smoothing), which lets one small-gradient
            batch blow the step up (the paper's "vanishing denominators"). The bias correction
            makes the first steps unbiased, so no extra warmup is needed for the EMA itself.
        f_star: the loss floor in the numerator ``max(0, F + I - f_star)``; the paper uses 0.
            A parameter-group key, so it can be changed between steps (set it on every group).
        foreach: use the ``torch._foreach_*`` multi-tensor kernels. ``None`` picks them when all
            of a group's parameters are on an accelerator and the per-tensor path on CPU, where
            it walks tensors in cache-sized blocks and is faster.
        fused: compile the update with ``torch.compile`` so that it reads and writes each
            buffer once instead of about eleven times. With ``device_scalars`` the whole step
            (the two sums, the step size, the update of every tensor whatever its dtype) is one
            compiled call that reads each buffer at most twice and does not recompile when the
            step size or a hyper-parameter changes; with host scalars it is one compiled call
            for every float32 and float64 tensor (other dtypes: a compiled call per tensor of
            32K+ elements; non-contiguous tensors: the eager path). ``None`` (default) and
            ``False`` use the eager paths. The first step pays the compilation, once per
            parameter list (tens of seconds, on CPU and on GPUs; BENCHMARKS.md,
            "optimizer" and "optimizer_cuda"); where compilation is unavailable the eager path
            is used with a warning.
        device_scalars: compute the Polyak step, ``gamma_max`` and ``c_t`` on the device as
            tensors, so that ``step()`` never reads a tensor on the host. ``None`` (default):
            on accelerators, where each read waits for the device, and with ``fused=True``,
            whose one compiled call then holds the whole step; not for the eager paths on CPU,
            where a read is free and host arithmetic is cheaper than tensor operations
            (BENCHMARKS.md, "optimizer"). A whole-model setting: every parameter group must
            agree.
        compile_mode: ``torch.compile``'s ``mode`` for the compiled step of ``fused=True``
            with device scalars; ``"reduce-overhead"`` replays it as a CUDA graph (everything
            that changes between steps reaches it as a tensor, and the buffers it updates keep
            their addresses). ``None``: torch's default.
        process_group: the data-parallel group over which the loss is averaged under
            ``torch.distributed``; ``None`` means the default group.

    Raises:
        ValueError: for any invalid hyper-parameter; the message names it.

    Example:
        >>> opt = ScheduleFreePlus(model.parameters())  # weight_decay=5, warmup_steps=500
        >>> for batch in loader:
        ...     loss = model(batch)
        ...     loss.backward()
        ...     opt.step(loss=loss)
        ...     opt.zero_grad()
        >>> with opt.averaged(model):
        ...     evaluate(model)

    State (``state_dict()``): per parameter ``step`` (int), ``exp_avg``, ``exp_avg_sq`` and
    ``z_minus_y``; optimizer-wide scalars (step count, raw Polyak EMA and its weight, the SF beta
    that formed ``y``, the train/eval mode, and per group ``gamma_max`` and the weight sum) as
    plain Python numbers in the first parameter's state under ``"sfplus"`` (with device
    scalars, ``state_dict()`` reads them from the device first). Loading resumes a run exactly,
    including its train/eval mode.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1.0,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 5.0,
        sf_beta: float = 0.8,
        sf_beta_max: float = 0.965,
        anneal_steps: int = 0,
        warmup_steps: int = 500,
        c_warmup: int | None = None,
        r: float = 0.0,
        weight_lr_power: float = 2.0,
        polyak_beta: float = 0.9,
        f_star: float = 0.0,
        foreach: bool | None = None,
        *,
        fused: bool | None = None,
        device_scalars: bool | None = None,
        compile_mode: str | None = None,
        process_group: Any = None,
    ) -> None:
        defaults: dict[str, Any] = dict(  # noqa: C408 - mirrors the signature, like torch.optim
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            sf_beta=sf_beta,
            sf_beta_max=sf_beta_max,
            anneal_steps=anneal_steps,
            warmup_steps=warmup_steps,
            c_warmup=c_warmup,
            r=r,
            weight_lr_power=weight_lr_power,
            polyak_beta=polyak_beta,
            f_star=f_star,
            foreach=foreach,
            fused=fused,
            device_scalars=device_scalars,
        )
        defaults = _hparams.validate(defaults, where="")
        if compile_mode is not None and compile_mode not in COMPILE_MODES:
            raise ValueError(
                f"Invalid compile_mode: {compile_mode!r} (must be None or one of "
                f"{', '.join(COMPILE_MODES)})"
            )
        super().__init__(params, defaults)
        self._process_group = process_group
        self._compile_mode = compile_mode
        self._device_state = _device.DeviceState()
        #: The last step's statistics: floats (host scalars) or partly 0-d device tensors,
        #: views of ``_stats_vector`` (device scalars), read into ``_stats_read`` on demand.
        self._stats: Mapping[str, Any] = {}
        self._stats_vector: Tensor | None = None
        self._stats_read: dict[str, float] | None = None
        if self._anchor() is None:
            raise ValueError("ScheduleFreePlus got no parameters (every parameter group is empty)")
        self._global()  # created eagerly so that state_dict() carries the mode from the start

    # ----------------------------------------------------------------------------------------
    # torch.optim.Optimizer plumbing
    # ----------------------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group, validating its hyper-parameters (see the class docstring)."""
        super().add_param_group(param_group)  # fills in defaults, checks duplicates
        index = len(self.param_groups) - 1
        group = self.param_groups[index]
        try:
            group.update(_hparams.validate(group, where=f" (parameter group {index})"))
            if index > 0:
                _hparams.check_shared(self.param_groups)
            if any(torch.is_complex(p) for p in group["params"]):
                raise ValueError("ScheduleFreePlus does not support complex parameters")
        except ValueError:
            self.param_groups.pop()  # a refused group must not stay in a live optimizer
            raise

    def __getstate__(self) -> dict[str, Any]:
        """Pickle/deepcopy state: torch's (device scalars read back into it), plus the last
        step's telemetry (plain floats)."""
        self._write_back()
        state = super().__getstate__()
        state["_stats"] = dict(self._read_stats()) if "_stats" in self.__dict__ else {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore from a pickle or ``load_state_dict``; fill defaults added since a checkpoint."""
        super().__setstate__(state)
        # A pickle from before a hyper-parameter existed has neither it in its groups nor in its
        # own defaults: those get the value that reproduces the old behaviour.
        for key, value in _ADDED_LATER.items():
            self.defaults.setdefault(key, value)
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)
        self.__dict__.setdefault("_process_group", None)
        self.__dict__.setdefault("_compile_mode", None)
        self.__dict__.setdefault("_device_state", _device.DeviceState())
        self.__dict__.setdefault("_stats", {})
        self.__dict__.setdefault("_stats_vector", None)
        self.__dict__.setdefault("_stats_read", None)
        if self._anchor() is not None:
            self._global()

    def state_dict(self) -> dict[str, Any]:
        """The state dict of ``torch.optim.Optimizer``, with the optimizer-wide scalars as
        plain Python numbers (read from the device first when they live there)."""
        self._write_back()
        return super().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict; the train/eval mode and all scalars are restored exactly.

        The parameters must hold what they held when the state dict was saved (``y`` if it was
        saved in train mode, ``x`` in eval mode), as they do when the model's state dict is
        saved and loaded alongside.
        """
        super().load_state_dict(state_dict)
        self._device_state.drop()  # the loaded scalars replace what the device held
        self._set_stats({}, None)

    # ----------------------------------------------------------------------------------------
    # Optimizer-wide state
    # ----------------------------------------------------------------------------------------

    def _anchor(self) -> Tensor | None:
        for group in self.param_groups:
            if group["params"]:
                anchor: Tensor = group["params"][0]
                return anchor
        return None

    def _global(self) -> dict[str, Any]:
        anchor = self._anchor()
        if anchor is None:  # pragma: no cover - refused in __init__
            raise RuntimeError("ScheduleFreePlus has no parameters")
        state = self.state[anchor]
        glob: dict[str, Any] | None = state.get(_state.GLOBAL)
        if glob is None:
            glob = state[_state.GLOBAL] = _state.new_global(float(self.param_groups[0]["sf_beta"]))
        _state.cover_groups(glob, self.param_groups)
        return glob

    @property
    def train_mode(self) -> bool:
        """True while the parameters hold ``y`` (training), False while they hold ``x``."""
        return bool(self._global()["train_mode"])

    @property
    def step_count(self) -> int:
        """Number of steps taken."""
        return int(self._global()["step"])

    def _write_back(self) -> None:
        """Bring the checkpointed scalars up to date with the device's (one read, if behind)."""
        device_state = self.__dict__.get("_device_state")
        if device_state is not None and device_state.ahead and self._anchor() is not None:
            device_state.write_back(self._global())

    def _use_foreach(self, group: dict[str, Any]) -> bool:
        if group["foreach"] is not None:
            return bool(group["foreach"])
        # Like torch.optim: multi-tensor kernels on accelerators; on CPU the blocked per-tensor
        # path is faster because it keeps each block in cache across all operations.
        return bool(group["params"]) and all(p.device.type != "cpu" for p in group["params"])

    # ----------------------------------------------------------------------------------------
    # Train / eval
    # ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def eval(self) -> None:
        """Make the parameters hold ``x`` (the averaged model). Idempotent."""
        glob = self._global()
        if glob["train_mode"]:
            self._swap(to_x=True, sf_beta_prev=glob["sf_beta_prev"])
            glob["train_mode"] = False

    @torch.no_grad()
    def train(self) -> None:
        """Make the parameters hold ``y`` (where gradients are taken). Idempotent."""
        glob = self._global()
        if not glob["train_mode"]:
            self._swap(to_x=False, sf_beta_prev=glob["sf_beta_prev"])
            glob["train_mode"] = True

    def _swap(self, *, to_x: bool, sf_beta_prev: float) -> None:
        for group in self.param_groups:
            params: list[Tensor] = []
            deltas: list[Tensor] = []
            for p in group["params"]:
                delta = self.state.get(p, {}).get(_state.DELTA)
                if delta is not None:
                    params.append(_dist.local(p))
                    deltas.append(_dist.local(delta))
            swap = F.swap_y_to_x if to_x else F.swap_x_to_y
            swap(params, deltas, sf_beta_prev=sf_beta_prev, foreach=self._use_foreach(group))

    @contextlib.contextmanager
    def averaged(self, module: torch.nn.Module | None = None) -> Iterator[None]:
        """Context manager: parameters hold ``x`` inside, and whatever they held before after.

        Args:
            module: optionally, a module to put in ``eval()`` mode inside the block as well
                (its previous ``training`` flag is restored on exit).

        Example:
            >>> with opt.averaged(model):
            ...     val_loss = evaluate(model)
        """
        was_training = self.train_mode
        module_training = module.training if module is not None else False
        self.eval()
        if module is not None:
            module.eval()
        try:
            yield
        finally:
            if module is not None:
                module.train(module_training)
            if was_training:
                self.train()

    # ----------------------------------------------------------------------------------------
    # The step
    # ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(  # type: ignore[override]
        self, closure: Closure | None = None, *, loss: LossLike | None = None
    ) -> LossLike | None:
        """Take one ScheduleFree+ step.

        The Polyak step size needs the loss at the current parameters ``y``: pass it as
        ``loss=`` (a float or a 0-d tensor; a tensor costs no extra synchronisation) or pass a
        ``closure`` that recomputes it (called with gradients enabled).

        Args:
            closure: re-evaluates the model and returns the loss.
            loss: the loss of the batch whose gradients are in ``.grad``. Under
                ``torch.distributed`` pass this rank's loss: it is averaged across ranks.

        Returns:
            The loss, as given or as returned by the closure.

        Raises:
            RuntimeError: if called in eval mode.
            ValueError: if neither or both of ``closure`` and ``loss`` are given, or the loss is
                not a scalar.
        """
        if closure is not None and loss is not None:
            raise ValueError(
                "ScheduleFreePlus.step(): pass the loss as `loss=` or a `closure`, not both"
            )
        glob = self._global()
        if not glob["train_mode"]:
            raise RuntimeError(
                "ScheduleFreePlus.step() called in eval mode: the parameters hold the averaged "
                "point x. Call optimizer.train() before training (and optimizer.eval() before "
                "evaluating), or evaluate inside `with optimizer.averaged(): ...`."
            )
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if loss is None:
            loss = self.__dict__.pop("_provided_loss", None)
        if loss is None:
            raise ValueError(
                "ScheduleFreePlus.step() needs the loss at the current parameters for its Polyak "
                "step size: call optimizer.step(loss=loss) (a float or 0-d tensor) or "
                "optimizer.step(closure); under a trainer that calls step() with no arguments, "
                "hand it over first with optimizer.provide_loss(loss) (the Hugging Face "
                "Trainer: add curvecast's CurvecastCallback, which does)."
            )
        _step.check_loss(loss)
        _hparams.check_shared(self.param_groups)
        self._step(loss, glob)
        return loss

    def provide_loss(self, loss: LossLike) -> None:
        """Give the loss for the next :meth:`step` that is called without one.

        For training loops that call ``optimizer.step()`` with no arguments (the Hugging Face
        ``Trainer``): whoever sees the loss hands it over just before. Used once, then
        forgotten; never saved in ``state_dict()``. A ``loss=`` or ``closure`` passed to
        ``step()`` takes precedence and leaves it for the next step.

        Args:
            loss: the loss of the optimizer step about to be taken, at ``y`` (with gradient
                accumulation: the mean over the micro-batches); a float or a 0-d tensor.

        Raises:
            ValueError: if the loss is neither a real number nor a tensor.
        """
        _step.check_loss(loss)
        self._provided_loss = loss

    def _step(self, loss: LossLike, glob: dict[str, Any]) -> None:
        step = _step.begin(self.param_groups, self.state, glob,
                           [self._use_foreach(group) for group in self.param_groups])
        if step is None:
            return
        device_scalars = self.param_groups[0]["device_scalars"]
        if device_scalars is None:
            # On CPU a host read is free and host arithmetic cheaper than eager tensor
            # operations, but the fused step does the sums and the scalars in its one call.
            device_scalars = step.device.type != "cpu" or any(
                group["fused"] for group in self.param_groups)
        if device_scalars:
            stats, vector = _step.device_step(
                self.param_groups, step, loss, glob, process_group=self._process_group,
                device_state=self._device_state, compile_mode=self._compile_mode)
            self._set_stats(stats, vector)
        else:
            self._device_state.write_back(glob)  # switched from device scalars: catch up first
            self._device_state.drop()
            self._set_stats(_step.host_step(self.param_groups, step, loss, glob,
                                            process_group=self._process_group), None)
        _step.finish(step)

    def _set_stats(self, stats: Mapping[str, Any], vector: Tensor | None) -> None:
        self._stats, self._stats_vector, self._stats_read = stats, vector, None

    def _read_stats(self) -> Mapping[str, float]:
        """The last step's statistics as floats; device values read once (one transfer)."""
        if self._stats_vector is None:
            return self._stats
        if self._stats_read is None:
            values = iter(self._stats_vector.tolist())
            self._stats_read = {key: next(values) if isinstance(value, Tensor) else value
                                for key, value in self._stats.items()}
        return self._stats_read

    # ----------------------------------------------------------------------------------------
    # Observability
    # ----------------------------------------------------------------------------------------

    def stats(self, norms: bool = False) -> dict[str, float]:
        """Telemetry of the last step, as plain floats (``{}`` before the first step).

        Keys (all global, except ``alpha``, ``gamma_max``, ``c`` and ``warmup``, which are those
        of the first parameter group):

        * ``step``: the step number ``t``.
        * ``loss``: ``F``, the loss at ``y`` (averaged over data-parallel ranks).
        * ``inner``: ``I = beta_t <g, z - x>``.
        * ``numerator``: ``F + I - f_star``, *before* clipping at 0.
        * ``grad_l1``: ``||g||_1`` over all parameters.
        * ``denom_ema``: the bias-corrected EMA of ``sqrt(pi/2) ||g||_1`` (the denominator).
        * ``eta``: the Polyak scalar; ``alpha``: the effective step ``warmup * lr * eta``.
        * ``gamma_max``: running max of ``alpha``; ``c``: the averaging weight.
        * ``sf_beta``: SF beta of the step; ``warmup``: the warmup factor.

        With ``norms=True`` also ``x_l2``, ``y_l2``, ``z_l2`` (the iterates *after* the step) and
        ``grad_l2``. These cost a reduction pass over the parameters and one device sync, so
        they are computed only when asked. The other keys cost nothing with host scalars (read
        during the step); with device scalars the first call after a step reads them from the
        device in one transfer (it waits for the step to finish) and later calls reuse it.
        """
        out = dict(self._read_stats())
        if norms and out:
            out.update(self._norms())
        return out

    @property
    def step_stats(self) -> Mapping[str, Any]:
        """The last step's statistics as they are, not copied or read: for a hook that runs
        every step.

        Each step makes a new mapping and never changes it afterwards, so a reference to it
        keeps that step's values. Its keys are :meth:`stats`'s; with host scalars its values
        are floats, with device scalars those computed on the device are 0-d tensors there
        (``step``, ``sf_beta`` and ``warmup`` are floats), which whoever keeps them reads later
        (``Monitor.watch`` reads them in its background thread), so that the training step
        never waits for the device. Read-only: :meth:`stats` returns plain floats to change.
        """
        return self._stats

    def _norms(self) -> dict[str, float]:
        glob = self._global()
        return _stats.weight_norms(
            (
                (p, self.state.get(p, {}).get(_state.DELTA))
                for group in self.param_groups
                for p in group["params"]
            ),
            sf_beta_prev=float(glob["sf_beta_prev"]),
            train_mode=bool(glob["train_mode"]),
        )

    def config(self) -> dict[str, Any]:
        """The hyper-parameters (of the first parameter group) as a JSON-ready dict.

        ``c_warmup`` is the effective value (``2 * warmup_steps`` when it was left as ``None``).
        Meant to be sent as a run's configuration to the monitoring service.
        """
        g = self.param_groups[0]
        return {
            "optimizer": type(self).__name__,
            "lr": float(g["lr"]),
            "betas": [float(b) for b in g["betas"]],
            "eps": float(g["eps"]),
            "weight_decay": float(g["weight_decay"]),
            "sf_beta": float(g["sf_beta"]),
            "sf_beta_max": float(g["sf_beta_max"]),
            "anneal_steps": int(g["anneal_steps"]),
            "warmup_steps": int(g["warmup_steps"]),
            "c_warmup": F.resolve_c_warmup(g["c_warmup"], g["warmup_steps"]),
            "r": float(g["r"]),
            "weight_lr_power": float(g["weight_lr_power"]),
            "polyak_beta": float(g["polyak_beta"]),
            "f_star": float(g["f_star"]),
            "param_groups": len(self.param_groups),
            "num_parameters": sum(p.numel() for grp in self.param_groups for p in grp["params"]),
        }
