"""A training step replayed on the simulated fabric: compute per layer, tensor-parallel (TP)
all-reduces on the critical path, data-parallel (DP) gradient buckets overlapped with the
backward pass (issue 45, item 5).

The step, for ``layers`` identical transformer layers (Megatron-style):

* forward: per layer ``forward`` seconds of compute, then ``tp_per_layer`` / 2 all-reduces of
  ``activation`` bytes over the TP group (attention and MLP outputs), each on the critical path;
* backward: per layer 2 x ``forward`` of compute and as many TP all-reduces (the input
  gradients); the layer's weight gradients (``gradient`` bytes per rank) join the current
  bucket, and a bucket of ``bucket`` bytes is all-reduced over the DP group as soon as it is
  full, on one communication stream (a bucket waits for the previous one), while the backward
  pass goes on -- PyTorch DDP's overlap;
* the step ends when the backward pass and the last bucket are done.

Each all-reduce is ``timed.simulate`` on the fabric: the TP group is ``tp`` ranks inside one
node (``tp_across_nodes=False``) or one rank on each of ``tp`` nodes (the seed's "TP across
nodes"); the DP group is ``dp`` ranks, one per node, on one rail (the same local rank of every
node, as NCCL's rings cross nodes). ``delay`` (seconds per DP rank) makes ranks late: a rank's
backward pass runs that much later, so its buckets are ready later, and every bucket's
all-reduce waits for it (``simulate(delay=)`` with each rank's own start).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .fabric import Fabric
from .timed import simulate

__all__ = ["Model", "StepTime", "step"]


@dataclass(frozen=True)
class Model:
    """One training step's shape: layers, seconds of forward compute per layer, bytes."""

    layers: int
    forward: float                   # seconds of forward compute per layer (backward: 2x)
    activation: int                  # bytes of one TP all-reduce
    gradient: int                    # bytes of weight gradients per layer per rank
    tp_per_layer: int = 4            # TP all-reduces per layer, forward and backward together
    bucket: int = 25 << 20           # DDP's default bucket, 25 MiB

    def __post_init__(self):
        if self.layers < 1 or self.forward < 0 or min(self.activation, self.gradient) < 0 \
                or self.bucket <= 0 or self.tp_per_layer < 0 or self.tp_per_layer % 2:
            raise ValueError(f"a model needs layers >= 1, forward >= 0, bytes >= 0, bucket > 0 "
                             f"and an even tp_per_layer, got {self}")


@dataclass
class StepTime:
    """A step's time and its parts (seconds)."""

    time: float
    compute: float                   # forward + backward compute alone
    tp: float                        # TP all-reduces (on the critical path)
    dp_exposed: float                # what the DP buckets add after the backward pass
    buckets: int
    parts: dict = field(default_factory=dict)

    @property
    def slowdown(self) -> float:
        """The step against its compute alone."""
        return self.time / self.compute if self.compute else float("inf")


def step(model: Model, fabric: Fabric, *, tp: int, dp: int, tp_across_nodes: bool = False,
         algorithm: str = "ring", dp_algorithm: str = "ring", delay=None) -> StepTime:
    """One training step of ``model`` with TP groups of ``tp`` and DP groups of ``dp`` ranks on
    nodes like ``fabric``'s (its preset re-sized for each group)."""
    tp_fabric = fabric.resized(tp, 1) if tp_across_nodes else fabric.resized(1, tp)
    t_tp = simulate("allreduce", algorithm, tp_fabric, model.activation).time if tp > 1 else 0.0
    half = model.tp_per_layer // 2
    fwd = model.layers * (model.forward + half * t_tp)
    per_layer_bwd = 2 * model.forward + half * t_tp
    # the buckets: which layer's backward fills each (layers run last to first)
    per_bucket = max(1, model.bucket // max(1, model.gradient))
    ready = [fwd + per_layer_bwd * min(model.layers, (b + 1) * per_bucket)
             for b in range(-(-model.layers // per_bucket))]
    sizes = [model.gradient * (min(model.layers, (b + 1) * per_bucket) - b * per_bucket)
             for b in range(len(ready))]
    end_compute = fwd + model.layers * per_layer_bwd
    late = np.zeros(dp) if delay is None else np.asarray(delay, dtype=np.float64)
    if late.shape != (dp,):
        raise ValueError(f"delay must be {dp} seconds (one per DP rank), got {late.shape}")
    dp_fabric = fabric.resized(dp, 1)
    free = np.zeros(dp)                  # each rank's communication stream
    times = []
    for t_ready, nbytes in zip(ready, sizes) if dp > 1 else ():
        start = np.maximum(t_ready + late, free)
        first = float(start.min())
        r = simulate("allreduce", dp_algorithm, dp_fabric, nbytes, delay=start - first)
        free = first + r.finish
        times.append(r.time)
    end = max(end_compute + float(late.max()), float(free.max()))
    compute = model.layers * 3 * model.forward
    return StepTime(end, compute, 2 * half * model.layers * t_tp,
                    max(0.0, end - end_compute - float(late.max())), len(ready),
                    {"tp_allreduce": t_tp, "dp_allreduces": times})
