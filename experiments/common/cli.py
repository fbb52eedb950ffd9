"""The command line of every experiment and benchmark: flags from a config, `main`.

An entry point's `__main__.py` holds its usage and two lines:

    main = cli.config_main(Config, run)

    if __name__ == "__main__":
        app.run(main)

`config_main` defines one absl flag per field of the dataclass `Config`
(`ConfigFlags`; the help is the field's line in the docstring's
"Attributes:" section) and `--workdir`, and returns the `main` that refuses extra
arguments, turns the flags into a `Config` (a `ValueError` of the config is a
usage error, so nothing is written) and calls the library's
`run(config, workdir)`, which never reads flags.
"""

import dataclasses
import inspect
import json

from absl import app, flags, logging

from maskfit import distribute

__all__ = [
    "ConfigFlags",
    "check_argv",
    "config_from_json",
    "config_main",
    "define_scale_flags",
    "field_helps",
    "print_file",
]

# The flags defined here belong to the entry point that asks for them, so that
# its --help lists them.
flags.disclaim_key_flags()

_STRATEGY_HELP = (
    "Where to train: 'default' (one device), 'mirrored' (all devices of"
    " this machine) or 'multi_worker' (several machines, from TF_CONFIG)."
)
_PRECISION_HELP = "Keras dtype policy to train in."
_CHOICES = {"strategy": distribute.STRATEGIES, "precision": distribute.PRECISIONS}
_ITEMS = {int: "integers", float: "floats", str: "strings"}


def field_helps(config_class):
    """`{field: text}` from the "Attributes:" sections of the config's docstrings.

    A base class's entries come first; a subclass's replace them. An entry
    `a, b: text` documents both fields; deeper-indented lines continue it.

    Example:
      >>> field_helps(Config)["epochs"]
      'Passes over the data.'
    """
    helps = {}
    for cls in reversed(config_class.__mro__):
        lines = inspect.cleandoc(cls.__dict__.get("__doc__") or "").splitlines()
        if "Attributes:" not in lines:
            continue
        names, indent = (), None
        for line in lines[lines.index("Attributes:") + 1 :]:
            depth = len(line) - len(line.lstrip())
            if not line.strip() or depth < (indent or 1):
                break
            if indent is None or depth == indent:
                indent = depth
                key, _, text = line.strip().partition(": ")
                names = [name.strip() for name in key.split(",")]
                helps.update((name, text) for name in names)
            else:
                helps.update((name, f"{helps[name]} {line.strip()}") for name in names)
    return helps


class ConfigFlags:
    """One absl flag per field of a config dataclass, read back as a config.

    Each flag's help is the field's line in the "Attributes:" section of the
    config's docstring (`field_helps`), its default the field's default. A
    tuple field is a list flag whose items parse as its first item's type; a
    field named in `choices` (and `strategy`, `precision`) an enum flag; the
    others bool, integer, float or string flags by their default's type (or
    `kinds[name]`, for a default of None).

    Example:
      >>> options = ConfigFlags(Config)
      >>> config = options.config()  # after absl parsed the command line
    """

    def __init__(self, config_class, choices=None, kinds=None):
        self.config_class = config_class
        self.lists = {}
        self.holders = {}
        defaults = dataclasses.asdict(config_class())
        choices = dict(_CHOICES, **(choices or {}))
        helps = field_helps(config_class)
        for field in dataclasses.fields(config_class):
            name, default = field.name, defaults[field.name]
            if name not in helps:
                raise ValueError(
                    f"`{config_class.__qualname__}.{name}` has no help: its"
                    " docstring's Attributes section has no line for it. Add"
                    f" `{name}: <what it sets>` there."
                )
            text = helps[name]
            kind = (kinds or {}).get(name, type(default))
            if name in choices:
                holder = flags.DEFINE_enum(name, default, list(choices[name]), text)
            elif isinstance(default, (tuple, list)):
                self.lists[name] = type(default[0])
                holder = flags.DEFINE_list(name, [str(v) for v in default], text)
            elif kind is bool:
                holder = flags.DEFINE_bool(name, default, text)
            elif kind is int:
                holder = flags.DEFINE_integer(name, default, text)
            elif kind is float:
                holder = flags.DEFINE_float(name, default, text)
            else:
                holder = flags.DEFINE_string(name, default, text)
            self.holders[name] = holder

    def values(self):
        """The flags' values by field, list flags as tuples of their item type.

        Raises:
          app.UsageError: if a list flag holds an item its type does not parse.
        """
        values = {}
        for name, holder in self.holders.items():
            values[name] = holder.value
            if name not in self.lists:
                continue
            kind = self.lists[name]
            try:
                values[name] = tuple(kind(v) for v in holder.value)
            except ValueError as e:
                raise app.UsageError(
                    f"--{name} takes comma-separated {_ITEMS[kind]}."
                    f" Received: {','.join(holder.value)}"
                ) from e
        return values

    def config(self):
        """The config of the flags' values.

        Raises:
          app.UsageError: with the config's message, where it refuses them
            (on construction, or in its `validate()` where it has one).
        """
        try:
            config = self.config_class(**self.values())
            if hasattr(config, "validate"):
                config.validate()
        except ValueError as e:
            raise app.UsageError(str(e)) from None
        return config


def config_from_json(config_class, text):
    """The config whose fields `text` holds as JSON (`dataclasses.asdict`'s).

    For a run that starts itself in another process with its config as a
    flag: JSON lists come back as tuples.

    Example:
      >>> config_from_json(Config, json.dumps(dataclasses.asdict(Config())))
    """
    values = json.loads(text)
    return config_class(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    )


def check_argv(argv):
    """Raises app.UsageError if the command line has arguments besides flags."""
    if len(argv) > 1:
        raise app.UsageError(f"Too many command-line arguments: {argv[1:]}")


def config_main(config_class, run, workdir=None, show=None, table=None, **options):
    """Defines the flags of `config_class` and `--workdir`; returns `main`.

    Args:
      config_class: the run's config dataclass; every field becomes a flag
        (see `ConfigFlags`, which takes `options`: choices, kinds).
      run: `run(config, workdir)`, the library function; returns the results.
      workdir: the default of `--workdir`; None makes the flag required.
      show: `show(config, results, workdir)`, called after the run (prints
        its table, logs its numbers), or None.
      table: `table(results)`, the run's table as text, printed after the
        run unless it returned None; or None.

    Returns:
      `main(argv)` for `absl.app.run`.

    Example:
      >>> main = config_main(Config, run)
    """
    config_flags = ConfigFlags(config_class, **options)
    workdir_flag = flags.DEFINE_string(
        "workdir", workdir, "Directory for the run's outputs."
    )
    if workdir is None:
        flags.mark_flag_as_required("workdir")

    def main(argv):
        check_argv(argv)
        config = config_flags.config()
        results = run(config, workdir_flag.value)
        if show is not None:
            show(config, results, workdir_flag.value)
        if table is not None and results is not None:
            logging.info("Wrote the results to %s", workdir_flag.value)
            print(table(results))

    return main


def print_file(name):
    """A `show` for `config_main` that prints the run's file `name` (its table).

    Example:
      >>> main = config_main(Config, run, show=print_file("structured_pruning.md"))
    """

    def show(config, results, workdir):
        del config, results
        with open(f"{workdir}/{name}") as f:
            print(f.read())

    return show


def define_scale_flags(flag_values=None):
    """Defines the absl flags `--strategy` and `--precision`.

    `config_main` defines them for a config with the fields `strategy` and
    `precision`; this defines them alone, in `flag_values` (by default
    `absl.flags.FLAGS`).

    Returns:
      A pair of `FlagHolder`s, `(strategy, precision)`.

    Example:
      >>> strategy, precision = define_scale_flags(flags.FlagValues())
    """
    flag_values = flags.FLAGS if flag_values is None else flag_values
    strategy = flags.DEFINE_enum(
        "strategy",
        "default",
        distribute.STRATEGIES,
        _STRATEGY_HELP,
        flag_values=flag_values,
    )
    precision = flags.DEFINE_enum(
        "precision",
        "float32",
        distribute.PRECISIONS,
        _PRECISION_HELP,
        flag_values=flag_values,
    )
    return strategy, precision
