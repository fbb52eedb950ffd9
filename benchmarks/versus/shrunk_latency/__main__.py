"""Latency of hand-shrunk networks over dense ones: `python -m benchmarks.shrunk_latency`.

Builds issue 23's MLP (64-1024-1024-10) and ResNet-8 (widths 32/64/128 on
8x8 digits) dense and with half of every unit group removed, in Keras and
(with the `structured-peer` extra's torch) PyTorch, and times them side by
side by every inference path at batch 1 and 64. Writes `config.json`,
`shrunk_latency.json` and `shrunk_latency.md` under `--workdir`;
docs/structured_pruning.md ("Against Torch-Pruning") has the latest table. Without torch,
pass `--frameworks=keras`.
"""

from absl import app, flags
from benchmarks.shrunk_latency import lib

_DEFAULTS = lib.Config()

_WORKDIR = flags.DEFINE_string("workdir", "runs/shrunk_latency", "Where to write.")
_DATASET = flags.DEFINE_enum(
    "dataset", _DEFAULTS.dataset, ["digits", "mnist1d"], "Input shape of the networks."
)
_ARCHITECTURES = flags.DEFINE_list(
    "architectures", list(_DEFAULTS.architectures), "mlp, resnet."
)
_MLP_HIDDEN = flags.DEFINE_list(
    "mlp_hidden", [str(u) for u in _DEFAULTS.mlp_hidden], "The MLP's hidden units."
)
_RESNET_WIDTHS = flags.DEFINE_list(
    "resnet_widths", [str(u) for u in _DEFAULTS.resnet_widths], "Channels per stage."
)
_RESNET_BLOCKS = flags.DEFINE_integer(
    "resnet_blocks", _DEFAULTS.resnet_blocks, "Blocks per stage (1: ResNet-8, 3: -20)."
)
_FRACTION = flags.DEFINE_float(
    "fraction", _DEFAULTS.fraction, "Fraction of each unit group removed."
)
_ROUND_TO = flags.DEFINE_integer(
    "round_to", _DEFAULTS.round_to, "Kept units are a multiple of this."
)
_FRAMEWORKS = flags.DEFINE_list(
    "frameworks", list(_DEFAULTS.frameworks), "keras, torch."
)
_KERAS_PATHS = flags.DEFINE_list(
    "keras_paths",
    list(_DEFAULTS.keras_paths),
    "function, xla, predict_on_batch, eager, tflite.",
)
_TORCH_PATHS = flags.DEFINE_list(
    "torch_paths", list(_DEFAULTS.torch_paths), "eager, trace, compile."
)
_BATCHES = flags.DEFINE_list(
    "batches", [str(b) for b in _DEFAULTS.batches], "Batch sizes."
)
_ROUNDS = flags.DEFINE_integer("rounds", _DEFAULTS.rounds, "Interleaved rounds timed.")
_ROUND_SECONDS = flags.DEFINE_float(
    "round_seconds",
    _DEFAULTS.round_seconds,
    "About how long each model runs per round.",
)
_THREADS = flags.DEFINE_list(
    "threads",
    [str(t) for t in _DEFAULTS.threads],
    "intra_op,inter_op threads of both frameworks (0,0: their defaults).",
)


def _ints(flag):
    try:
        return tuple(int(v) for v in flag.value)
    except ValueError as e:
        raise app.UsageError(
            f"--{flag.name} takes comma-separated integers. Received:"
            f" {','.join(flag.value)}"
        ) from e


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Too many command-line arguments: {argv[1:]}")
    try:
        config = lib.Config(
            dataset=_DATASET.value,
            architectures=tuple(_ARCHITECTURES.value),
            mlp_hidden=_ints(_MLP_HIDDEN),
            resnet_widths=_ints(_RESNET_WIDTHS),
            resnet_blocks=_RESNET_BLOCKS.value,
            fraction=_FRACTION.value,
            round_to=_ROUND_TO.value,
            frameworks=tuple(_FRAMEWORKS.value),
            keras_paths=tuple(_KERAS_PATHS.value),
            torch_paths=tuple(_TORCH_PATHS.value),
            batches=_ints(_BATCHES),
            rounds=_ROUNDS.value,
            round_seconds=_ROUND_SECONDS.value,
            threads=_ints(_THREADS),
        )
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    rows = lib.run(config, _WORKDIR.value)
    print(lib.format_table(rows))


if __name__ == "__main__":
    app.run(main)
