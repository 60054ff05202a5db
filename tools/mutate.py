#!/usr/bin/env python3
"""Applies a planted-bug mutant to a stage's solution.

    mutate.py MUTANT SOLUTION_DIR OUT_CC OUT_H OUT_STAGE_H [NAME=OUT ...]

A mutant file (tests/mutants/NN-topic/*.mutant) reads:

    # what the bug is, in one or two comment lines
    expect: a phrase the checker's report must contain
    expect-first: a phrase the failing case's first finding must contain
    <<<<<<< solution
    exact lines of the solution's ddp.cc
    =======
    the lines that replace them (may be empty)
    >>>>>>> mutant

There may be several `expect:` and `expect-first:` lines (at least one of
either; the checker reads them, see checker.h), and several blocks.
`<<<<<<< solution ddp.h` patches the header instead, so a mutant may patch
both files. A stage with more sources than ddp.cc (the root meson.build's
`stage_sources`: stage 01's worker.cc, stage 08's default_hooks.cc and
powersgd_hook.cc) gives each as NAME=OUT, every one of them (mutate.py
checks that against SOLUTION_DIR's .cc files); `<<<<<<< solution NAME`
patches that source, written to its OUT (unpatched, a copy). Each solution
text must occur exactly once in its file; when the solution changes so that
it no longer does, this fails with a message naming the mutant, so mutants
cannot silently stop applying.

OUT_CC and OUT_H receive the patched ddp.cc and ddp.h (unpatched files are
copied), OUT_STAGE_H a copy of stage.h (the stage's StageSpec, which the
checker includes). When the header is patched, the .cc and the stage.h copy
include OUT_H's name instead of "ddp.h", so that the planted-bug header is
the only ddp.h in the checker's program; a stage with other sources (which
include ddp.h too) takes no header mutant.
"""
import os
import sys

OPENING = "<<<<<<< solution"


def parse(path, targets):
    blocks, mode, target, find, repl = [], None, None, [], []
    for line in open(path).read().splitlines(True):
        tag = line.rstrip("\n")
        if tag.startswith("<<<<<<<"):
            # Exactly these spellings: Meson looks for them to decide which
            # sources of the mutant it must compile.
            name = "ddp.cc" if tag == OPENING else tag[len(OPENING) + 1:]
            if not tag.startswith(OPENING) or name not in targets or tag == OPENING + " ddp.cc":
                spellings = ", ".join(f"'{OPENING} {t}'" for t in targets if t != "ddp.cc")
                sys.exit(f"mutate: {path}: '{tag}': a block opens with '{OPENING}' (ddp.cc) "
                         f"or one of {spellings}")
            target = name
            mode, find, repl = "find", [], []
        elif tag == "=======" and mode == "find":
            mode = "repl"
        elif tag == ">>>>>>> mutant" and mode == "repl":
            blocks.append((target, "".join(find), "".join(repl)))
            mode = None
        elif mode == "find":
            find.append(line)
        elif mode == "repl":
            repl.append(line)
    if mode is not None:
        sys.exit(f"mutate: {path}: a block is not closed with '>>>>>>> mutant'")
    if not blocks:
        sys.exit(f"mutate: {path}: no '{OPENING}' block")
    return blocks


def main(mutant, solution_dir, out_cc, out_h, out_stage_h, *others):
    outs = {"ddp.cc": out_cc, "ddp.h": out_h, "stage.h": out_stage_h}
    for other in others:
        name, sep, out = other.partition("=")
        if not sep or not name.endswith(".cc") or name in outs:
            sys.exit(f"mutate: '{other}': the stage's other sources are given as NAME=OUT, "
                     f"NAME a .cc file other than ddp.cc")
        outs[name] = out
    sources = {f for f in os.listdir(solution_dir) if f.endswith(".cc")} - {"ddp.cc"}
    given = set(outs) - {"ddp.cc", "ddp.h", "stage.h"}
    if sources != given:
        sys.exit(f"mutate: {solution_dir} has the other sources {sorted(sources) or 'none'}; "
                 f"give each as NAME=OUT, and only those (got {sorted(given) or 'none'})")
    texts = {name: open(os.path.join(solution_dir, name)).read() for name in outs}
    patched = set()
    for target, find, repl in parse(mutant, [n for n in outs if n != "stage.h"]):
        count = texts[target].count(find)
        if count != 1:
            sys.exit(f"mutate: {mutant} no longer applies to {solution_dir}/{target}: its solution "
                     f"text occurs {count} times (expected once); update the mutant:\n{find}")
        texts[target] = texts[target].replace(find, repl)
        patched.add(target)
    if "ddp.h" in patched and given:
        # The other sources include the solution's ddp.h (directly or through
        # their own headers), and the checker links them: a patched header
        # would meet the original in one program.
        sys.exit(f"mutate: {mutant} patches ddp.h of a stage with {', '.join(sorted(given))}; "
                 f"plant the bug in a .cc file instead")
    if "ddp.h" in patched:
        include = '#include "ddp.h"'
        for name in ("ddp.cc", "stage.h"):
            if texts[name].count(include) != 1:
                sys.exit(f"mutate: {solution_dir}/{name} must include \"ddp.h\" once for a "
                         f"header mutant")
            texts[name] = texts[name].replace(include, f'#include "{os.path.basename(out_h)}"')
    banner = f"// PLANTED BUG from {mutant}: do not copy.\n"
    for name, out in outs.items():
        with open(out, "w") as f:
            f.write(banner + texts[name])


if __name__ == "__main__":
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    main(*sys.argv[1:])
