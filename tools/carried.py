#!/usr/bin/env python3
"""Checks that code a stage carries over from the previous stage is unchanged.

    carried.py --check ROOT     exit 1, with a diff, where marked copies drift
    carried.py --list ROOT      print every marked region and where it is

Each stage (ROOT/solutions/NN-topic/) is a complete DDP, so a later stage
repeats much of the one before: the same construction checks, the same
bucket assignment, the same end-of-backward bookkeeping. Such code is marked
in every stage that holds it, with the same two lines in each copy:

    // SAME FROM STAGE 03: finish the buckets
    ... the code ...
    // END SAME FROM STAGE 03: finish the buckets

The first line tells a reader that this code is as stage 03 wrote it, in
stage 03 and every stage since that has the region: what a later stage adds
is elsewhere, and a fix made here belongs in every copy. The name after the
colon (free text, unique in its file) ties the copies together; the marker
lines are part of the code compared. A new stage that carries marked code
over copies it with its markers, and nothing in the earlier stages changes;
code the stage before wrote itself is not marked yet (a region needs two
stages), so carrying that over marks both copies, one pair of lines in the
stage before.

The check, for each region named R in file F (ddp.h, ddp.cc, ...) that says
it is the same from stage AA:
  - stage AA has it, and the stages that have it follow one another from AA
    on with no gap (a stage that changes the code on purpose drops the
    markers, and the stages after it cannot claim to be the same as AA);
  - each stage's copy equals the previous stage's (AA's with AB's, then AB's
    with AC's, ...), after two normalisations:
      * the stage's own namespace reads as stageNN: `stage04` (its namespace,
        and the prefix of its messages, "stage04 DDP: rank 1: ...") compares
        equal to `stage03` in the stage before. Prose is compared as written:
        "stage 05 walks the graph" names stage 05 in every copy;
      * an exercise is given code in the next stage: the `// EXERCISE:`
        comment (up to `// BEGIN SOLUTION`), and the `// BEGIN SOLUTION` and
        `// END SOLUTION` lines, are left out.
    Whitespace counts: a re-indented copy is a changed copy.
Regions do not nest. A difference fails with a unified diff, the file:line
of both copies, and the fix: port the change to every copy, or, where a
stage changes the code on purpose, drop the markers there and after it.
"""
import difflib
import os
import re
import sys

OPEN = re.compile(r"^\s*// SAME FROM STAGE (\d\d): (\S.*?)\s*$")
CLOSE = re.compile(r"^\s*// END SAME FROM STAGE (\d\d): (\S.*?)\s*$")
# Anything that looks like a marker but is not one of the two above, so that
# a typo fails instead of leaving a region unchecked.
LOOKS_LIKE = re.compile(r"SAME (FROM|IN) STAGE", re.IGNORECASE)
BEGIN, END = "// BEGIN SOLUTION", "// END SOLUTION"


class Region:
    def __init__(self, stage, path, name, first, start, lines):
        self.stage = stage    # "04"
        self.path = path      # the file, as shown in messages
        self.name = name
        self.first = first    # the stage the markers name: the code is as it wrote it
        self.start = start    # 1-based line of the opening marker
        self.lines = lines    # the region, both markers included

    def where(self):
        return f"{self.path}:{self.start}"


def stage_dirs(root):
    """{"01": "01-naive", ...} for every stage folder of ROOT/solutions."""
    base = os.path.join(root, "solutions")
    dirs = {}
    for name in sorted(os.listdir(base)):
        m = re.match(r"^(\d\d)-", name)
        if m and os.path.isdir(os.path.join(base, name)):
            dirs[m.group(1)] = name
    return dirs


def parse(text, stage, path, problems):
    """The marked regions of one file; malformed markers go to `problems`."""
    regions = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if CLOSE.match(line):
            problems.append(f"{path}:{i + 1}: '{line.strip()}' closes no region")
            i += 1
            continue
        m = OPEN.match(line)
        if not m:
            if LOOKS_LIKE.search(line):
                problems.append(f"{path}:{i + 1}: '{line.strip()}' is not a marker; write "
                                f"'// SAME FROM STAGE AA: name' or '// END SAME FROM STAGE AA: name'")
            i += 1
            continue
        first, name = m.groups()
        if first > stage:
            problems.append(f"{path}:{i + 1}: region '{name}' says it is the same from stage "
                            f"{first}, a stage after this one ({stage})")
        k = i + 1
        while k < len(lines) and not CLOSE.match(lines[k]) and not OPEN.match(lines[k]):
            k += 1
        if k == len(lines) or OPEN.match(lines[k]):
            problems.append(f"{path}:{i + 1}: region '{name}' is never closed (regions do not "
                            f"nest); end it with '// END SAME FROM STAGE {first}: {name}'")
            i = k
            continue
        c = CLOSE.match(lines[k])
        if c.groups() != (first, name):
            problems.append(f"{path}:{k + 1}: region '{name}' (line {i + 1}, from stage {first}) "
                            f"is closed by '{lines[k].strip()}'; the closing line repeats the opening's "
                            f"stage and name")
        regions.append(Region(stage, path, name, first, i + 1, lines[i:k + 1]))
        i = k + 1
    return regions


def normalised(region):
    """The region as compared: its own namespace as stageNN, no exercise markup."""
    own = re.compile(r"\b(stage)" + region.stage + r"\b")
    out = []
    in_exercise = False
    for line in region.lines:
        s = line.strip()
        if s.startswith("// EXERCISE:"):
            in_exercise = True
        if in_exercise:
            if s == BEGIN:
                in_exercise = False
            elif s.startswith("//"):
                continue  # the EXERCISE comment
            else:
                in_exercise = False
        if s in (BEGIN, END):
            continue
        out.append(own.sub(lambda m: m.group(1) + "NN", line.rstrip()) + "\n")
    return out


def collect(root, problems):
    """{(file name, region name): {stage: Region}}."""
    found = {}
    for stage, topic in stage_dirs(root).items():
        folder = os.path.join(root, "solutions", topic)
        for name in sorted(os.listdir(folder)):
            if not name.endswith((".h", ".cc")):
                continue
            shown = f"solutions/{topic}/{name}"
            with open(os.path.join(folder, name)) as f:
                regions = parse(f.read(), stage, shown, problems)
            for r in regions:
                copies = found.setdefault((name, r.name), {})
                if stage in copies:
                    problems.append(f"{r.where()}: a second region '{r.name}' in this file "
                                    f"(the first is at line {copies[stage].start}); names are unique "
                                    f"in a file")
                    continue
                copies[stage] = r
    return found


def check(root):
    problems = []
    found = collect(root, problems)
    stages = sorted(stage_dirs(root))
    for (file_name, name), copies in sorted(found.items()):
        firsts = {r.first for r in copies.values()}
        if len(firsts) > 1:
            listed = ", ".join(f"{r.where()} says {r.first}" for r in copies.values())
            problems.append(f"region '{name}' of {file_name} names different stages in its copies "
                            f"({listed}); every copy names the stage that wrote the code")
            continue
        first = firsts.pop()
        # From the stage that wrote it to the last stage that has it, none missing.
        wanted = [s for s in stages if first <= s <= max(copies)]
        missing = [s for s in wanted if s not in copies]
        if missing:
            any_copy = copies[max(copies)]
            problems.append(
                f"{any_copy.where()}: region '{name}' says it is the same from stage {first}, but "
                f"stage(s) {', '.join(missing)} have no region '{name}' in their {file_name}; copy "
                f"it there with its markers, or, if a stage changed the code on purpose, drop the "
                f"markers in the stages after it too")
            continue
        for prev, cur in zip(wanted, wanted[1:]):
            a, b = copies[prev], copies[cur]
            old, new = normalised(a), normalised(b)
            if old == new:
                continue
            diff = "".join(difflib.unified_diff(old, new, f"{a.where()} (stage {prev})",
                                                f"{b.where()} (stage {cur})"))
            problems.append(
                f"{b.where()}: region '{name}' differs from stage {prev}'s copy at {a.where()}, "
                f"although both are marked as the same from stage {first}:\n{diff}"
                f"fix: make the change in every copy (a fix belongs in every stage that carries "
                f"the code; then regenerate their exercises with tools/gen_exercise.py), or, if "
                f"stage {cur} changes this code on purpose, drop its markers there and in the "
                f"stages after it")
    return problems, found


def main(argv):
    if len(argv) != 3 or argv[1] not in ("--check", "--list"):
        sys.exit(__doc__.split("\n\n")[1])
    root = argv[2]
    if not os.path.isdir(os.path.join(root, "solutions")):
        sys.exit(f"carried: {root} has no solutions/ folder; pass the kit's root")
    problems, found = check(root)
    if argv[1] == "--list":
        for (file_name, name), copies in sorted(found.items()):
            where = ", ".join(r.where() for _, r in sorted(copies.items()))
            print(f"{file_name}: {name}: {where}")
    if problems:
        for p in problems:
            print(f"carried: {p}")
        print(f"carried: FAIL: {len(problems)} problem(s) with code marked as carried over unchanged")
        return 1
    if argv[1] == "--check":
        per_stage = {}
        for copies in found.values():
            for stage in copies:
                per_stage[stage] = per_stage.get(stage, 0) + 1
        counts = ", ".join(f"{s}: {n}" for s, n in sorted(per_stage.items()))
        print(f"carried: ok: {len(found)} regions carried over unchanged (regions per stage: "
              f"{counts or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
