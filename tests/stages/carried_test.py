#!/usr/bin/env python3
"""tools/carried.py catches code that drifted between the stages carrying it.

On a scratch copy of solutions/ and tools/ (the record, tools/carried.lock,
is read from the root checked): the kit as committed passes, and so does the
kit with a new stage that copies the last one (markers and all) once the
record is rewritten, the check before that naming the new stage's files as
missing from the record; then, one at a time, a fix made in one stage only (a
changed line in the last stage's copy of a region), a region missing from a
stage between two that have it, a region never closed, and a misspelt marker
must each fail, naming both copies' file:line and showing the changed line
as a diff.

Then the rule for every copied line, marked or not, with the lines picked
from the stages as they are: a copied line outside the markers of the last
stage's ddp.cc changed there only, the same in a copied file with no markers
at all, and a copied line deleted from one copy only must each fail as drift,
naming the other copy's file:line; the same change made in every stage that
has the line is no drift but leaves the record stale, and passes once the
record is rewritten; a change to a line only the last stage has passes.

Usage: carried_test.py REPO_ROOT
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile


def run(tool, root):
    return subprocess.run([sys.executable, tool, "--check", root], capture_output=True,
                          text=True, timeout=60)


def record(tool, root):
    return subprocess.run([sys.executable, tool, "--record", root], capture_output=True,
                          text=True, timeout=60)


def fail(message, result):
    sys.exit(f"FAIL: {message}: exit {result.returncode}\n{result.stdout}{result.stderr}")


def edit(path, old, new):
    with open(path) as f:
        text = f.read()
    if old not in text:
        sys.exit(f"FAIL: the test's anchor {old!r} is not in {path}; update carried_test.py")
    with open(path, "w") as f:
        f.write(text.replace(old, new, 1))


def main():
    repo = os.path.abspath(sys.argv[1])
    tool = os.path.join(repo, "tools", "carried.py")
    with tempfile.TemporaryDirectory(prefix="tp-carried-") as tmp:
        pristine = os.path.join(tmp, "pristine")
        shutil.copytree(os.path.join(repo, "solutions"), os.path.join(pristine, "solutions"))
        shutil.copytree(os.path.join(repo, "tools"), os.path.join(pristine, "tools"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        clean = run(tool, pristine)
        if clean.returncode != 0 or "carried: ok:" not in clean.stdout or \
                "copied lines" not in clean.stdout:
            fail("the kit as committed (if only the record is stale, run "
                 "`python3 tools/carried.py --record .` and commit tools/carried.lock)", clean)
        # The stages and the region the drift is planted in: the first region
        # of a stage's ddp.cc that the stage before also carries, in the last
        # stage that has one (stage 10, FSDP, carries no DDP code over).
        stages = sorted(d for d in os.listdir(os.path.join(pristine, "solutions"))
                        if re.match(r"^\d\d-", d))
        newest = stages[-1]

        def carried_region(stage, previous):
            path = os.path.join(pristine, "solutions", stage, "ddp.cc")
            if not os.path.isfile(path):
                return None, None
            with open(path) as f:
                text = f.read().splitlines()
            return text, next((i for i, l in enumerate(text)
                               if (m := re.match(r"^\s*// SAME FROM STAGE (\d\d): ", l))
                               and m.group(1) <= previous[:2]), None)

        for k in range(len(stages) - 1, 0, -1):
            last, before = stages[k], stages[k - 1]
            lines, opening = carried_region(last, before)
            if opening is not None:
                break
        else:
            sys.exit("FAIL: no stage's ddp.cc carries a region over from the stage before")
        last_cc = os.path.join("solutions", last, "ddp.cc")
        body = next(i for i in range(opening + 1, len(lines)) if lines[i].strip()
                    and not lines[i].strip().startswith("//"))

        def planted(name, change):
            root = os.path.join(tmp, name)
            shutil.copytree(pristine, root)
            change(root)
            return run(tool, root)

        # A new stage, a copy of the newest one: nothing else to change.
        nn = f"{int(newest[:2]) + 1:02d}"
        first_cc = sorted(n for n in os.listdir(os.path.join(pristine, "solutions", newest))
                          if n.endswith(".cc"))[0]

        def new_stage(root):
            new = os.path.join(root, "solutions", f"{nn}-copy")
            shutil.copytree(os.path.join(root, "solutions", newest), new)
            for name in os.listdir(new):
                path = os.path.join(new, name)
                with open(path) as f:
                    text = f.read()
                with open(path, "w") as f:
                    f.write(text.replace(f"stage{newest[:2]}", f"stage{nn}"))
        result = planted("new_stage", new_stage)
        if result.returncode != 1 or \
                f"{nn}-copy/{first_cc} <- {newest}/{first_cc}" not in result.stdout or \
                "is stale" not in result.stdout or "drift" in result.stdout:
            fail("a new stage copied from the newest one, before --record", result)
        recorded = record(tool, os.path.join(tmp, "new_stage"))
        result = run(tool, os.path.join(tmp, "new_stage"))
        if recorded.returncode != 0 or result.returncode != 0:
            fail("a new stage copied from the newest one, after --record", result)

        # A fix made in the last stage only.
        def drift(root):
            edit(os.path.join(root, last_cc), lines[body] + "\n",
                 lines[body] + "  // fixed here only\n")
        result = planted("drift", drift)
        if result.returncode != 1 or f"{last_cc}:{opening + 1}" not in result.stdout or \
                f"solutions/{before}/ddp.cc:" not in result.stdout or \
                not any(l.startswith("+") and l.endswith("// fixed here only")
                        for l in result.stdout.splitlines()) or \
                "fix: make the change in every copy" not in result.stdout:
            fail("a line changed in the last stage's copy only", result)

        # The region deleted from the stage before (its markers gone).
        marker = lines[opening].strip()
        def missing(root):
            path = os.path.join(root, "solutions", before, "ddp.cc")
            edit(path, marker + "\n", "\n")
            edit(path, marker.replace("// SAME", "// END SAME", 1) + "\n", "\n")
        result = planted("missing", missing)
        if result.returncode != 1 or f"stage(s) {before[:2]} have no region" not in result.stdout:
            fail("a region missing from a stage between two that have it", result)

        def unclosed(root):
            edit(os.path.join(root, last_cc), marker.replace("// SAME", "// END SAME", 1) + "\n", "\n")
        result = planted("unclosed", unclosed)
        if result.returncode != 1 or "is never closed" not in result.stdout:
            fail("a region never closed", result)

        def misspelt(root):
            edit(os.path.join(root, last_cc), marker, marker.replace("FROM STAGE", "FROM STAGES", 1))
        result = planted("misspelt", misspelt)
        if result.returncode != 1 or "is not a marker" not in result.stdout:
            fail("a misspelt marker", result)
        copied_lines(tool, tmp, pristine, planted, last, before)
    print("ok: the committed stages pass, and a new stage copied from the last once recorded; a "
          "one-stage fix, a missing copy, an unclosed region and a misspelt marker each fail, "
          "naming both copies; a copied line changed outside markers, in an unmarked file, or "
          "deleted, in one stage only, fails as drift; the same change in every copy fails as "
          "stale until recorded; a change to a line only one stage has passes")


def copied_lines(tool, tmp, pristine, planted, last, before):
    """The rule for every copied line, on lines picked from the stages as they are."""
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    sys.path.insert(0, os.path.dirname(tool))
    import carried
    pairs = {p.key: p for p in carried.pairs(pristine)}

    def pair_of(name, new_topic, old_topic):
        return pairs[f"{new_topic}/{name} <- {old_topic}/{name}"]

    def marked(path, stage):
        """File lines inside the marked regions of `path` (markers included)."""
        with open(os.path.join(pristine, path)) as f:
            regions = carried.parse(f.read(), stage, path, [])
        return {r.start + k for r in regions for k in range(len(r.lines))}

    def code(text):
        return re.search(r"[A-Za-z_]{3}", text) and not text.strip().startswith("//")

    def copied(pair, avoid=()):
        """A copied line of code: paired, once in each copy, words in it, not a comment, not
        marked.
        Returns (text, its line in the older file, its line in the newer)."""
        old_texts = [t for _, t in pair.old]
        new_texts = [t for _, t in pair.new]
        for j, (n, t) in enumerate(pair.new):
            if j in pair.new_paired and n not in avoid and code(t) \
                    and old_texts.count(t) == 1 and new_texts.count(t) == 1:
                return t, next(m for m, u in pair.old if u == t), n
        return None

    def change_line(root, path, number, suffix):
        """Append `suffix` to line `number` of `path`, or delete the line if suffix is None."""
        full = os.path.join(root, path)
        with open(full) as f:
            lines = f.read().split("\n")
        if suffix is None:
            del lines[number - 1]
        else:
            lines[number - 1] += suffix
        with open(full, "w") as f:
            f.write("\n".join(lines))

    def drifted(what, result, pair, old_line, suffix):
        if result.returncode != 1 or f"{pair.new_path}: drift from stage" not in result.stdout or \
                f"{pair.old_path}:{old_line}" not in result.stdout or \
                (suffix and not any(l.startswith("+") and l.endswith(suffix)
                                    for l in result.stdout.splitlines())) or \
                "tools/carried.py --record ." not in result.stdout or \
                "is stale" in result.stdout:
            fail(what, result)

    # (b) A copied line outside the markers of the last stage's ddp.cc, changed there only.
    cc = pair_of("ddp.cc", last, before)
    picked = copied(cc, marked(cc.new_path, last[:2]))
    if picked is None:
        sys.exit(f"FAIL: {cc.new_path} shares no unmarked line with {cc.old_path}; pick another")
    text, old_line, new_line = picked
    suffix = "  // fixed here only"
    result = planted("unmarked_drift",
                     lambda root: change_line(root, cc.new_path, new_line, suffix))
    drifted(f"a copied line outside markers ({cc.new_path}:{new_line}) changed there only",
            result, cc, old_line, suffix)

    # (c) The same in a copied file with no markers at all: the last stage's,
    # other than ddp.h/ddp.cc, if it has one; else the latest pair that has one.
    def unmarked_file():
        def order(p):
            return (p.new_stage != last[:2], os.path.basename(p.new_path) in ("ddp.h", "ddp.cc"),
                    -int(p.new_stage), p.key)
        for pair in sorted(pairs.values(), key=order):
            if marked(pair.new_path, pair.new_stage) or marked(pair.old_path, pair.old_stage):
                continue
            found = copied(pair)
            if found:
                return pair, found
        return None, None
    pair, found = unmarked_file()
    if pair is None:
        sys.exit("FAIL: no two stages share an unmarked file with a copied line to change")
    _, whole_old, whole_new = found
    result = planted("unmarked_file_drift",
                     lambda root: change_line(root, pair.new_path, whole_new, suffix))
    print(f"planted: {cc.new_path}:{new_line} ({before[:2]}'s line {old_line}), "
          f"{pair.new_path}:{whole_new} ({pair.old_stage}'s line {whole_old})")
    drifted(f"a copied line of an unmarked file ({pair.new_path}:{whole_new}) changed there only",
            result, pair, whole_old, suffix)

    # (f) A copied line deleted from one copy only.
    result = planted("deleted", lambda root: change_line(root, cc.new_path, new_line, None))
    drifted(f"a copied line ({cc.new_path}:{new_line}) deleted there only", result, cc, old_line,
            None)
    if f"no unpaired copy in {cc.new_path}" not in result.stdout:
        fail("a deleted copy, named as missing from the stage that lost it", result)

    # (d) The same change made in every stage that has the line: no drift, a stale record.
    def everywhere(root):
        for stage, topic in carried.stage_dirs(root).items():
            path = os.path.join("solutions", topic, "ddp.cc")
            if not os.path.exists(os.path.join(root, path)):
                continue
            with open(os.path.join(root, path)) as f:
                lines = f.read().splitlines()
            for n, t in carried.normalise(lines, stage):
                if t == text:
                    change_line(root, path, n, suffix)
    result = planted("everywhere", everywhere)
    if result.returncode != 1 or "is stale" not in result.stdout or "drift" in result.stdout or \
            cc.key not in result.stdout or suffix.strip() not in result.stdout:
        fail("a copied line changed alike in every stage that has it, before --record", result)
    recorded = record(tool, os.path.join(tmp, "everywhere"))
    result = run(tool, os.path.join(tmp, "everywhere"))
    if recorded.returncode != 0 or result.returncode != 0:
        fail("a copied line changed alike in every stage that has it, after --record", result)

    # (e) A change to a line only the last stage has: nothing to record.
    old_texts = {t for _, t in cc.old}
    own = next((n for j, (n, t) in enumerate(cc.new)
                if j not in cc.new_paired and t not in old_texts
                and code(t)), None)
    if own is None:
        sys.exit(f"FAIL: {cc.new_path} has no line of its own to change")
    result = planted("own_line", lambda root: change_line(root, cc.new_path, own,
                                                          "  // changed in this stage"))
    if result.returncode != 0:
        fail(f"a change to a line only {last} has ({cc.new_path}:{own})", result)


if __name__ == "__main__":
    main()
