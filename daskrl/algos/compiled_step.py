"""A gradient step compiled whole: the loss, its gradients, the clip and the optimiser step.

On a CPU most of a small network's gradient step is the fixed cost of each torch call
(dispatch, autograd bookkeeping, the optimiser's per-parameter loop), not arithmetic.
:class:`CompiledStep` hands the whole step to ``torch.compile``, as LeanRL compiles its
update: ``torch.autograd.grad`` is traced into the graph (dynamo's ``trace_autograd_ops``),
so inductor fuses the forward, the backward and the element-wise work of the clip and the
Adam step into a few kernels. The optimiser must be one the compiler can enter:
:func:`compilable_adam`.

Inductor keeps what it compiles in its on-disk cache (on by default, under
``$TORCHINDUCTOR_CACHE_DIR``, default ``/tmp/torchinductor_<user>``): a later process, a
worker of the next run, loads the kernels instead of compiling again (it still traces the
step, a few seconds). Point ``TORCHINDUCTOR_CACHE_DIR`` at a shared directory for workers on
several hosts. :func:`compile_seconds` says what compiling cost (``compile_s`` in the
metrics).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor


def compilable_adam(params: Iterable[Tensor], lr: float, eps: float = 1e-8
                    ) -> torch.optim.Adam:
    """``torch.optim.Adam`` whose step ``torch.compile`` traces: the learning rate a tensor
    (changed in place by :func:`~daskrl.algos.gradient_update.set_learning_rate`, so an
    annealed rate does not recompile the step) and the per-parameter loop
    (``foreach=False``), which inductor fuses. The eager default here, ``fused=True``, is one
    opaque kernel the compiler does not enter.

    Examples
    --------
    >>> opt = compilable_adam(torch.nn.Linear(2, 1).parameters(), 1e-3)
    >>> torch.is_tensor(opt.param_groups[0]["lr"]), opt.defaults["foreach"]
    (True, False)
    """
    return torch.optim.Adam(params, lr=torch.tensor(lr, dtype=torch.float64), eps=eps,
                            foreach=False)


def _not_the_optimizer_profiler_note(record: logging.LogRecord) -> bool:
    # every torch.optim step opens a profiler range, which dynamo drops with a warning on
    # the user's terminal; nothing is lost (no profiler runs), so the note is left out
    return not str(record.msg).startswith("Profiler record function")


def compile_seconds() -> float:
    """Seconds this process has spent compiling (tracing, inductor's code generation or its
    cache loads, every recompile included), as torch itself records them.

    Examples
    --------
    >>> compile_seconds() >= 0.0
    True
    """
    from torch._dynamo.utils import compilation_time_metrics

    return float(sum(compilation_time_metrics.get("_compile.compile_inner", ())))


class CompiledStep:
    """``fn`` compiled by ``torch.compile`` with ``torch.autograd.grad`` traced into its
    graph.

    Examples
    --------
    >>> net = torch.nn.Linear(2, 1)
    >>> def grads(x):
    ...     return torch.autograd.grad(net(x).sum(), list(net.parameters()))
    >>> step = CompiledStep(grads)
    >>> before = compile_seconds()
    >>> [g.shape for g in step(torch.ones(3, 2))]
    [torch.Size([1, 2]), torch.Size([1])]
    >>> compile_seconds() > before
    True
    """

    def __init__(self, fn: Callable[..., Any], batch_varies: bool = False) -> None:
        notes = logging.getLogger("torch._dynamo.variables.ctx_manager")
        if _not_the_optimizer_profiler_note not in notes.filters:
            notes.addFilter(_not_the_optimizer_profiler_note)
        self.eager = fn
        self.batch_varies = batch_varies
        """The first dimension of the tensors passed (their rows) changes between calls."""
        self._compiled: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> Any:
        if self._compiled is None:  # on first use: a learner built only for its initial
            # weights (the driver's) never imports the compiler
            self._compiled = torch.compile(self.eager)
            if self.batch_varies:
                # compile for any row count at once: otherwise the first call compiles for
                # its own and the second, of another size, compiles again (seconds each)
                for t in _tensors(args):
                    torch._dynamo.maybe_mark_dynamic(t, 0)
        # dynamo breaks the graph at autograd.grad unless told to trace it
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            return self._compiled(*args)


def _tensors(value: Any) -> list[Tensor]:
    """The tensors in ``value`` (tensors, or lists, tuples and dicts of them, nested)."""
    if isinstance(value, Tensor):
        return [value] if value.dim() else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []
