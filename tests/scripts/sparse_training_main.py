"""Runs experiments.sparse_training's main for each argv: python sparse_training_main.py JSON.

JSON is a list of argv lists. Prints, as JSON, one outcome per argv: "ok", or the
message of the `app.UsageError` main raised. The last argv goes through `app.run`,
as on the command line: it prints its error to stderr and exits with its status.
It runs in its own process because the
experiment's flags share names with experiments.lottery_ticket's and learnable_scale's, which the test
suite imports, and absl refuses a flag defined twice in one process.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # noqa: E402

from experiments.sparse_training import __main__ as sparse_training  # noqa: E402


def main():
    *argvs, last = json.loads(sys.argv[1])
    outcomes = []
    for argv in argvs:
        sparse_training.FLAGS.unparse_flags()
        sparse_training.FLAGS(argv)
        try:
            sparse_training.main(argv[:1])
            outcomes.append("ok")
        except app.UsageError as e:
            outcomes.append(str(e))
    print(json.dumps(outcomes), flush=True)
    sparse_training.FLAGS.unparse_flags()
    app.run(sparse_training.main, argv=last)


if __name__ == "__main__":
    main()
