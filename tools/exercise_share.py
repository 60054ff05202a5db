#!/usr/bin/env python3
"""How much of what a stage adds the student writes in its guided exercise.

    exercise_share.py ROOT            print the share per stage; exit 1 if a
                                      stage is below a third
    exercise_share.py --min F ROOT    the same with another floor (0 to 1)
    exercise_share.py --tracks ROOT   what each track asks of the student, per
                                      stage: functions and lines of code to write
                                      (the lessons' "Two tracks" numbers)

A stage's guided exercise (exercises/NN-topic/, tools/gen_exercise.py) hands
the student everything but its EXERCISE regions. If those regions hold only
the last lines of the stage's idea, the student fills in blanks and learns
little; lesson 07 was finished in a minute while the shadowing of a synced
step, the heart of Join, was provided. So, per stage, this counts:

  added      the lines of code the stage adds over the stage before it:
             exactly the lines `./kit diff NN` shows with '+', as both read
             them from tools/stage_diff.py: every source of the stage (.h
             and .cc, but not stage.h, the harness's description of the
             stage) diffed with the previous stage's file of the same name;
             a file the previous stage lacks is added whole, and stage 01 is
             added whole. The stage's namespace reads as stageNN on both
             sides (it differs by design), and the exercise markup (the
             `// EXERCISE:` comment and the BEGIN/END SOLUTION lines) and
             the carried-code markers are left out on both sides, so that
             moving a region changes no count but its own.
  written    of those, the ones inside an EXERCISE region of the stage's
             solution: what the student writes.

Only lines of code count: not blank lines and not lines that are only a
comment. Headers are mostly contracts, given whole in both tracks, and a
region's comments are not in the exercise either; counting them would
measure prose, not what the student writes. The share is written / added,
and every stage must reach the floor (a third).
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stage_diff  # noqa: E402  (the diff `./kit diff NN` prints, and what it adds)

BEGIN, END = "// BEGIN SOLUTION", "// END SOLUTION"
FLOOR = 1 / 3


def is_code(text):
    s = text.strip()
    return bool(s) and not s.startswith("//")


def share(root, topic):
    """(written, added, per-file rows) for one stage: the '+' lines of code of
    `./kit diff NN` (tools/stage_diff.py), and those of them in a region."""
    written = added = 0
    rows = []
    for d in stage_diff.stage_diff(root, topic)[1]:
        indices = [j for j in d.added() if is_code(d.new[j].text)]
        w = sum(1 for j in indices if d.new[j].in_region)
        rows.append((d.name, w, len(indices)))
        written += w
        added += len(indices)
    return written, added, rows


def tracks(root):
    """Per stage, what the guided track (its EXERCISE regions) and the
    from-scratch track (every function the stage adds or changes, emptied by
    gen_exercise.py --from-scratch) leave to write: functions and lines of
    code (neither blank nor only a comment)."""
    import gen_exercise  # noqa: E402  (the generator decides what a stub is)
    for topic in stage_diff.stage_dirs(root):
        folder = os.path.join(root, "solutions", topic)
        stage = topic[:2]
        guided = [0, 0]  # regions, lines
        scratch = [0, 0]  # functions, lines
        prev = gen_exercise.previous_stage_dir(folder)
        known = gen_exercise.previous_functions(prev)
        for name in stage_diff.sources(folder):
            if not name.endswith(".cc"):
                continue
            with open(os.path.join(folder, name)) as f:
                lines = f.read().splitlines()
            in_region = False
            for line in lines:
                s = line.strip()
                if s == BEGIN:
                    in_region = True
                    guided[0] += 1
                elif s == END:
                    in_region = False
                elif in_region and is_code(line):
                    guided[1] += 1
            for fname, first, open_line, last in gen_exercise.functions(lines):
                whole = lines[first:last + 1]
                signature = " ".join(l.strip() for l in lines[first:open_line + 1])
                if (gen_exercise.code_of(whole, stage) in known or "~" in fname
                        or re.search(r"\bnoexcept\b", signature)):
                    continue
                scratch[0] += 1
                scratch[1] += sum(1 for l in lines[open_line + 1:last]
                                  if is_code(l) and l.strip() not in (BEGIN, END))
        print(f"stage {stage}: guided: {guided[0]} regions, {guided[1]} lines of code; "
              f"from scratch: {scratch[0]} functions, {scratch[1]} lines of code")
    return 0


def main(argv):
    if argv[:1] == ["--tracks"] and len(argv) == 2:
        return tracks(argv[1])
    floor = FLOOR
    if argv[:1] == ["--min"] and len(argv) == 3:
        floor = float(argv[1])
        argv = argv[2:]
    if len(argv) != 1:
        sys.exit(__doc__.split("\n\n")[1])
    root = argv[0]
    if not os.path.isdir(os.path.join(root, "solutions")):
        sys.exit(f"exercise_share: {root} has no solutions/ folder; pass the kit's root")
    low = []
    for topic in stage_diff.stage_dirs(root):
        written, added, rows = share(root, topic)
        part = written / added if added else 1.0
        files = ", ".join(f"{n} {w}/{a}" for n, w, a in rows if a)
        mark = "ok" if part >= floor else "LOW"
        print(f"stage {topic[:2]}: {written} of the {added} lines of code it adds are in its "
              f"exercises ({part:.0%}) {mark}  [{files}]")
        if part < floor:
            low.append(topic)
    if low:
        for topic in low:
            print(f"exercise_share: FAIL: stage {topic[:2]}'s guided exercise leaves the student "
                  f"less than {floor:.0%} of what the stage adds: move more of its substance "
                  f"into EXERCISE regions of solutions/{topic}/ (the code stays as it is; only "
                  f"markers and EXERCISE comments change), then run "
                  f"tools/gen_exercise.py solutions/{topic} exercises/{topic}")
        return 1
    print(f"exercise_share: ok: every stage's exercises hold at least {floor:.0%} of the code "
          f"it adds")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
