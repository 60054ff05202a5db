#!/usr/bin/env python3
"""Turns a stage's solution into its exercise.

    gen_exercise.py STAGE_DIR OUT_DIR         write OUT_DIR/<files>
    gen_exercise.py --check STAGE_DIR EX_DIR  exit 1 (with a diff) if EX_DIR is stale
    gen_exercise.py --one NAME STAGE_DIR OUT  write only file NAME's exercise, to OUT
                                              (the build's pristine copy of ddp.cc)

Every .h/.cc file of solutions/NN-topic/ is copied; each region

    // EXERCISE: what to write ...
    // BEGIN SOLUTION
    ... the solution ...
    // END SOLUTION

keeps its EXERCISE comment and loses the solution, which becomes

    throw tp::NotImplemented("stage NN: Class::function is not implemented yet (exercises/NN-topic/file.cc)");

naming the function that encloses the region (the nearest line above it that
starts in column 0 and opens a parameter list). A region with no EXERCISE
comment right above it, an unclosed region, or a nested one is an error.
"""
import difflib
import os
import subprocess
import re
import sys

BEGIN = "// BEGIN SOLUTION"
END = "// END SOLUTION"
# The function's qualified name: at the start of the line (a constructor,
# "Guard::Guard(") or after the shortest prefix that ends in a space, '*' or
# '&' (the return type: "Tensor DDP::forward(").
FUNCTION = re.compile(r"^(?:.*?[\s*&])??([A-Za-z_~][\w:~]*)\s*\(")


def enclosing_function(lines, index, path):
    for line in reversed(lines[:index]):
        if line.startswith(("//", "#", "}", "namespace", " ", "\t")) or not line.strip():
            continue
        m = FUNCTION.match(line)
        if m:
            return m.group(1)
    sys.exit(f"gen_exercise: {path}:{index + 1}: cannot tell which function encloses this region")


def generate(text, path, stage, shown_path):
    lines = text.splitlines()
    out = []
    i = 0
    regions = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == END:
            sys.exit(f"gen_exercise: {path}:{i + 1}: END SOLUTION without BEGIN SOLUTION")
        if line.strip() != BEGIN:
            out.append(line)
            i += 1
            continue
        # The region must be introduced by an EXERCISE comment block.
        j = len(out) - 1
        while j >= 0 and out[j].strip().startswith("//") and "EXERCISE:" not in out[j]:
            j -= 1
        if j < 0 or "EXERCISE:" not in out[j]:
            sys.exit(f"gen_exercise: {path}:{i + 1}: BEGIN SOLUTION needs an '// EXERCISE:' comment above it")
        indent = line[: len(line) - len(line.lstrip())]
        name = enclosing_function(lines, i, path)
        k = i + 1
        while k < len(lines) and lines[k].strip() != END:
            if lines[k].strip() == BEGIN:
                sys.exit(f"gen_exercise: {path}:{k + 1}: nested BEGIN SOLUTION")
            k += 1
        if k == len(lines):
            sys.exit(f"gen_exercise: {path}:{i + 1}: BEGIN SOLUTION is never closed")
        out.append(f'{indent}throw tp::NotImplemented("stage {stage}: {name} is not implemented yet ({shown_path})");')
        regions += 1
        i = k + 1
    result = "\n".join(out) + "\n"
    if regions and '#include "tensorplay/error.h"' not in result:
        sys.exit(f"gen_exercise: {path}: include tensorplay/error.h (the stubs throw tp::NotImplemented)")
    return result


def exercise_files(stage_dir):
    stage_dir = os.path.normpath(stage_dir)
    topic = os.path.basename(stage_dir)
    stage = topic.split("-", 1)[0]
    files = {}
    for name in sorted(os.listdir(stage_dir)):
        if not name.endswith((".h", ".cc")):
            continue
        path = os.path.join(stage_dir, name)
        with open(path) as f:
            text = f.read()
        body = generate(text, path, stage, f"exercises/{topic}/{name}")
        if name.endswith(".h") and "tp::NotImplemented(" in body:
            # The checker is compiled once against the solution's header and
            # linked with every ddp.cc (tests/meson.build): headers must be
            # the same in the solution and the exercise.
            sys.exit(f"gen_exercise: {path}: a header may not hold an EXERCISE region; "
                     f"put the code to write in a .cc file")
        if "tp::NotImplemented(" in body:
            header = (f"// Exercise generated from solutions/{topic}/{name} by tools/gen_exercise.py.\n"
                      f"// Fill in each EXERCISE, then run ./kit check {stage}. ./kit reset {stage} restores this file.\n")
        else:
            header = f"// Copied from solutions/{topic}/{name} by tools/gen_exercise.py (nothing to fill in here).\n"
        files[name] = header + body
    if not files:
        sys.exit(f"gen_exercise: {stage_dir} has no .h or .cc files")
    return files


def student_changes(out_dir):
    """What differs in out_dir from the committed version ("2 files changed"),
    or "" when nothing does, or when out_dir is not in a git checkout (then
    the comparison runs)."""
    try:
        run = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=out_dir,
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if run.returncode != 0:
        return ""
    changed = [line for line in run.stdout.splitlines() if line.strip()]
    if not changed:
        return ""
    files = f"{len(changed)} files differ" if len(changed) > 1 else "1 file differs"
    return f"{files} from git: git status {out_dir}"


def main(argv):
    if argv[:1] == ["--one"]:
        if len(argv) != 4:
            sys.exit(__doc__)
        name, stage_dir, out = argv[1:]
        files = exercise_files(stage_dir)
        if name not in files:
            sys.exit(f"gen_exercise: {stage_dir} has no {name}")
        with open(out, "w") as f:
            f.write(files[name])
        return 0
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    if len(args) != 2:
        sys.exit(__doc__)
    stage_dir, out_dir = args
    files = exercise_files(stage_dir)
    if check:
        mine = student_changes(out_dir)
        if mine:
            # Exit 77: Meson's "skipped". Never a failure that suggests a reset.
            print(f"SKIP: {out_dir} holds your work ({mine}), so it is not compared with the "
                  f"solution; nothing was changed. This test checks the exercise as committed, "
                  f"which CI does on a clean clone.")
            return 77
        stale = False
        for name, text in files.items():
            path = os.path.join(out_dir, name)
            current = open(path).read() if os.path.exists(path) else ""
            if current != text:
                stale = True
                sys.stdout.writelines(difflib.unified_diff(
                    current.splitlines(True), text.splitlines(True), path, f"generated from {stage_dir}/{name}"))
        if stale:
            print(f"{out_dir} is out of sync with {stage_dir}: run tools/gen_exercise.py {stage_dir} {out_dir}")
            return 1
        print(f"{out_dir} is in sync with {stage_dir}")
        return 0
    os.makedirs(out_dir, exist_ok=True)
    for name, text in files.items():
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
