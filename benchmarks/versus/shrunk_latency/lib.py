"""Inference latency of hand-shrunk networks over their dense ones, per inference path.

What issue 23's latency criteria rest on, measured without any pruning
library: the MLP and the ResNet of `experiments.common.structured.models` are built
dense and with a `fraction` of every unit group removed
(`structured_widths.shrunk`, the widths Torch-Pruning leaves), in Keras and
(with `torch` installed) in PyTorch, and timed side by side by every
inference path of each framework (`latency.KERAS_PATHS`,
`torch_models.TORCH_PATHS`) at each batch size. A row per (framework,
architecture, path, batch) gives the dense and shrunk times and the paired
ratio shrunk/dense over interleaved rounds, with the parameters and MACs of
both (`experiments.common.model_cost`; Torch-Pruning counts the same).
"""

import dataclasses
import os

import tensorflow as tf
from absl import logging

from benchmarks import harness
from experiments.common import latency, model_cost
from experiments.common.structured import models as structured_models
from experiments.common.structured import widths as structured_widths

__all__ = ["Config", "format_table", "machine", "run"]

FRAMEWORKS = ("keras", "torch")


@dataclasses.dataclass(frozen=True)
class Config:
    """What to time; the defaults are issue 23's networks on a 2-core CPU.

    `threads` is `(intra_op, inter_op)` for both frameworks (0 leaves each
    framework's default). Each round calls each model enough times in a row
    to last about `round_seconds`.

    Attributes:
      dataset: Input shape of the networks.
      architectures: mlp, resnet.
      mlp_hidden: The MLP's hidden units.
      resnet_widths: Channels per stage.
      resnet_blocks: Blocks per stage (1: ResNet-8, 3: -20).
      fraction: Fraction of each unit group removed.
      round_to: Kept units are a multiple of this.
      frameworks: keras, torch.
      keras_paths: function, xla, predict_on_batch, eager, tflite.
      torch_paths: eager, trace, compile.
      batches: Batch sizes.
      rounds: Interleaved rounds timed.
      round_seconds: About how long each model runs per round.
      threads: intra_op,inter_op threads of both frameworks (0,0: their defaults).
    """

    dataset: str = "digits"
    architectures: tuple = ("mlp", "resnet")
    mlp_hidden: tuple = (1024, 1024)
    resnet_widths: tuple = (32, 64, 128)
    resnet_blocks: int = 1
    fraction: float = 0.5
    round_to: int = 8
    frameworks: tuple = FRAMEWORKS
    keras_paths: tuple = ("function", "xla", "predict_on_batch", "tflite")
    torch_paths: tuple = ("eager", "trace")
    batches: tuple = (1, 64)
    rounds: int = 30
    round_seconds: float = 0.1
    threads: tuple = (2, 1)

    def __post_init__(self):
        for name in ("architectures", "frameworks", "keras_paths", "torch_paths"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        choices = {
            "architectures": ("mlp", "resnet"),
            "frameworks": FRAMEWORKS,
            "keras_paths": latency.KERAS_PATHS,
            # Checked against torch_models.TORCH_PATHS when torch is imported.
            "torch_paths": ("eager", "trace", "compile"),
        }
        for name, valid in choices.items():
            unknown = [v for v in getattr(self, name) if v not in valid]
            if unknown:
                raise ValueError(
                    f"Received an invalid value for `{name}`, expected some of"
                    f" {valid}. Received: {name}={getattr(self, name)!r}"
                )
        if not 0 < self.fraction < 1:
            raise ValueError(
                "Received an invalid value for `fraction`, expected a fraction of"
                f" units in (0, 1). Received: fraction={self.fraction!r}"
            )
        if self.rounds < 1 or self.round_seconds <= 0 or not self.batches:
            raise ValueError(
                "Need at least one round, a positive round time and a batch size."
                f" Received: rounds={self.rounds!r},"
                f" round_seconds={self.round_seconds!r}, batches={self.batches!r}"
            )
        for kind in self.architectures:  # Raises if a group would keep no unit.
            structured_widths.shrunk(
                self.architecture(kind), self.fraction, self.round_to
            )

    def architecture(self, kind):
        """The dense `kind` architecture of this config."""
        if kind == "mlp":
            return structured_models.for_data(
                kind, self.dataset, hidden=self.mlp_hidden
            )
        return structured_models.for_data(
            kind, self.dataset, widths=self.resnet_widths, blocks=self.resnet_blocks
        )


def machine():
    """Describes where the benchmark ran: `harness.machine()`, load and threads."""
    described = dict(
        harness.machine(),
        load_average=list(os.getloadavg()),
        tensorflow_threads=[
            tf.config.threading.get_intra_op_parallelism_threads(),
            tf.config.threading.get_inter_op_parallelism_threads(),
        ],
    )
    try:
        import torch
    except ImportError:
        return described
    described.update(
        torch=torch.__version__,
        torch_threads=[torch.get_num_threads(), torch.get_num_interop_threads()],
    )
    return described


def set_threads(threads, frameworks):
    """Sets `(intra_op, inter_op)` threads in TensorFlow and, if in `frameworks`, PyTorch.

    `(0, 0)` leaves both frameworks' defaults.
    """
    intra, inter = threads
    if intra or inter:
        latency.set_tensorflow_threads(intra, inter)
    if "torch" in frameworks and intra and inter:
        from benchmarks.structured_vs_torch_pruning import torch_models

        torch_models.set_torch_threads(intra, inter)


def _narrowest(arch, units):
    """`arch` with `units` units in every prunable group (the width rule's least).

    Not one unit: TensorFlow 2.21's LiteRT converter fails on a 1-D ResNet
    whose groups are one channel wide (batch 1: "'tf.Transpose' op x should
    be of the same rank with y"), and `round_to` units is the narrowest
    network pruning with `round_to` can leave.
    """
    if isinstance(arch, structured_models.MLP):
        return dataclasses.replace(arch, hidden=(units,) * len(arch.hidden))
    return dataclasses.replace(
        arch,
        widths=(units,) * len(arch.widths),
        inner_widths=(units,) * (len(arch.widths) * arch.blocks),
    )


def _builders(framework):
    """`(build(arch), inference(model, batch, path), paths attribute)` of a framework."""
    if framework == "keras":
        return (
            lambda arch: structured_models.keras_model(arch, seed=0),
            latency.keras_inference,
            "keras_paths",
        )
    from benchmarks.structured_vs_torch_pruning import torch_models

    return (
        lambda arch: torch_models.torch_model(arch, seed=0),
        torch_models.torch_inference,
        "torch_paths",
    )


def _time(config, framework, kind):
    """Rows of one framework and architecture: every path and batch size."""
    dense_arch = config.architecture(kind)
    shrunk_arch = structured_widths.shrunk(dense_arch, config.fraction, config.round_to)
    costs = {
        name: model_cost.count(structured_models.keras_model(arch))
        for name, arch in (("dense", dense_arch), ("shrunk", shrunk_arch))
    }
    build, inference, paths = _builders(framework)
    # "floor": the narrowest network of the kind (`round_to` units or
    # channels per group), timed alongside: what a call costs whatever the widths.
    floor = _narrowest(dense_arch, config.round_to)
    models = {
        "dense": build(dense_arch),
        "shrunk": build(shrunk_arch),
        "floor": build(floor),
    }
    rows = []
    for path in getattr(config, paths):
        compared = latency.compare(
            models,
            lambda model, batch, path=path: inference(model, batch, path),
            config.batches,
            config.rounds,
            config.round_seconds,
        )
        for timed in compared:
            wall, cpu = timed["wall"], timed["cpu"]
            row = {
                "framework": framework,
                "architecture": kind,
                "path": path,
                "batch": timed["batch"],
                "calls_per_round": timed["calls_per_round"],
                "dense_ms": wall["dense"]["ms"],
                "shrunk_ms": wall["shrunk"]["ms"],
                "floor_ms": wall["floor"]["ms"],
                "ratio": wall["shrunk"]["ratio"],
                "ratio_of_minima": wall["shrunk"]["ratio_of_minima"],
                "cpu_ratio": cpu["shrunk"]["ratio"],
                "params": {k: v[0] for k, v in costs.items()},
                "macs": {k: v[1] for k, v in costs.items()},
            }
            logging.info(
                "%s %s %s batch %d: dense %.3f ms, shrunk %.3f ms, ratio %.3f",
                framework,
                kind,
                path,
                row["batch"],
                row["dense_ms"]["median"],
                row["shrunk_ms"]["median"],
                row["ratio"]["median"],
            )
            rows.append(row)
    return rows


def format_table(rows):
    """The rows as a Markdown table."""
    lines = [
        "| framework | network | path | batch | dense ms | shrunk ms | floor ms |"
        " shrunk/dense [p10, p90] | ratio of minima | CPU-time ratio |",
        "|---|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for row in rows:
        ratio = row["ratio"]
        lines.append(
            f"| {row['framework']} | {row['architecture']} | {row['path']} |"
            f" {row['batch']} | {row['dense_ms']['median']:.3f} |"
            f" {row['shrunk_ms']['median']:.3f} | {row['floor_ms']['median']:.3f} |"
            f" {ratio['median']:.3f}"
            f" [{ratio['p10']:.3f}, {ratio['p90']:.3f}] |"
            f" {row['ratio_of_minima']:.3f} | {row['cpu_ratio']['median']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def _widths(arch):
    if isinstance(arch, structured_models.MLP):
        return f"hidden {arch.hidden}"
    return f"widths {arch.widths}, inner {arch.inner_widths or 'same'}"


def _sizes(config):
    lines = [
        "",
        "| network | params dense | params shrunk | MACs dense | MACs shrunk |",
    ]
    lines.append("|---|---:|---:|---:|---:|")
    for kind in config.architectures:
        dense = config.architecture(kind)
        shrunk = structured_widths.shrunk(dense, config.fraction, config.round_to)
        d = model_cost.count(structured_models.keras_model(dense))
        s = model_cost.count(structured_models.keras_model(shrunk))
        lines.append(
            f"| {kind} {_widths(dense)} -> {_widths(shrunk)} | {d[0]} | {s[0]} |"
            f" {d[1]} | {s[1]} |"
        )
    return "\n".join(lines) + "\n"


def run(config, workdir):
    """Times every framework, architecture, path and batch; writes JSON and Markdown.

    Writes `config.json`, `shrunk_latency.json` (machine, rows) and
    `shrunk_latency.md` under `workdir`; returns the rows.
    """
    set_threads(config.threads, config.frameworks)
    harness.write_config(workdir, config)
    before = machine()
    rows = []
    for framework in config.frameworks:
        for kind in config.architectures:
            rows.extend(_time(config, framework, kind))
    described = machine()
    described["load_average_before"] = before["load_average"]
    harness.write_json(
        workdir, "shrunk_latency.json", {"machine": described, "rows": rows}
    )
    harness.write_text(
        workdir, "shrunk_latency.md", format_table(rows) + _sizes(config)
    )
    return rows
