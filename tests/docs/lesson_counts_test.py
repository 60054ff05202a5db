#!/usr/bin/env python3
"""Each lesson's "Two tracks" numbers are the ones the tool counts today.

Every lessons/NN-topic/README.md opens "What to build" with a paragraph,
"**Two tracks; pick one.**", that types what each track leaves to write:
the guided track's `EXERCISE` regions and lines of code, the from-scratch
track's functions and lines of code, and an estimate of the hours from
those lines at about 30 lines of code an hour, to the nearest half hour.
It says where the counts come from (`python3 tools/exercise_share.py
--tracks .`), and they go stale whenever a stage's code or regions change.
This compares each typed number with the tool's and, where one differs,
fails naming the lesson file and line, the words as typed and the words to
type instead.

Usage: lesson_counts_test.py ROOT
"""
import math
import os
import re
import subprocess
import sys

TOOL = "python3 tools/exercise_share.py --tracks ."
PRINTED = re.compile(r"^stage (\d\d): guided: (\d+) regions, (\d+) lines of code; "
                     r"from scratch: (\d+) functions, (\d+) lines of code$")
GUIDED = re.compile(r"(\d+) `EXERCISE` regions?, (\d+) lines of code")
SCRATCH = re.compile(r"(\d+) functions? and (\d+) lines of code")
HOURS = re.compile(r"guided about (\d+(?:\.\d+)?) hours?, from scratch about "
                   r"(\d+(?:\.\d+)?) hours?")
LINES_AN_HOUR = 30


def hours(lines):
    """The lessons' estimate: lines / 30, to the nearest half hour, as typed
    ("1 hour", "2.5 hours")."""
    h = math.floor(lines / LINES_AN_HOUR * 2 + 0.5) / 2
    text = f"{h:g}"
    return f"{text} hour" + ("" if text == "1" else "s")


def paragraph(path):
    """(first line number, the "Two tracks" paragraph of "What to build" as
    one line), or None."""
    with open(path) as f:
        lines = f.read().splitlines()
    section = False
    for i, line in enumerate(lines):
        if line.startswith("## "):
            section = line.strip() == "## What to build"
        elif section and line.startswith("**Two tracks"):
            end = i
            while end < len(lines) and lines[end].strip():
                end += 1
            return i + 1, " ".join(l.strip() for l in lines[i:end])
    return None


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__.split("\n\n")[-1])
    root = os.path.abspath(argv[1])
    run = subprocess.run([sys.executable, os.path.join(root, "tools", "exercise_share.py"),
                          "--tracks", root], capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        sys.exit(f"FAIL: {TOOL} exited {run.returncode}:\n{run.stdout}{run.stderr}")
    counts = {}
    for line in run.stdout.splitlines():
        m = PRINTED.match(line)
        if m:
            counts[m.group(1)] = tuple(int(g) for g in m.groups()[1:])
    if not counts:
        sys.exit(f"FAIL: {TOOL} printed no line this reads:\n{run.stdout}")
    lessons = {d[:2]: d for d in os.listdir(os.path.join(root, "lessons"))
               if re.match(r"^\d\d-", d)}
    problems = []
    for nn, (regions, guided, functions, scratch) in sorted(counts.items()):
        path = f"lessons/{lessons.get(nn, nn + '-*')}/README.md"
        found = paragraph(os.path.join(root, path)) if nn in lessons else None
        if found is None:
            problems.append(f"{path}: no \"**Two tracks\" paragraph under \"## What to build\" "
                            f"to hold stage {nn}'s counts ({TOOL}: {regions} regions, {guided} "
                            f"lines; {functions} functions, {scratch} lines)")
            continue
        line, text = found
        where = f"{path}:{line} (the \"Two tracks\" paragraph)"
        wanted = [(GUIDED, f"{regions} `EXERCISE` regions, {guided} lines of code",
                   "the guided track's regions and lines of code"),
                  (SCRATCH, f"{functions} functions and {scratch} lines of code",
                   "the from-scratch track's functions and lines of code"),
                  (HOURS, f"guided about {hours(guided)}, from scratch about {hours(scratch)}",
                   f"the hours, at about {LINES_AN_HOUR} lines of code an hour to the nearest "
                   f"half hour, from {guided} and {scratch} lines")]
        for pattern, expected, what in wanted:
            m = pattern.search(text)
            if not m:
                problems.append(f"{where}: does not type {what} in the words this reads; "
                                f"{TOOL} gives: '{expected}'")
            elif m.group(0) != expected:
                problems.append(f"{where}: {what}: change '{m.group(0)}' to '{expected}' "
                                f"(from what {TOOL} prints)")
    for p in problems:
        print(f"FAIL: {p}")
    if problems:
        print(f"lesson_counts: FAIL: {len(problems)} stale count(s) in the lessons' \"Two "
              f"tracks\" paragraphs (the numbers: {TOOL})")
        return 1
    print(f"ok: the \"Two tracks\" counts of all {len(counts)} lessons are what {TOOL} prints")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
