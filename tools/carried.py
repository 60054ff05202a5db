#!/usr/bin/env python3
"""Checks that code a stage carries over from the previous stage is unchanged.

    carried.py --check ROOT     exit 1, with a diff, where copies drift
    carried.py --list ROOT      print every marked region and where it is
    carried.py --record ROOT    rewrite ROOT/tools/carried.lock from the stages

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

Markers cover what someone chose to mark; most carried code is not marked
(stage 09's ddp.cc shares hundreds of lines with stage 08's, grad_bucket.h is
copied whole), and a fix made in one copy only is the same bug there. So,
beside the regions, a rule covers every line two stages share, and a record
keeps what they shared:
  - the copied lines: for each pair of consecutive stages and each .h/.cc
    file name both have (stage.h too), the lines the two files share, after
    the normalisations above, blank lines left out. Lines that occur once in
    each file and in the same order pair first, as anchors; what lies between
    them is paired by difflib's longest common runs (see `align`);
  - tools/carried.lock, the record, written by --record and committed: for
    each pair of files ("09-zero/ddp.cc <- 08-comm-hooks/ddp.cc") and each
    text of a copied line, [copies paired in both, copies only in the older
    file, copies only in the newer]. The text is kept as written, so that a
    review reads the record's diff.
Why a record: to a diff, a line changed in one stage only is a line deleted
there and another added, just like code a stage writes for itself; and a
line can look like one in the stage before without being a copy of it
(another `}`, another `return;`). What was paired at the last --record is
what tells a copy that drifted from a line that merely looks alike.
--check fails:
  - on drift, where a text was paired fewer times than recorded and a copy
    of it now stands unpaired in one file (more copies only in the older, or
    only in the newer, than recorded): a line both stages carried changed,
    or moved, in one of them only. The message names both files, the
    unpaired copies' file:line, a diff of the two files around them, and the
    fix: port the change to the other stage (and every stage that carries
    the line), or, if it is meant, run --record and commit the lock;
  - on a stale record, where the paired counts differ from it in any other
    way (code newly copied, a change made in both copies, a file added to or
    removed from a pair of stages): it names the pair of files and the lines,
    and asks for --record, so that newly carried code is checked too.
A change to a line only one stage has changes no paired count, and passes.
"""
import bisect
import difflib
import json
import os
import re
import sys
from collections import Counter

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


def normalised_lines(lines, stage, drop_markers=False):
    """[(1-based line, text, in_region)] of `lines` as compared: stage
    `stage`'s own namespace as stageNN, no exercise markup, trailing
    whitespace dropped; in_region says the line is inside an EXERCISE
    region. drop_markers leaves out the carried-code marker lines too (the
    stage diff, tools/stage_diff.py, shows ideas, not markers)."""
    own = re.compile(r"\b(stage)" + stage + r"\b")
    out = []
    in_exercise = in_region = False
    for n, line in enumerate(lines, 1):
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
            in_region = s == BEGIN
            continue
        if drop_markers and (OPEN.match(line) or CLOSE.match(line)):
            continue
        out.append((n, own.sub(lambda m: m.group(1) + "NN", line.rstrip()), in_region))
    return out


def normalise(lines, stage):
    """[(1-based line, text)] of `lines` as compared (normalised_lines)."""
    return [(n, text) for n, text, _ in normalised_lines(lines, stage)]


def normalised(region):
    """The region as compared: its own namespace as stageNN, no exercise markup."""
    return [text + "\n" for _, text in normalise(region.lines, region.stage)]


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


# ---- every copied line: the rule and the record ------------------------------

LOCK = os.path.join("tools", "carried.lock")
RECORD_CMD = "python3 tools/carried.py --record ."
ABOUT = ("written by `python3 tools/carried.py --record .`: for each file two stages "
         "both have, each line the two copies share, as [copies paired in both "
         "stages, copies only in the older stage, copies only in the newer]")


def align(a, b):
    """The copies: pairs (i, j), in order in both, of equal lines a[i] == b[j].

    Lines that occur once in each side, in the same order in both (their
    longest increasing run), pair first, and split the rest into gaps that are
    paired the same way; a gap with no such line is left to difflib's
    SequenceMatcher (autojunk off), which pairs its longest common runs. The
    anchors keep the pairing put where a stage edits lines of its own:
    SequenceMatcher alone, over a whole file, can re-pair a line that occurs
    more than once when an edit splits one of its runs, and a copy that nobody
    touched would read as drift."""
    out = []
    todo = [(0, len(a), 0, len(b))]
    while todo:
        alo, ahi, blo, bhi = todo.pop()
        while alo < ahi and blo < bhi and a[alo] == b[blo]:
            out.append((alo, blo))
            alo, blo = alo + 1, blo + 1
        while alo < ahi and blo < bhi and a[ahi - 1] == b[bhi - 1]:
            ahi, bhi = ahi - 1, bhi - 1
            out.append((ahi, bhi))
        if alo == ahi or blo == bhi:
            continue
        in_a, in_b = Counter(a[alo:ahi]), Counter(b[blo:bhi])
        at_b = {b[j]: j for j in range(blo, bhi) if in_b[b[j]] == 1}
        unique = [(i, at_b[a[i]]) for i in range(alo, ahi) if in_a[a[i]] == 1 and a[i] in at_b]
        # The longest run of them in order in both (patience sorting).
        ends, ends_at, before = [], [], []
        for k, (_, j) in enumerate(unique):
            n = bisect.bisect_left(ends, j)
            before.append(ends_at[n - 1] if n else None)
            if n == len(ends):
                ends.append(j)
                ends_at.append(k)
            else:
                ends[n], ends_at[n] = j, k
        anchors = []
        k = ends_at[-1] if ends_at else None
        while k is not None:
            anchors.append(unique[k])
            k = before[k]
        if not anchors:
            m = difflib.SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=False)
            out += [(alo + i + n, blo + j + n) for i, j, size in m.get_matching_blocks()
                    for n in range(size)]
            continue
        i0, j0 = alo, blo
        for i, j in reversed(anchors):
            out.append((i, j))
            todo.append((i0, i, j0, j))
            i0, j0 = i + 1, j + 1
        todo.append((i0, ahi, j0, bhi))
    return sorted(out)


class Aligned(difflib.SequenceMatcher):
    """A SequenceMatcher whose matching blocks are `align`'s pairs, for its diff."""

    def __init__(self, a, b, paired):
        super().__init__(None, a, b, autojunk=False)
        blocks = []
        for i, j in paired:
            if blocks and blocks[-1][0] + blocks[-1][2] == i and blocks[-1][1] + blocks[-1][2] == j:
                blocks[-1][2] += 1
            else:
                blocks.append([i, j, 1])
        self.blocks = [difflib.Match(*m) for m in blocks] + [difflib.Match(len(a), len(b), 0)]

    def get_matching_blocks(self):
        return self.blocks


class Pair:
    """One file name in two consecutive stages, and the lines their copies share."""

    def __init__(self, root, old_stage, old_topic, new_stage, new_topic, name):
        self.key = f"{new_topic}/{name} <- {old_topic}/{name}"
        self.old_stage, self.new_stage = old_stage, new_stage
        self.old_path = f"solutions/{old_topic}/{name}"
        self.new_path = f"solutions/{new_topic}/{name}"
        self.old = self._lines(root, self.old_path, old_stage)
        self.new = self._lines(root, self.new_path, new_stage)
        a = [t for _, t in self.old]
        b = [t for _, t in self.new]
        paired = align(a, b)
        self.old_paired = {i for i, _ in paired}
        self.new_paired = {j for _, j in paired}
        self.matcher = Aligned(a, b, paired)  # for the diff

    @staticmethod
    def _lines(root, path, stage):
        with open(os.path.join(root, path), encoding="utf-8") as f:
            lines = f.read().splitlines()
        return [(n, t) for n, t in normalise(lines, stage) if t.strip()]  # blank lines ignored

    def counts(self):
        """{text: [paired, only in the older copy, only in the newer]}, every text either has."""
        out = {}
        for i, (_, t) in enumerate(self.old):
            out.setdefault(t, [0, 0, 0])[0 if i in self.old_paired else 1] += 1
        for j, (_, t) in enumerate(self.new):
            if j not in self.new_paired:
                out.setdefault(t, [0, 0, 0])[2] += 1
        return out

    def record(self):
        """What the lock keeps: the counts of every text with a paired copy."""
        return {t: c for t, c in self.counts().items() if c[0]}

    def unpaired(self, text):
        """File lines of the unpaired copies of `text`: (in the older file, in the newer)."""
        return ([n for i, (n, t) in enumerate(self.old) if t == text and i not in self.old_paired],
                [n for j, (n, t) in enumerate(self.new) if t == text and j not in self.new_paired])

    def diff(self, texts, most=3):
        """Diff hunks of the two normalised copies around the unpaired copies of `texts`."""
        hunks = []
        for group in self.matcher.get_grouped_opcodes(3):
            if not any(op != "equal" and
                       (any(self.old[i][1] in texts for i in range(i1, i2)) or
                        any(self.new[j][1] in texts for j in range(j1, j2)))
                       for op, i1, i2, j1, j2 in group):
                continue
            a0, a1, b0, b1 = group[0][1], group[-1][2], group[0][3], group[-1][4]
            span = lambda lines, lo, hi: (f"{lines[lo][0]}..{lines[hi - 1][0]}" if hi > lo
                                          else "none")
            out = [f"@@ -{span(self.old, a0, a1)} +{span(self.new, b0, b1)} @@ (file lines)\n"]
            for op, i1, i2, j1, j2 in group:
                if op == "equal":
                    out += [f" {t}\n" for _, t in self.old[i1:i2]]
                    continue
                out += [f"-{t}\n" for _, t in self.old[i1:i2]]
                out += [f"+{t}\n" for _, t in self.new[j1:j2]]
            hunks.append("".join(out))
        head = (f"--- {self.old_path} (stage {self.old_stage})\n"
                f"+++ {self.new_path} (stage {self.new_stage})\n")
        more = f"... and {len(hunks) - most} more hunk(s)\n" if len(hunks) > most else ""
        return head + "".join(hunks[:most]) + more


def pairs(root):
    """A Pair for every .h/.cc file name that two consecutive stages both have."""
    dirs = stage_dirs(root)
    stages = sorted(dirs)
    out = []
    for old, new in zip(stages, stages[1:]):
        names = lambda s: {n for n in os.listdir(os.path.join(root, "solutions", dirs[s]))
                           if n.endswith((".h", ".cc"))}
        for name in sorted(names(old) & names(new)):
            out.append(Pair(root, old, dirs[old], new, dirs[new], name))
    return out


def read_lock(root):
    path = os.path.join(root, LOCK)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        lock = json.load(f)
    lock.pop("# about", None)
    return lock


def write_lock(root, found):
    """The lock, one line per text, so that a review's diff reads line by line."""
    out = ["{", f'  "# about": {json.dumps(ABOUT)},']
    keys = sorted(found)
    for k, key in enumerate(keys):
        out.append(f"  {json.dumps(key)}: {{")
        texts = sorted(found[key])
        for t, text in enumerate(texts):
            comma = "," if t + 1 < len(texts) else ""
            counts = json.dumps(found[key][text])
            out.append(f"    {json.dumps(text, ensure_ascii=False)}: {counts}{comma}")
        out.append("  }" + ("," if k + 1 < len(keys) else ""))
    out.append("}")
    with open(os.path.join(root, LOCK), "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


def check_copies(root, all_pairs):
    """Drift (a line both stages carried, now changed in one only) and a stale record."""
    lock = read_lock(root)
    if lock is None:
        return [f"no record of the copied lines ({LOCK}); run `{RECORD_CMD}` and commit "
                f"{LOCK}"]
    problems = []
    stale = []
    for pair in all_pairs:
        if pair.key not in lock:
            stale.append(f"{pair.key}: the stages share this file, but the record has no entry "
                         f"for it (a new stage, or a file now in both)")
            continue
        recorded, now = lock[pair.key], pair.counts()
        drifted, changed = [], []
        for text in sorted(set(recorded) | {t for t, c in now.items() if c[0]}):
            rec, cur = recorded.get(text), now.get(text, [0, 0, 0])
            if rec is None:
                changed.append(f"{text.strip()!r} paired {cur[0]} time(s), not in the record")
            elif cur[0] < rec[0] and (cur[1] > rec[1] or cur[2] > rec[2]):
                drifted.append(text)
            elif cur[0] != rec[0]:
                changed.append(f"{text.strip()!r} paired {rec[0]} time(s) in the record, "
                               f"{cur[0]} now")
        if drifted:
            where = []
            for text in drifted:
                old_lines, new_lines = pair.unpaired(text)
                at = lambda path, ns, stage: (", ".join(f"{path}:{n}" for n in ns[:4]) +
                                              (f" and {len(ns) - 4} more" if len(ns) > 4 else "")
                                              if ns else
                                              f"no unpaired copy in {path} (changed or removed "
                                              f"in stage {stage})")
                where.append(f"  {text.strip()!r}: {at(pair.old_path, old_lines, pair.old_stage)}; "
                             f"{at(pair.new_path, new_lines, pair.new_stage)}\n")
            problems.append(
                f"{pair.new_path}: drift from stage {pair.old_stage}'s copy, {pair.old_path}: "
                f"line(s) the two stages carried alike at the last record are now in one copy "
                f"only, changed (or moved) in the other:\n{''.join(where)}"
                f"{pair.diff(set(drifted))}"
                f"fix: port the change to the other stage (and to every stage that carries the "
                f"line; then regenerate their exercises with tools/gen_exercise.py), or, if the "
                f"change is deliberate, run `{RECORD_CMD}` and commit {LOCK}")
        elif changed:
            shown = "; ".join(changed[:3]) + (f"; and {len(changed) - 3} more" if len(changed) > 3
                                               else "")
            stale.append(f"{pair.key}: {shown}")
    keys = {p.key for p in all_pairs}
    stale += [f"{key}: in the record, but the stages no longer both have this file"
              for key in sorted(lock) if key not in keys]
    if stale:
        listed = "".join(f"\n  {s}" for s in stale)
        problems.append(
            f"{LOCK} is stale: the lines these stages share differ from the record, with no "
            f"copy left unpaired (code newly copied, a change made in every copy, a file added "
            f"or removed):{listed}\n"
            f"fix: if that is what you meant, run `{RECORD_CMD}` and commit {LOCK}, so that "
            f"the newly carried lines are checked too")
    return problems


def main(argv):
    if len(argv) != 3 or argv[1] not in ("--check", "--list", "--record"):
        sys.exit(__doc__.split("\n\n")[1])
    root = argv[2]
    if not os.path.isdir(os.path.join(root, "solutions")):
        sys.exit(f"carried: {root} has no solutions/ folder; pass the kit's root")
    all_pairs = pairs(root)
    if argv[1] == "--record":
        before = read_lock(root) or {}
        found = {p.key: p.record() for p in all_pairs}
        write_lock(root, found)
        changed = sorted(k for k in set(found) | set(before) if found.get(k) != before.get(k))
        lines = sum(sum(c[0] for c in r.values()) for r in found.values())
        print(f"carried: recorded {lines} copied lines in {len(found)} files of consecutive "
              f"stages to {LOCK}; " + (f"changed: {', '.join(changed)}" if 0 < len(changed) <= 5
                                       else f"{len(changed)} files changed" if changed
                                       else "nothing changed"))
        return 0
    problems, found = check(root)
    if argv[1] == "--list":
        for (file_name, name), copies in sorted(found.items()):
            where = ", ".join(r.where() for _, r in sorted(copies.items()))
            print(f"{file_name}: {name}: {where}")
    else:
        problems += check_copies(root, all_pairs)
    if problems:
        for p in problems:
            print(f"carried: {p}")
        print(f"carried: FAIL: {len(problems)} problem(s) with code carried over from the stage "
              f"before")
        return 1
    if argv[1] == "--list":
        return 0
    per_stage = {}
    for copies in found.values():
        for stage in copies:
            per_stage[stage] = per_stage.get(stage, 0) + 1
    counts = ", ".join(f"{s}: {n}" for s, n in sorted(per_stage.items()))
    lines = sum(sum(c[0] for c in p.record().values()) for p in all_pairs)
    print(f"carried: ok: {len(found)} regions carried over unchanged (regions per stage: "
          f"{counts or 'none'}); {lines} copied lines in {len(all_pairs)} files of consecutive "
          f"stages as recorded in {LOCK}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
