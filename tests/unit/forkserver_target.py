"""A module the fork-server tests run as ``__main__`` (tests/unit/test_forkserver.py): it reports who and where
it is, then exits with the code in FORK_TARGET_EXIT, or waits for its standard input to close."""

import json
import os
import sys

if __name__ == "__main__":
    print(
        json.dumps(
            {"pid": os.getpid(), "cwd": os.getcwd(), "argv": sys.argv[1:], "env": os.environ.get("FORK_TARGET")}
        )
    )
    sys.stdout.flush()
    if os.environ.get("FORK_TARGET_EXIT"):
        sys.exit(int(os.environ["FORK_TARGET_EXIT"]))
    sys.stdin.read()
