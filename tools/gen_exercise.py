#!/usr/bin/env python3
"""Turns a stage's solution into its exercise.

    gen_exercise.py STAGE_DIR OUT_DIR         write OUT_DIR/<files>
    gen_exercise.py --check STAGE_DIR EX_DIR  exit 1 (with a diff) if EX_DIR is stale
    gen_exercise.py --one NAME STAGE_DIR OUT  write only file NAME's exercise, to OUT
                                              (the build's pristine copy of ddp.cc)
    gen_exercise.py --from-scratch [--one NAME] STAGE_DIR OUT
                                              the from-scratch track (below)

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

The from-scratch track (--from-scratch, `./kit reset NN --from-scratch`)
asks for the whole stage, not its EXERCISE regions. Every function of the
stage's .cc files that the stage adds or changes over the stage before it
(solutions/(NN-1)-*/, any of its .cc files) keeps its signature (and a
constructor its member initializers) and loses its body, which becomes the
same throw, naming the function; the comments of the body that state its
rules stay (every full-line comment outside a solution region, the EXERCISE
comments included). A function counts as changed when its lines of code
differ; comments, blank lines, exercise markup and the stage's namespace
(stageNN) do not count. The headers, with their contracts, are copied whole,
and so is everything outside function bodies (helper types, constants).
Stage 01 has no stage before it: every function is to write. Two kinds of
function are kept whole because a throw there would end the program
(std::terminate) instead of naming the stub: destructors, and functions
declared noexcept; the report lists them.
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


# ---- the from-scratch track ------------------------------------------------

def is_comment(line):
    return line.strip().startswith("//")


def functions(lines):
    """[(name, first, open_line, last)] for every function defined at the top
    level of a .cc file: its first line starts in column 0 and opens a
    parameter list, its body opens on the first line after that to end in
    '{' and closes at the next line that is exactly '}'."""
    found = []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = FUNCTION.match(line)
        if (not m or line.startswith(("//", "#", "}", "namespace", " ", "\t"))
                or line.rstrip().endswith(";")):
            i += 1
            continue
        k = i
        while k < len(lines) and not lines[k].rstrip().endswith("{"):
            if lines[k].rstrip().endswith((";", "}")):
                break
            k += 1
        if k < len(lines) and "{" in lines[k] and lines[k].rstrip().endswith("}"):
            # A body on the signature's last line (`... {}`): nothing to
            # write, or one line; given as it is.
            i = k + 1
            continue
        if k == len(lines) or not lines[k].rstrip().endswith("{"):
            i += 1
            continue
        end = k + 1
        while end < len(lines) and lines[end] != "}":
            end += 1
        if end == len(lines):
            sys.exit(f"gen_exercise: line {i + 1}: the body of {m.group(1)} is never closed by a "
                     f"line '}}' in column 0")
        found.append((m.group(1), i, k, end))
        i = end + 1
    return found


def code_of(lines, stage):
    """What decides whether a function changed: its lines of code, with the
    stage's namespace as stageNN; comments, blank lines and exercise markup
    left out."""
    own = re.compile(r"\bstage" + stage + r"\b")
    return tuple(own.sub("stageNN", l.rstrip()) for l in lines
                 if l.strip() and not is_comment(l))


def previous_stage_dir(stage_dir):
    stage_dir = os.path.normpath(stage_dir)
    parent, topic = os.path.split(stage_dir)
    nn = int(topic.split("-", 1)[0])
    if nn == 1:
        return None
    wanted = f"{nn - 1:02d}-"
    for name in sorted(os.listdir(parent or ".")):
        if name.startswith(wanted) and os.path.isdir(os.path.join(parent, name)):
            return os.path.join(parent, name)
    sys.exit(f"gen_exercise: --from-scratch: {stage_dir} has no previous stage "
             f"({wanted}* beside it) to compare with")


def previous_functions(prev_dir):
    """The set of code_of() of every function of the previous stage's .cc files."""
    known = set()
    if prev_dir is None:
        return known
    prev_stage = os.path.basename(os.path.normpath(prev_dir)).split("-", 1)[0]
    for name in sorted(os.listdir(prev_dir)):
        if not name.endswith(".cc"):
            continue
        with open(os.path.join(prev_dir, name)) as f:
            lines = f.read().splitlines()
        for _, first, _, last in functions(lines):
            known.add(code_of(lines[first:last + 1], prev_stage))
    return known


def from_scratch(text, path, stage, shown_path, known, kept):
    """The from-scratch exercise of one .cc file; `kept` collects the
    changed functions left whole (destructors, noexcept)."""
    lines = text.splitlines()
    out = []
    stubs = 0
    done = 0
    for name, first, open_line, last in functions(lines):
        out.extend(lines[done:open_line + 1])
        done = open_line + 1
        whole = lines[first:last + 1]
        if code_of(whole, stage) in known:
            continue  # as the stage before wrote it: given
        signature = " ".join(l.strip() for l in lines[first:open_line + 1])
        if "~" in name or re.search(r"\bnoexcept\b", signature):
            kept.append(f"{shown_path}: {name}")
            continue
        in_solution = False
        for line in lines[open_line + 1:last]:
            s = line.strip()
            if s == BEGIN:
                in_solution = True
            elif s == END:
                in_solution = False
            elif is_comment(line) and not in_solution:
                out.append(line)
        out.append(f'  throw tp::NotImplemented("stage {stage}: {name} is not implemented yet ({shown_path})");')
        done = last
        stubs += 1
    out.extend(lines[done:])
    result = "\n".join(out) + "\n"
    if stubs and '#include "tensorplay/error.h"' not in result:
        # After the file's own header, where the includes start.
        at = next((i for i, l in enumerate(out) if l.startswith("#include")), None)
        if at is None:
            sys.exit(f"gen_exercise: {path}: no #include to put tensorplay/error.h beside")
        out.insert(at + 1, '#include "tensorplay/error.h"  // the stubs throw tp::NotImplemented')
        result = "\n".join(out) + "\n"
    return result, stubs


def from_scratch_files(stage_dir):
    stage_dir = os.path.normpath(stage_dir)
    topic = os.path.basename(stage_dir)
    stage = topic.split("-", 1)[0]
    prev_dir = previous_stage_dir(stage_dir)
    known = previous_functions(prev_dir)
    against = f"stage {os.path.basename(prev_dir).split('-', 1)[0]}" if prev_dir else "nothing"
    files = {}
    kept = []
    for name, path, text in stage_sources(stage_dir):
        shown = f"exercises/{topic}/{name}"
        stubs = 0
        if name.endswith(".cc"):
            # The solution regions go first (the file as the guided track
            # shows it, less its stubs), so that their markers do not count.
            text, stubs = from_scratch(text, path, stage, shown, known, kept)
        else:
            generate(text, path, stage, shown)  # the same checks of the markup
        if stubs:
            header = (f"// From-scratch exercise generated from solutions/{topic}/{name} by\n"
                      f"// tools/gen_exercise.py --from-scratch: every function stage {stage} adds or\n"
                      f"// changes over {against} is empty. Write each: the contracts are in the\n"
                      f"// headers, the rules in the comments left in the bodies. Then run\n"
                      f"// ./kit check {stage}. ./kit reset {stage} --from-scratch restores this file;\n"
                      f"// ./kit reset {stage} gives the guided exercise instead.\n"
                      f"// Until then the stubs leave parameters and helpers unused: no warnings.\n"
                      f"#pragma GCC diagnostic ignored \"-Wunused-parameter\"\n"
                      f"#pragma GCC diagnostic ignored \"-Wunused-function\"\n")
        else:
            header = (f"// Copied from solutions/{topic}/{name} by tools/gen_exercise.py --from-scratch\n"
                      f"// (nothing to write here: stage {stage} adds or changes no function of it).\n")
        # A region's markers are the guided track's: in the from-scratch track
        # they would only say where the answer was.
        body = "\n".join(l for l in text.splitlines()
                         if l.strip() not in (BEGIN, END)) + "\n"
        files[name] = header + body
    if not files:
        sys.exit(f"gen_exercise: {stage_dir} has no .h or .cc files")
    return files, kept


def stage_sources(stage_dir):
    """(name, path, text) of each .h and .cc file of a stage, by name."""
    for name in sorted(os.listdir(stage_dir)):
        if name.endswith((".h", ".cc")):
            path = os.path.join(stage_dir, name)
            with open(path) as f:
                yield name, path, f.read()


def exercise_files(stage_dir):
    stage_dir = os.path.normpath(stage_dir)
    topic = os.path.basename(stage_dir)
    stage = topic.split("-", 1)[0]
    files = {}
    for name, path, text in stage_sources(stage_dir):
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
    scratch = "--from-scratch" in argv
    if scratch:
        argv = [a for a in argv if a != "--from-scratch"]
        if "--check" in argv:
            sys.exit("gen_exercise: --check compares the guided exercise; it takes no --from-scratch")

    def generated(stage_dir):
        if not scratch:
            return exercise_files(stage_dir)
        files, kept = from_scratch_files(stage_dir)
        for where in kept:
            print(f"gen_exercise: from scratch, kept whole (a throw there would end the program): "
                  f"{where}", file=sys.stderr)
        return files

    if argv[:1] == ["--one"]:
        if len(argv) != 4:
            sys.exit(__doc__)
        name, stage_dir, out = argv[1:]
        files = generated(stage_dir)
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
    files = generated(stage_dir)
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
