#!/usr/bin/env python3
"""Any launched program as W ranks, one per host of a shaped link.

    on_link.py RATE W -- PROGRAM [ARGS...]

Makes W hosts joined through a switch, each host's egress limited to RATE
(bench/shaped_link.py), and starts PROGRAM ARGS on each through
tools/tprun (--nnodes W, one rank per node, env:// with rank 0's store on
host 0), as bench/link_rounds.py starts the benchmarks. PROGRAM must take
--init-method=env:// (the demos, the checkers and the benchmark programs
do): give it in ARGS. Waits for every host; prints host 0's output, and a
failing host's; exits 0 when all succeeded, 1 otherwise. The hosts share
this machine's files, so a path in ARGS (a demo's --trace) is one file
that every rank may write: the demos write every rank's timeline from
each rank, the same bytes, each file replaced whole.

    python3 bench/on_link.py 1gbit 2 -- build/lessons/demo_10 \\
        --init-method env:// --model deep --trace t.json

Needs root, `ip` and `tc`; without them it says why and exits 77. All
namespaces go when it ends, also on SIGTERM, SIGHUP or SIGINT.
"""

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))  # namespaces.py, shared with tests/
import link_bench  # noqa: E402
import shaped_link  # noqa: E402
from namespaces import SKIP, Unavailable, clean_stale  # noqa: E402

USAGE = "usage: on_link.py RATE W -- PROGRAM [ARGS...]"


def main():
    argv = sys.argv[1:]
    if len(argv) < 4 or argv[2] != "--":
        sys.exit(f"{USAGE}\n(got {' '.join(argv) or 'nothing'})")
    rate, world_size, command = argv[0], argv[1], argv[3:]
    try:
        shaped_link.parse_rate(rate)
        world_size = int(world_size)
    except ValueError as e:
        sys.exit(f"on_link.py: {e}\n{USAGE}")
    if not 2 <= world_size <= 16:
        sys.exit(f"on_link.py: W is 2 to 16 ranks, one per host; got {world_size}")
    clean_stale()
    try:
        with shaped_link.ShapedLink(world_size, rate) as link, \
                tempfile.TemporaryDirectory(prefix="tp-on-link-") as tmp:
            try:
                link_bench.run_job(link, command, tmp, f"{os.path.basename(command[0])} on a "
                                   f"{rate} link")
            except RuntimeError as e:
                print(f"on_link.py: {e}", file=sys.stderr)
                return 1
            logs = sorted(f for f in os.listdir(tmp) if f.endswith(".host0.log"))
            with open(os.path.join(tmp, logs[-1])) as f:
                print(f.read(), end="")
    except Unavailable as e:
        print(f"on_link.py: no shaped link here: {e}")
        return SKIP
    return 0


if __name__ == "__main__":
    sys.exit(main())
