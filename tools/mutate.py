#!/usr/bin/env python3
"""Applies a planted-bug mutant to a solution file.

    mutate.py MUTANT SOURCE OUTPUT

A mutant file (tests/mutants/NN-topic/*.mutant) reads:

    # what the bug is, in one or two comment lines
    expect: a phrase the checker's report must contain
    <<<<<<< solution
    exact lines of the solution
    =======
    the lines that replace them (may be empty)
    >>>>>>> mutant

There may be several blocks. Each solution text must occur exactly once in
SOURCE; when the solution changes so that it no longer does, this fails with
a message naming the mutant, so mutants cannot silently stop applying.
"""
import sys


def parse(path):
    blocks, mode, find, repl = [], None, [], []
    for number, line in enumerate(open(path).read().splitlines(True), 1):
        tag = line.rstrip("\n")
        if tag == "<<<<<<< solution":
            mode, find, repl = "find", [], []
        elif tag == "=======" and mode == "find":
            mode = "repl"
        elif tag == ">>>>>>> mutant" and mode == "repl":
            blocks.append(("".join(find), "".join(repl)))
            mode = None
        elif mode == "find":
            find.append(line)
        elif mode == "repl":
            repl.append(line)
    if mode is not None:
        sys.exit(f"mutate: {path}: a block is not closed with '>>>>>>> mutant'")
    if not blocks:
        sys.exit(f"mutate: {path}: no '<<<<<<< solution' block")
    return blocks


def main(mutant, source, output):
    text = open(source).read()
    for find, repl in parse(mutant):
        count = text.count(find)
        if count != 1:
            sys.exit(f"mutate: {mutant} no longer applies to {source}: its solution text occurs "
                     f"{count} times (expected once); update the mutant:\n{find}")
        text = text.replace(find, repl)
    with open(output, "w") as f:
        f.write(f"// PLANTED BUG from {mutant}: do not copy.\n" + text)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
