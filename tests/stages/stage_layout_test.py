#!/usr/bin/env python3
"""Every stage in the build's stage table has the files a stage is made of.

    stage_layout_test.py ROOT NN:TOPIC [NN:TOPIC ...]

A stage is its folders plus one row in the `stages` table of meson.build
(the arguments here); the build reads everything else from the folders.
Meson refuses to configure a row whose stage lacks a file the build reads,
naming it; this test names everything else a stage must have (ANSWERS.md,
the lesson) and checks that tests/mutants/NN-topic/mutants.txt lists
exactly the planted bugs of its folder (a .mutant file left out of the list
would never run).
"""
import os
import sys

NEEDED = [
    ("solutions/{topic}/ddp.h", "the stage's DDP: its Options and its Capabilities"),
    ("solutions/{topic}/ddp.cc", "the stage's DDP, with its EXERCISE regions"),
    ("solutions/{topic}/stage.h", "the stage's StageSpec: stage_spec() with title, advice, flags"),
    ("solutions/{topic}/ANSWERS.md", "the answers to the lesson's questions"),
    ("exercises/{topic}/ddp.cc", "the exercise, generated: python3 tools/gen_exercise.py "
                                 "solutions/{topic} exercises/{topic}"),
    ("lessons/{topic}/README.md", "the lesson"),
    ("lessons/{topic}/main.cc", "the lesson's demo: demo_main<stage{nn}::...>(argc, argv, "
                                "stage{nn}::stage_spec())"),
    ("tests/checkers/check_{nn}.cc", "the stage's checker: run_checker<...>(argc, argv, spec)"),
    ("tests/mutants/{topic}/exercise_stub.expect", "what the checker says of the untouched "
                                                   "exercise"),
    ("tests/mutants/{topic}/mutants.txt", "the list of the stage's planted bugs"),
]


def listed_mutants(path):
    names = []
    for line in open(path):
        words = line.split()
        if words and not words[0].startswith("#"):
            names.append(words[0])
    return names


def main(root, rows):
    problems = []
    for row in rows:
        nn, topic = row.split(":", 1)
        if not topic.startswith(nn + "-"):
            problems.append(f"stage {nn}: its folder '{topic}' must start with '{nn}-'")
        for pattern, what in NEEDED:
            path = pattern.format(nn=nn, topic=topic)
            if not os.path.isfile(os.path.join(root, path)):
                problems.append(f"stage {nn}: {path} is missing ({what.format(nn=nn, topic=topic)})")
        folder = os.path.join(root, "tests", "mutants", topic)
        listing = os.path.join(folder, "mutants.txt")
        if not os.path.isfile(listing):
            continue
        listed = listed_mutants(listing)
        present = sorted(f[:-len(".mutant")] for f in os.listdir(folder) if f.endswith(".mutant"))
        for name in sorted(set(present) - set(listed)):
            problems.append(f"stage {nn}: tests/mutants/{topic}/{name}.mutant is not listed in "
                            f"mutants.txt, so it never runs")
        for name in sorted(set(listed) - set(present)):
            problems.append(f"stage {nn}: mutants.txt lists {name}, but {name}.mutant is not there")
        for name in sorted({n for n in listed if listed.count(n) > 1}):
            problems.append(f"stage {nn}: mutants.txt lists {name} twice")
        if not listed:
            problems.append(f"stage {nn}: mutants.txt lists no planted bug; a checker is tested "
                            f"against the bugs it must catch")
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print(f"ok: {len(rows)} stages have every file a stage is made of")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
