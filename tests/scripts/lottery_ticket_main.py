"""Runs experiments.lottery_ticket's main for each argv: python lottery_ticket_main.py JSON.

JSON is a list of argv lists. Prints, as JSON, one outcome per argv: "ok", or the
message of the `app.UsageError` main raised. The last argv goes through `app.run`,
as on the command line: it prints its error to stderr and exits with its status.
It runs in its own process because the
experiment's flags share names with experiments.learnable_scale's, which the test
suite imports, and absl refuses a flag defined twice in one process.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # noqa: E402

from experiments.lottery_ticket import __main__ as lottery_ticket  # noqa: E402


def main():
    *argvs, last = json.loads(sys.argv[1])
    outcomes = []
    for argv in argvs:
        lottery_ticket.FLAGS.unparse_flags()
        lottery_ticket.FLAGS(argv)
        try:
            lottery_ticket.main(argv[:1])
            outcomes.append("ok")
        except app.UsageError as e:
            outcomes.append(str(e))
    print(json.dumps(outcomes), flush=True)
    lottery_ticket.FLAGS.unparse_flags()
    app.run(lottery_ticket.main, argv=last)


if __name__ == "__main__":
    main()
