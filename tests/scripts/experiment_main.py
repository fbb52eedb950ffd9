"""Runs an experiment's main for each argv: python experiment_main.py EXPERIMENT JSON.

EXPERIMENT names a package of experiments/ (`lottery_ticket`, `sparse_training`).
JSON is a list of argv lists. Prints, as JSON, one outcome per argv: "ok", or the
message of the `app.UsageError` main raised. The last argv goes through `app.run`,
as on the command line: it prints its error to stderr and exits with its status.
It runs in its own process because the experiments' flags share names with each
other's (and learnable_scale's), which the test suite imports, and absl refuses a
flag defined twice in one process.
"""

import importlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # noqa: E402


def main():
    experiment = importlib.import_module(f"experiments.{sys.argv[1]}.__main__")
    *argvs, last = json.loads(sys.argv[2])
    outcomes = []
    for argv in argvs:
        experiment.FLAGS.unparse_flags()
        experiment.FLAGS(argv)
        try:
            experiment.main(argv[:1])
            outcomes.append("ok")
        except app.UsageError as e:
            outcomes.append(str(e))
    print(json.dumps(outcomes), flush=True)
    experiment.FLAGS.unparse_flags()
    app.run(experiment.main, argv=last)


if __name__ == "__main__":
    main()
