#!/usr/bin/env python3
"""./kit diff NN shows stage NN's solution only once exercises/NN-*/ is done.

While the exercise still has a stub that throws tp::NotImplemented, the diff
(stage NN's solution, the answer to it) is not printed: the kit says which
stubs are left and how to see it anyway (--anyway), and exits 1. With
--anyway, or once no stub is left, it prints the diff. Runs a copy of the kit
in a scratch folder (solutions/ and tools/ linked, exercises/ copied), so
that filling in the exercise never touches a student's work.

Then, for every stage, that the diff is the whole stage (tools/stage_diff.py):
a `---`/`+++` header for each source file of either stage folder (every .h
and .cc but stage.h, the harness's description of the stage), a file new
in the stage against /dev/null, one it no longer has to /dev/null, and one
unchanged named on the diff's second line; in the order of their names;
with no raw `stageNN` of either stage (both read stageNN) and no line of
exercise markup or carried-code marker. The file list comes from the
folders, so a file a stage gains is covered without a change here.

Usage: kit_diff_test.py PATH_TO_KIT
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

STAGE, TOPIC = "03", "03-overlap"
HEADER = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
# Lines the diff leaves out: gen_exercise.py's markup, tools/carried.py's markers.
MARKUP = re.compile(r"^\s*// (EXERCISE:|BEGIN SOLUTION\s*$|END SOLUTION\s*$|"
                    r"SAME FROM STAGE \d\d:|END SAME FROM STAGE \d\d:)")


def parse_diff(text):
    """A unified diff, file by file, read by the hunks' own line counts (so
    an added line that starts '++' is not taken for a header): (the lines
    before the first file, [(old label, new label, [(kind, content)])]), kind
    '+', '-' or ' '. Exits with the line it cannot read."""
    lines = text.splitlines()
    i = 0
    while i < len(lines) and not lines[i].startswith("--- "):
        i += 1
    preamble, files = lines[:i], []
    while i < len(lines):
        if not (lines[i].startswith("--- ") and i + 1 < len(lines)
                and lines[i + 1].startswith("+++ ")):
            sys.exit(f"FAIL: diff line {i + 1} is not a file header: {lines[i]!r}")
        body = []
        files.append((lines[i][4:], lines[i + 1][4:], body))
        i += 2
        while i < len(lines) and lines[i].startswith("@@"):
            m = HEADER.match(lines[i])
            if not m:
                sys.exit(f"FAIL: diff line {i + 1} is not a hunk header: {lines[i]!r}")
            old_left = int(m.group(1) or 1)
            new_left = int(m.group(2) or 1)
            i += 1
            while old_left or new_left:
                if i == len(lines) or lines[i][:1] not in "+- " or not lines[i]:
                    sys.exit(f"FAIL: the hunk before diff line {i + 1} ends early")
                kind = lines[i][0]
                old_left -= kind in "- "
                new_left -= kind in "+ "
                if old_left < 0 or new_left < 0:
                    sys.exit(f"FAIL: diff line {i + 1} overruns its hunk: {lines[i]!r}")
                body.append((kind, lines[i][1:]))
                i += 1
    return preamble, files


def sources(root, topic):
    """Stage `topic`'s files the diff covers, from its folder: .h and .cc, but
    not stage.h."""
    if topic is None:
        return set()
    folder = os.path.join(root, "solutions", topic)
    return {n for n in os.listdir(folder) if n.endswith((".h", ".cc")) and n != "stage.h"}


def check_whole_stage(scratch, root, topic, prev):
    """./kit diff NN --anyway for one stage: every file, normalised."""
    nn = topic[:2]
    r = kit(scratch, nn, "--anyway")
    if r.returncode != 0:
        fail(f"./kit diff {nn} --anyway failed", r)
    if "\033[" in r.stdout:
        fail(f"./kit diff {nn} coloured its output to a pipe", r)
    preamble, files = parse_diff(r.stdout)
    if not preamble or "line numbers are of the normalised text" not in preamble[0]:
        fail(f"./kit diff {nn}: the first line does not say the line numbers are of the "
             f"normalised text", r)
    old, new = sources(root, prev), sources(root, topic)
    expected = []
    for name in sorted(old | new):
        old_label = f"solutions/{prev}/{name}" if name in old else "/dev/null"
        new_label = f"solutions/{topic}/{name}" if name in new else "/dev/null"
        expected.append((name, old_label, new_label))
    shown = [(o, n) for o, n, _ in files]
    at = 0
    for name, old_label, new_label in expected:
        if (old_label, new_label) in shown:
            if shown.index((old_label, new_label)) < at:
                fail(f"./kit diff {nn}: {name} is not in the order of the file names", r)
            at = shown.index((old_label, new_label))
            continue
        if name in old and name in new and re.search(
                rf"unchanged: [^;)]*\b{re.escape(name)}\b", "\n".join(preamble)):
            continue  # the same after normalisation: named, no hunk
        fail(f"./kit diff {nn}: no header '--- {old_label}' / '+++ {new_label}' for {name}, "
             f"nor {name} named as unchanged on its second line", r)
    extra = [s for s in shown if s not in [(o, n) for _, o, n in expected]]
    if extra:
        fail(f"./kit diff {nn}: headers for files not in the stage folders: {extra}", r)
    raw = re.compile(rf"\bstage({nn}|{prev[:2] if prev else nn})\b")
    for old_label, new_label, body in files:
        for kind, content in body:
            if raw.search(content):
                fail(f"./kit diff {nn}: {new_label} shows a raw namespace (stageNN "
                     f"expected): {kind}{content}", r)
            if MARKUP.match(content):
                fail(f"./kit diff {nn}: {new_label} shows a marker line the diff leaves "
                     f"out: {kind}{content}", r)
    return len(files)


def kit(scratch, *args):
    return subprocess.run([os.path.join(scratch, "kit"), "diff", *args],
                          capture_output=True, text=True, timeout=60)


def fail(what, r):
    sys.exit(f"FAIL: {what}\nexit {r.returncode}\nstdout:\n{r.stdout[:2000]}\n"
             f"stderr:\n{r.stderr}")


def main():
    real_kit = os.path.abspath(sys.argv[1])
    root = os.path.dirname(real_kit)
    with tempfile.TemporaryDirectory(prefix="tp-kit-diff-") as scratch:
        shutil.copy2(real_kit, os.path.join(scratch, "kit"))
        for name in ("solutions", "tools"):
            os.symlink(os.path.join(root, name), os.path.join(scratch, name))
        exercises = os.path.join(scratch, "exercises")
        os.mkdir(exercises)
        exercise = os.path.join(exercises, TOPIC)
        # The untouched exercise, as ./kit reset writes it.
        subprocess.run([sys.executable, os.path.join(root, "tools", "gen_exercise.py"),
                        os.path.join(root, "solutions", TOPIC), exercise], check=True,
                       capture_output=True)

        r = kit(scratch, STAGE)
        if r.returncode != 1:
            fail("the untouched exercise did not stop the diff with exit 1", r)
        if r.stdout.strip():
            fail("the untouched exercise still printed the solution", r)
        for phrase in (f"exercises/{TOPIC} is not finished", "tp::NotImplemented",
                       f"exercises/{TOPIC}/ddp.cc:", f"./kit diff {STAGE} --anyway"):
            if phrase not in r.stderr:
                fail(f"the warning does not say '{phrase}'", r)

        r = kit(scratch, STAGE, "--anyway")
        if r.returncode != 0 or f"+++ solutions/{TOPIC}" not in r.stdout:
            fail("--anyway did not print the diff", r)

        # One stub filled in, the others left: still unfinished, naming those.
        with open(os.path.join(exercise, "ddp.cc")) as f:
            text = f.read()
        stubs = text.count("throw tp::NotImplemented(")
        first = text.index("throw tp::NotImplemented(")
        text = text[:first] + "return;  // (filled in)\n  //" + text[first:]
        with open(os.path.join(exercise, "ddp.cc"), "w") as f:
            f.write(text)
        r = kit(scratch, STAGE)
        if r.returncode != 1 or f"{stubs - 1} EXERCISE stub(s)" not in r.stderr:
            fail(f"with {stubs - 1} of {stubs} stubs left the diff was not stopped, naming "
                 f"them", r)

        # Finished: the solution's own files in the exercise's place.
        for name in os.listdir(os.path.join(root, "solutions", TOPIC)):
            shutil.copy(os.path.join(root, "solutions", TOPIC, name), exercise)
        r = kit(scratch, STAGE)
        if r.returncode != 0 or f"+++ solutions/{TOPIC}" not in r.stdout or r.stderr.strip():
            fail("the finished exercise did not get the diff, without a warning", r)

        # The whole stage, every stage: each file of both folders has its header.
        topics = sorted(d for d in os.listdir(os.path.join(root, "solutions"))
                        if re.match(r"^\d\d-", d))
        headers = {}
        for prev, topic in zip([None] + topics, topics):
            headers[topic[:2]] = check_whole_stage(scratch, root, topic, prev)
        # Not vacuous: the solutions do hold each kind of line the diff leaves out.
        kinds = set()
        for topic in topics:
            for name in sources(root, topic):
                with open(os.path.join(root, "solutions", topic, name)) as f:
                    kinds.update(m.group(1).split()[0] for m in map(MARKUP.match, f)
                                 if m)
        if not {"EXERCISE:", "BEGIN", "END", "SAME"} <= kinds:
            sys.exit(f"FAIL: the solutions hold only these kinds of marker line: "
                     f"{sorted(kinds)}; the check that ./kit diff leaves them out checks "
                     f"nothing")
    print(f"ok: ./kit diff {STAGE}: stopped with the stubs named while the exercise has them, "
          f"shown with --anyway and once it is finished; every stage's diff has a header for "
          f"each of its files (files shown per stage: "
          f"{', '.join(f'{k}: {v}' for k, v in sorted(headers.items()))}), no raw stageNN, "
          f"no markup")


if __name__ == "__main__":
    main()
