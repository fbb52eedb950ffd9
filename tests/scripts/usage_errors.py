"""Runs an experiment's command line for several argvs in one process.

    python usage_errors.py MODULE JSON

MODULE is an absl program (e.g. experiments.masked_outputs); JSON is a list of
argv lists. Each argv goes through `app.run(MODULE.main, argv=...)`, as on the
command line; the script prints, as JSON, one `{"code": exit status, "output":
what it wrote to stderr and stdout}` per argv. One process for all of them
saves a TensorFlow import per case; a program whose flags clash with another's
(absl refuses a flag defined twice) needs a process of its own anyway.
"""

import contextlib
import importlib
import io
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import (
    app,  # noqa: E402
    flags,  # noqa: E402
)


def main():
    module = importlib.import_module(sys.argv[1])
    outcomes = []
    for argv in json.loads(sys.argv[2]):
        flags.FLAGS.unparse_flags()
        output = io.StringIO()
        code = 0
        with contextlib.redirect_stderr(output), contextlib.redirect_stdout(output):
            try:
                app.run(module.main, argv=argv)
            except SystemExit as e:
                code = e.code
        outcomes.append({"code": code, "output": output.getvalue()})
    print(json.dumps(outcomes), flush=True)


if __name__ == "__main__":
    main()
