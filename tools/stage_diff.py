#!/usr/bin/env python3
"""The diff of a stage over the one before: what stage NN adds to stage NN-1.

    stage_diff.py [--color=auto|always|never] ROOT NN-topic
                        print it as a unified diff, file by file (`./kit diff
                        NN` runs this); auto, the default, colours it when
                        stdout is a terminal

Each stage (ROOT/solutions/NN-topic/) is a complete DDP, so what a stage
teaches is its difference from the stage before. This module is that one
concept, for both of its readers: `./kit diff NN` prints it, and
tools/exercise_share.py counts its added lines, so that the share of a
stage's code its exercises hold is a share of exactly the lines the student
sees as added in `./kit diff NN`.

The diff covers every source file (.h and .cc) of the two stage folders,
sorted by name, each with its own `---`/`+++` header: a file both stages
have is diffed with the other stage's copy, a file new in stage NN against
/dev/null (added whole), a file stage NN no longer has to /dev/null (removed
whole); a file that normalises to the same text shows no hunk, and the
output's second line names it with the others. Stage 01 has no stage before
it: every file is added whole. Each file's hunks are GNU diff's (-U3) of the
two normalised texts, the alignment `./kit diff` always printed.

stage.h is left out, of the diff and so of the count: it is the harness's
description of the stage (tp::train::StageSpec: the title, the demo's flags,
the advice strings of the checker's diagnoses), not part of the DDP the
lesson builds. Both tracks hand it to the student whole (it has no EXERCISE
region), and its difference from the stage before is mostly reworded prose;
counted, it would lower every stage's share with lines no student writes.

Both sides are normalised as tools/carried.py compares carried code:
  - the stage's own namespace and the prefix of its messages (`stage04`,
    as a whole word, in stage 04: "stage04 DDP: rank 1: ...") read as
    `stageNN`, so that a line that only moved to the new stage's namespace
    shows no change. Prose is left as written ("stage 05 walks the graph");
  - the exercise markup is left out: the `// EXERCISE:` comment (up to
    `// BEGIN SOLUTION`), and the `// BEGIN SOLUTION` and `// END SOLUTION`
    lines; the code between them stays (it is the solution);
  - the carried-code markers (`// SAME FROM STAGE AA: name` and
    `// END SAME FROM STAGE AA: name`, tools/carried.py's OPEN and CLOSE)
    are left out, so that marking code as carried over changes nothing here.
So the line numbers of the hunks are those of the normalised text, not of
the files; the output's first line says so.
"""
import collections
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from carried import normalised_lines  # noqa: E402  (one definition of the markers)

LEFT_OUT = "stage.h"
CONTEXT = 3
NORMALISED = ("normalised: the stage's namespace reads stageNN, no EXERCISE/BEGIN/END SOLUTION "
              "or SAME FROM STAGE marker lines; line numbers are of the normalised text")
# GNU diff's default --color palette: headers bold, hunk lines cyan, removed
# red, added green.
COLORS = {"header": "\033[1m", "hunk": "\033[36m", "-": "\033[31m", "+": "\033[32m"}
RESET = "\033[0m"

# One normalised line: its text, and whether it lies in an EXERCISE region
# of the solution (what the student writes in the guided track).
Line = collections.namedtuple("Line", "text in_region")


def stage_dirs(root):
    """The stage folders of ROOT/solutions, in order: ["01-naive", ...]."""
    base = os.path.join(root, "solutions")
    return [d for d in sorted(os.listdir(base))
            if re.match(r"^\d\d-", d) and os.path.isdir(os.path.join(base, d))]


def previous_topic(root, topic):
    """The folder of stage NN-1 (as the kit and gen_exercise.py find it), or
    None for stage 01."""
    nn = int(topic[:2])
    if nn == 1:
        return None
    wanted = f"{nn - 1:02d}-"
    for d in stage_dirs(root):
        if d.startswith(wanted):
            return d
    sys.exit(f"stage_diff: solutions/{topic} has no stage before it (solutions/{wanted}*) "
             f"to diff with")


def sources(folder):
    """The files of a stage folder the diff covers: every .h and .cc but
    stage.h (the harness's, see above), sorted by name."""
    if folder is None or not os.path.isdir(folder):
        return []
    return [n for n in sorted(os.listdir(folder))
            if n.endswith((".h", ".cc")) and n != LEFT_OUT]


def normalise(text, nn):
    """[Line] of a stage NN file: its namespace as stageNN, no exercise
    markup, no carried-code markers (carried.normalised_lines: one
    definition of what is compared)."""
    return [Line(t, r) for _, t, r in normalised_lines(text.splitlines(), nn, drop_markers=True)]


class FileDiff:
    """One file of the stage diff: `old` (stage NN-1's, [] when it lacks the
    file) against `new` (stage NN's, [] when it lacks it), both normalised,
    and their unified diff."""

    def __init__(self, name, old_label, new_label, old, new, scratch):
        self.name = name
        self.old_label, self.new_label = old_label, new_label
        self.old, self.new = old, new
        self.hunks = _unified(old, new, scratch)

    @property
    def status(self):
        if self.old_label == "/dev/null":
            return "new"
        if self.new_label == "/dev/null":
            return "removed"
        return "changed" if self.hunks else "unchanged"

    def added(self):
        """Indices into `new` of the lines the diff shows with '+'."""
        return [j for kind, _, j in self.hunks if kind == "+"]

    def lines(self):
        """The diff as printed, (kind, text) pairs: kind is "header", "hunk",
        " ", "-" or "+". Nothing when the file is unchanged."""
        if self.status == "unchanged":
            return []
        return ([("header", f"--- {self.old_label}"), ("header", f"+++ {self.new_label}")]
                + [(kind, text) for kind, text, _ in self.hunks])


HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def _unified(old, new, scratch):
    """GNU diff's unified diff (3 lines of context) of two normalised texts,
    its two file lines left out, as [(kind, text, j)]: kind "hunk", " ", "-"
    or "+"; j, for a '+' line, its index into `new`, else None.

    GNU diff rather than difflib: it is what `./kit diff` printed before,
    its alignment is a minimal one, and difflib's, pairing an ambiguous line
    such as `}` another way, would move counts that exercise_share.py holds
    to a floor."""
    paths = []
    for side, lines in (("old", old), ("new", new)):
        path = os.path.join(scratch, side)
        with open(path, "w") as f:
            f.write("".join(line.text + "\n" for line in lines))
        paths.append(path)
    run = subprocess.run(["diff", "--text", f"-U{CONTEXT}", *paths],
                         capture_output=True, text=True)
    if run.returncode not in (0, 1):
        sys.exit(f"stage_diff: diff failed: {run.stderr.strip() or run.returncode}")
    out = []
    j = 0
    for line in run.stdout.splitlines()[2:]:  # past diff's own '---' and '+++' lines
        m = HUNK.match(line)
        if m:
            # +c,d: new lines c..c+d-1 (1-based); a hunk that adds nothing
            # (d = 0) has no '+' or ' ' line to number.
            j = int(m.group(1)) - 1
            out.append(("hunk", line, None))
        elif line.startswith("+"):
            out.append(("+", line, j))
            j += 1
        elif line.startswith(" "):
            out.append((" ", line, None))
            j += 1
        elif line.startswith("-"):
            out.append(("-", line, None))
        else:
            sys.exit(f"stage_diff: diff printed a line this cannot read: {line!r}")
    return out


def stage_diff(root, topic):
    """(previous topic or None, [FileDiff] for every source file of either
    stage folder, sorted by name)."""
    prev = previous_topic(root, topic)
    new_dir = os.path.join(root, "solutions", topic)
    old_dir = os.path.join(root, "solutions", prev) if prev else None
    old_names, new_names = set(sources(old_dir)), set(sources(new_dir))
    diffs = []
    with tempfile.TemporaryDirectory(prefix="stage-diff-") as scratch:
        for name in sorted(old_names | new_names):
            old = new = []
            old_label = new_label = "/dev/null"
            if name in old_names:
                old_label = f"solutions/{prev}/{name}"
                with open(os.path.join(old_dir, name)) as f:
                    old = normalise(f.read(), prev[:2])
            if name in new_names:
                new_label = f"solutions/{topic}/{name}"
                with open(os.path.join(new_dir, name)) as f:
                    new = normalise(f.read(), topic[:2])
            diffs.append(FileDiff(name, old_label, new_label, old, new, scratch))
    return prev, diffs


def render(root, topic, color=False):
    """The text `./kit diff NN` prints: two lines that say what it is, then
    each file's diff."""
    prev, diffs = stage_diff(root, topic)
    if prev is None:
        what = (f"stage {topic[:2]} is the first stage: all of solutions/{topic} is new, "
                f"every source but {LEFT_OUT}")
    else:
        what = f"solutions/{topic} over solutions/{prev}, every source but {LEFT_OUT}"
    by_status = collections.OrderedDict((s, []) for s in ("changed", "new", "removed", "unchanged"))
    for d in diffs:
        by_status[d.status].append(d.name)
    files = "; ".join(f"{s}: {', '.join(names)}" for s, names in by_status.items() if names)
    out = [f"# {NORMALISED}", f"# {what} ({files})"]
    for d in diffs:
        for kind, text in d.lines():
            if color and kind in COLORS:
                text = COLORS[kind] + text + RESET
            out.append(text)
    return "".join(line + "\n" for line in out)


def main(argv):
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    color = "auto"
    while argv and (argv[0] == "--color" or argv[0].startswith("--color=")):
        color = argv.pop(0).partition("=")[2] or "always"
    if color not in ("auto", "always", "never") or len(argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    root, topic = argv
    if not os.path.isdir(os.path.join(root, "solutions", topic)):
        sys.exit(f"stage_diff: {root} has no solutions/{topic}; pass the kit's root and a "
                 f"stage folder such as 03-overlap")
    use = color == "always" or (color == "auto" and sys.stdout.isatty())
    text = render(root, topic, use)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped (`./kit diff 08 | head`): not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
