#!/usr/bin/env python3
"""exercise_share.py's "added" is what `./kit diff NN` shows with '+'.

tools/exercise_share.py holds each stage's guided exercise to a share of
the code the stage adds, and that code is meant to be the diff a student
reads with `./kit diff NN`: the same files, the same normalisation, the
same alignment (both read tools/stage_diff.py). This runs `./kit diff NN
--anyway` for every stage folder there is, counts its '+' lines of code
(not blank, not only a comment) per file, and compares them with the
per-file and total "added" numbers exercise_share.py prints. A file a
stage gains is covered without a change here.

Usage: exercise_share_test.py ROOT
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "kit"))
from kit_diff_test import parse_diff  # noqa: E402  (one reader of the diff)

LINE = re.compile(r"^stage (\d\d): (\d+) of the (\d+) lines of code it adds .*?(?:\[(.*)\])?$")


def is_code(text):
    s = text.strip()
    return bool(s) and not s.startswith("//")


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__.split("\n\n")[-1])
    root = os.path.abspath(argv[1])
    # --min 0: the numbers, whatever the floor says of them.
    run = subprocess.run([sys.executable, os.path.join(root, "tools", "exercise_share.py"),
                          "--min", "0", root], capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        sys.exit(f"FAIL: exercise_share.py --min 0 exited {run.returncode}:\n"
                 f"{run.stdout}{run.stderr}")
    counted = {}
    for line in run.stdout.splitlines():
        m = LINE.match(line)
        if m:
            files = {}
            for item in filter(None, (m.group(4) or "").split(", ")):
                name, _, ratio = item.rpartition(" ")
                files[name] = int(ratio.split("/")[1])
            counted[m.group(1)] = (int(m.group(3)), files)
    topics = sorted(d for d in os.listdir(os.path.join(root, "solutions"))
                    if re.match(r"^\d\d-", d))
    problems = []
    for topic in topics:
        nn = topic[:2]
        if nn not in counted:
            problems.append(f"stage {nn}: exercise_share.py printed no line for it:\n{run.stdout}")
            continue
        r = subprocess.run([os.path.join(root, "kit"), "diff", nn, "--anyway"],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            problems.append(f"./kit diff {nn} --anyway exited {r.returncode}: {r.stderr}")
            continue
        _, files = parse_diff(r.stdout)
        shown = {}
        for _, new_label, body in files:
            n = sum(1 for kind, content in body if kind == "+" and is_code(content))
            if n:
                shown[os.path.basename(new_label)] = n
        total, per_file = counted[nn]
        if sum(shown.values()) != total or shown != per_file:
            problems.append(
                f"stage {nn}: ./kit diff {nn} --anyway shows {sum(shown.values())} added lines "
                f"of code ({shown}), exercise_share.py counts {total} ({per_file}); both must "
                f"read tools/stage_diff.py's diff the same way")
    for p in problems:
        print(f"FAIL: {p}")
    if problems:
        return 1
    print(f"ok: for each of the {len(topics)} stages, the lines of code ./kit diff NN shows "
          f"with '+' are exercise_share.py's added, file by file ("
          f"{', '.join(f'{nn}: {counted[nn][0]}' for nn in sorted(counted))})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
